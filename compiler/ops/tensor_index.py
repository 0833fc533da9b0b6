"""Index-driven ops: Gather, GatherElements, TopK and NonZero.

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

__all__ = ["GatherAttrs", "TopKAttrs", "topk"]

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
