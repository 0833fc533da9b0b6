"""N-d indexing: ScatterND, ScatterElements and GatherND.

With ``k = indices.shape[-1]``, ScatterND writes the slice ``updates[i..]`` at
``data[indices[i.., 0], ..., indices[i.., k-1]]``; ScatterElements writes
``updates[i][j]`` at ``data[indices[i][j]][j]`` (axis 0; likewise for other axes);
GatherND reads ``data[b.., indices[b.., i.., :]]`` with ``batch_dims`` leading
dims shared by data and indices. A ``reduction`` (add, mul, max, min) combines
the update with what is there; with ``none`` a duplicate index is undefined in
ONNX (here the last update wins). Negative indices count from the back of their axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.inputs import arg, first
from compiler.ops.registry import InferContext, OpDef, register
from compiler.ops.shapes import normalize_axis

__all__ = ["ScatterNDAttrs", "ScatterElementsAttrs", "GatherNDAttrs", "REDUCTIONS"]

_INDEX_DTYPES = (DType.INT32, DType.INT64)

REDUCTIONS: dict[str, np.ufunc | None] = {
    "none": None,
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


@dataclass(frozen=True)
class ScatterNDAttrs:
    """ScatterND: ``reduction`` is none, add, mul (opset 16) or max, min (opset 18)."""

    reduction: str = "none"


@dataclass(frozen=True)
class ScatterElementsAttrs:
    """ScatterElements along ``axis`` with a ``reduction`` (as ScatterND's)."""

    axis: int = 0
    reduction: str = "none"


@dataclass(frozen=True)
class GatherNDAttrs:
    """GatherND: the first ``batch_dims`` dims of data and indices are batch dims."""

    batch_dims: int = 0


def _wrap(idx: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """int64 indices whose last axis indexes ``dims``, negatives wrapped; IndexError if out of range."""
    idx = idx.astype(np.int64)
    lim = np.asarray(dims, dtype=np.int64)
    if idx.size and (np.any(idx < -lim) or np.any(idx >= lim)):
        raise IndexError(f"indices out of range for dims {dims}")
    return np.where(idx < 0, idx + lim, idx)


def _apply(out: np.ndarray, keys: tuple[np.ndarray, ...], upd: np.ndarray, reduction: str) -> np.ndarray:
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}")
    fn = REDUCTIONS[reduction]
    if fn is None:
        out[keys] = upd
    else:
        fn.at(out, keys, upd)
    return out


def _check_indices(ctx: InferContext, i: int) -> None:
    if ctx.type(i).dtype not in _INDEX_DTYPES:
        raise ctx.fail(f"indices must be int32 or int64, got {ctx.type(i).dtype.short}")


def _check_reduction(ctx: InferContext) -> None:
    if ctx.attrs.reduction not in REDUCTIONS:
        raise ctx.fail(f"reduction must be one of {', '.join(REDUCTIONS)}, got {ctx.attrs.reduction!r}")


def _infer_scatter_nd(ctx: InferContext) -> list[TensorType]:
    _check_indices(ctx, 1)
    _check_reduction(ctx)
    t, ts, tu = ctx.type(0), ctx.type(1).shape, ctx.type(2).shape
    if t.shape is not None and ts is not None and tu is not None and isinstance(ts[-1], int):
        want = (*ts[:-1], *t.shape[ts[-1] :])
        clash = len(want) != len(tu) or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(want, tu, strict=True)
        )
        if clash:
            raise ctx.fail(f"updates shape {tu} != indices.shape[:-1] + data.shape[k:] = {want}")
    return [t]


def _ref_scatter_nd(ins: list[np.ndarray | None], a: ScatterNDAttrs, n: int) -> list[np.ndarray]:
    data, idx, upd = first(ins), np.asarray(arg(ins, 1)), np.asarray(arg(ins, 2))
    k = idx.shape[-1]
    flat = _wrap(idx.reshape(-1, k), data.shape[:k])
    upd = upd.reshape((flat.shape[0], *data.shape[k:])).astype(data.dtype)
    return [_apply(data.copy(), tuple(flat.T), upd, a.reduction)]


def _infer_scatter_elements(ctx: InferContext) -> list[TensorType]:
    _check_indices(ctx, 1)
    _check_reduction(ctx)
    t, ts = ctx.type(0), ctx.type(1).shape
    if t.shape is not None:
        try:
            normalize_axis(ctx.attrs.axis, len(t.shape), "axis")
        except ValueError as exc:
            raise ctx.fail(str(exc)) from None
        if ts is not None and len(ts) != len(t.shape):
            raise ctx.fail(f"data rank {len(t.shape)} != indices rank {len(ts)}")
    return [t]


def _ref_scatter_elements(ins: list[np.ndarray | None], a: ScatterElementsAttrs, n: int) -> list[np.ndarray]:
    data, idx, upd = first(ins), np.asarray(arg(ins, 1)), np.asarray(arg(ins, 2))
    axis = normalize_axis(a.axis, data.ndim)
    keys: list[np.ndarray] = list(np.indices(idx.shape))
    keys[axis] = _wrap(idx[..., None], (data.shape[axis],))[..., 0]
    return [_apply(data.copy(), tuple(keys), upd.astype(data.dtype), a.reduction)]


def _infer_gather_nd(ctx: InferContext) -> list[TensorType]:
    _check_indices(ctx, 1)
    t, ts = ctx.type(0), ctx.type(1).shape
    b = ctx.attrs.batch_dims
    if t.shape is None or ts is None:
        return [t.with_shape(None)]
    k = ts[-1]
    if not isinstance(k, int):
        return [t.with_shape(None)]
    if b < 0 or b >= min(len(t.shape), len(ts)) or b + k > len(t.shape):
        raise ctx.fail(f"batch_dims={b} and indices.shape[-1]={k} do not fit data rank {len(t.shape)}")
    return [t.with_shape((*ts[:-1], *t.shape[b + k :]))]


def _ref_gather_nd(ins: list[np.ndarray | None], a: GatherNDAttrs, n: int) -> list[np.ndarray]:
    data, idx = first(ins), np.asarray(arg(ins, 1))
    b, k = a.batch_dims, idx.shape[-1]
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    d = data.reshape((batch, *data.shape[b:]))
    ind = _wrap(idx.reshape((batch, -1, k)), data.shape[b : b + k])
    rows = [d[i][tuple(ind[i].T)] for i in range(batch)]
    out = np.stack(rows) if rows else np.zeros((0, 0, *data.shape[b + k :]), data.dtype)
    return [out.reshape((*idx.shape[:-1], *data.shape[b + k :]))]


register(
    OpDef(
        "ScatterND",
        _infer_scatter_nd,
        _ref_scatter_nd,
        ScatterNDAttrs,
        inputs=(3, 3),
        doc="y = data; y[indices[i.., :]] (reduction)= updates[i..] (a slice when k < rank)",
    )
)
register(
    OpDef(
        "ScatterElements",
        _infer_scatter_elements,
        _ref_scatter_elements,
        ScatterElementsAttrs,
        inputs=(3, 3),
        doc="y = data; y[indices[i][j]][j] (reduction)= updates[i][j] for axis 0 (likewise other axes)",
    )
)
register(
    OpDef(
        "GatherND",
        _infer_gather_nd,
        _ref_gather_nd,
        GatherNDAttrs,
        inputs=(2, 2),
        doc="y[b.., i..] = data[b.., indices[b.., i.., :]] (b = batch_dims leading dims)",
    )
)
