"""Index-driven ops: Gather, GatherElements, TopK, NonZero, Compress and ReverseSequence.

Compress: the slices of x along ``axis`` (of the flattened x when None) where the 1-D
condition is true (a condition shorter than the axis counts as false past its end).
ReverseSequence: y[b, :len[b]] = x[b, len[b]-1::-1] along ``time_axis`` for each index b of
``batch_axis``; the rest of each sequence is copied.

Indices may be negative (counted from the back of the axis); out-of-range
indices make the reference raise ``IndexError``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.inputs import arg, first, int_const
from compiler.ops.registry import InferContext, OpDef, QuantPolicy, register
from compiler.ops.shapes import UNKNOWN, normalize_axis

__all__ = ["GatherAttrs", "TopKAttrs", "CompressAttrs", "ReverseSequenceAttrs", "topk"]

_INDEX_DTYPES = (DType.INT32, DType.INT64)


@dataclass(frozen=True)
class GatherAttrs:
    """Gather / GatherElements along ``axis``."""

    axis: int = 0


def _axis(ctx: InferContext, rank: int) -> int:
    try:
        return normalize_axis(ctx.attrs.axis, rank, "axis")
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None


def _indices(ins: list[np.ndarray | None], dim: int) -> np.ndarray:
    """Input 1 as int64 indices, negatives wrapped into ``[0, dim)``; IndexError if out of range."""
    idx = np.asarray(arg(ins, 1)).astype(np.int64)
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise IndexError(f"indices out of range [-{dim}, {dim - 1}]")
    return np.where(idx < 0, idx + dim, idx)


def _infer_gather(ctx: InferContext) -> list[TensorType]:
    t, ti = ctx.type(0), ctx.type(1)
    if ti.dtype not in _INDEX_DTYPES:
        raise ctx.fail(f"indices must be int32 or int64, got {ti.dtype.short}")
    if t.shape is None or ti.shape is None:
        return [t.with_shape(None)]
    axis = _axis(ctx, len(t.shape))
    return [t.with_shape(t.shape[:axis] + ti.shape + t.shape[axis + 1 :])]


def _ref_gather(ins: list[np.ndarray | None], a: GatherAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    axis = normalize_axis(a.axis, x.ndim)
    return [np.take(x, _indices(ins, x.shape[axis]), axis=axis)]


register(
    OpDef(
        "Gather",
        _infer_gather,
        _ref_gather,
        GatherAttrs,
        inputs=(2, 2),
        quant=QuantPolicy.PASSTHROUGH,
        doc="y = take(x, indices, axis): out[i.., j.., k..] = x[i.., indices[j..], k..]",
    )
)


def _infer_gather_elements(ctx: InferContext) -> list[TensorType]:
    t, ti = ctx.type(0), ctx.type(1)
    if ti.dtype not in _INDEX_DTYPES:
        raise ctx.fail(f"indices must be int32 or int64, got {ti.dtype.short}")
    if t.shape is not None and ti.shape is not None:
        if len(t.shape) != len(ti.shape):
            raise ctx.fail(f"data rank {len(t.shape)} != indices rank {len(ti.shape)}")
        _axis(ctx, len(t.shape))
    return [t.with_shape(ti.shape)]


def _ref_gather_elements(ins: list[np.ndarray | None], a: GatherAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    axis = normalize_axis(a.axis, x.ndim)
    idx = _indices(ins, x.shape[axis])
    grid: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    return [x[tuple(grid)]]


register(
    OpDef(
        "GatherElements",
        _infer_gather_elements,
        _ref_gather_elements,
        GatherAttrs,
        inputs=(2, 2),
        doc="out[i][j] = x[indices[i][j]][j] for axis 0 (likewise for other axes); out has indices' shape",
    )
)


# ---------------------------------------------------------------- TopK
@dataclass(frozen=True)
class TopKAttrs:
    """TopK along ``axis``: the ``k`` largest (or smallest) values and their int64 indices."""

    axis: int = -1
    largest: int = 1
    sorted: int = 1


def topk(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """Values and indices of the ``k`` largest/smallest along ``axis``, sorted; ties keep the lower index."""
    if largest:
        # A stable ascending sort of the reversed axis, read backwards: descending, ties by lower index.
        n = x.shape[axis]
        order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
        idx = n - 1 - np.flip(order, axis)
    else:
        idx = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(idx, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


def _infer_topk(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    k = int_const(ctx, 1, "k")
    if k is not None and (len(k) != 1 or k[0] < 0):
        raise ctx.fail(f"k must be one non-negative value, got {k}")
    if t.shape is None:
        return [t, TensorType(DType.INT64, None)]
    axis = _axis(ctx, len(t.shape))
    d = t.shape[axis]
    if k is not None and isinstance(d, int) and k[0] > d:
        raise ctx.fail(f"k={k[0]} exceeds dim {axis} of size {d}")
    shape = t.shape[:axis] + (UNKNOWN if k is None else k[0],) + t.shape[axis + 1 :]
    return [t.with_shape(shape), TensorType(DType.INT64, shape)]


def _ref_topk(ins: list[np.ndarray | None], a: TopKAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    k = int(np.asarray(arg(ins, 1)).reshape(-1)[0])
    axis = normalize_axis(a.axis, x.ndim)
    if k > x.shape[axis]:
        raise ValueError(f"k={k} exceeds dim {axis} of size {x.shape[axis]}")
    return list(topk(x, k, axis, bool(a.largest)))


register(
    OpDef(
        "TopK",
        _infer_topk,
        _ref_topk,
        TopKAttrs,
        inputs=(2, 2),
        outputs=(2, 2),
        doc="values, indices = the k largest (largest=1) or smallest entries along axis, sorted",
    )
)


# ---------------------------------------------------------------- NonZero
def _infer_nonzero(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    c = ctx.const(0)
    count = int(np.count_nonzero(c)) if c is not None else UNKNOWN
    return [TensorType(DType.INT64, (max(t.rank, 1) if t.rank is not None else UNKNOWN, count))]


def _ref_nonzero(ins: list[np.ndarray | None], a: object, n: int) -> list[np.ndarray]:
    x = np.atleast_1d(first(ins))
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


register(
    OpDef(
        "NonZero",
        _infer_nonzero,
        _ref_nonzero,
        doc="y[:, j] = index of the j-th non-zero of x in row-major order (int64 [rank, nnz])",
    )
)


# ---------------------------------------------------------------- Compress
@dataclass(frozen=True)
class CompressAttrs:
    """Compress along ``axis`` (None: of the flattened input)."""

    axis: int | None = None


def _infer_compress(ctx: InferContext) -> list[TensorType]:
    t, cond = ctx.type(0), ctx.type(1)
    if cond.dtype is not DType.BOOL or (cond.rank is not None and cond.rank != 1):
        raise ctx.fail(f"condition must be a 1-D bool tensor, got {cond}")
    c = ctx.const(1)
    kept = int(np.count_nonzero(c)) if c is not None else UNKNOWN
    if ctx.attrs.axis is None:
        return [t.with_shape((kept,))]
    if t.shape is None:
        return [t]
    try:
        axis = normalize_axis(ctx.attrs.axis, len(t.shape), "axis")
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return [t.with_shape((*t.shape[:axis], kept, *t.shape[axis + 1 :]))]


def _ref_compress(ins: list[np.ndarray | None], a: CompressAttrs, n: int) -> list[np.ndarray]:
    x, cond = first(ins), np.asarray(arg(ins, 1)).astype(bool)
    return [np.compress(cond, x, axis=a.axis)]


register(
    OpDef(
        "Compress",
        _infer_compress,
        _ref_compress,
        CompressAttrs,
        inputs=(2, 2),
        doc="y = the slices of x along axis (flattened x: None) where the 1-D condition is true",
    )
)


# ---------------------------------------------------------------- ReverseSequence
@dataclass(frozen=True)
class ReverseSequenceAttrs:
    """ReverseSequence: which of the first two axes is the batch and which the time axis."""

    batch_axis: int = 1
    time_axis: int = 0


def _infer_reverse_sequence(ctx: InferContext) -> list[TensorType]:
    t, lens = ctx.type(0), ctx.type(1)
    if sorted((ctx.attrs.batch_axis, ctx.attrs.time_axis)) != [0, 1]:
        raise ctx.fail("batch_axis and time_axis must be 0 and 1")
    if t.rank is not None and t.rank < 2:
        raise ctx.fail(f"input must have rank >= 2, got {t.rank}")
    if lens.dtype is not DType.INT64 or (lens.rank is not None and lens.rank != 1):
        raise ctx.fail(f"sequence_lens must be a 1-D int64 tensor, got {lens}")
    return [t]


def _ref_reverse_sequence(ins: list[np.ndarray | None], a: ReverseSequenceAttrs, n: int) -> list[np.ndarray]:
    x, lens = first(ins), np.asarray(arg(ins, 1))
    y = np.moveaxis(x, (a.batch_axis, a.time_axis), (0, 1)).copy()
    for b, length in enumerate(lens.reshape(-1)):
        y[b, : int(length)] = y[b, : int(length)][::-1]
    return [np.moveaxis(y, (0, 1), (a.batch_axis, a.time_axis))]


register(
    OpDef(
        "ReverseSequence",
        _infer_reverse_sequence,
        _ref_reverse_sequence,
        ReverseSequenceAttrs,
        inputs=(2, 2),
        doc="y[b, :len[b]] = x[b, :len[b]] reversed along time_axis, for each b of batch_axis",
    )
)

