"""CumSum and CumProd (prefix scans), OneHot, Trilu and EyeLike (index masks).

CumSum: y[i] = sum_{j <= i} x[j] along ``axis`` (``j < i`` when exclusive; the
scan runs from the back when reverse), summed in x's dtype in scan order; CumProd
(opset 26) likewise with products (an exclusive scan starts from 1).
EyeLike: y[i, j] = 1 where j - i == k, else 0, shaped like the 2-D input, of ``dtype``
(default: the input's).
OneHot: y[..., d, ...] = on if indices[...] == d (mod depth) else off, with the new
axis of size ``depth`` at ``axis``; an index outside [-depth, depth) gives an all-off row.
Trilu: keep x[..., i, j] where j - i >= k (upper) or j - i <= k (lower), else 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.inputs import arg, first, int_const
from compiler.ops.registry import InferContext, OpDef, register, same_as_input
from compiler.ops.shapes import UNKNOWN, normalize_axis

__all__ = ["CumSumAttrs", "OneHotAttrs", "TriluAttrs", "EyeLikeAttrs"]


@dataclass(frozen=True)
class CumSumAttrs:
    """CumSum: ``exclusive`` leaves out the element itself; ``reverse`` scans from the back."""

    exclusive: int = 0
    reverse: int = 0


@dataclass(frozen=True)
class OneHotAttrs:
    """OneHot: where the depth axis goes (-1 = last)."""

    axis: int = -1


@dataclass(frozen=True)
class TriluAttrs:
    """Trilu: ``upper=1`` keeps the upper triangle (``triu``), 0 the lower (``tril``)."""

    upper: int = 1


def _infer_cumsum(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if ctx.type(1).dtype not in (DType.INT32, DType.INT64):
        raise ctx.fail(f"axis must be int32 or int64, got {ctx.type(1).dtype.short}")
    axis = int_const(ctx, 1, "axis")
    if axis is not None and t.rank is not None and (len(axis) != 1 or not -t.rank <= axis[0] < t.rank):
        raise ctx.fail(f"axis {axis} out of range for rank {t.rank}")
    return [t]


def _ref_scan(product: bool) -> Callable[[list[np.ndarray | None], CumSumAttrs, int], list[np.ndarray]]:
    def ref(ins: list[np.ndarray | None], a: CumSumAttrs, n: int) -> list[np.ndarray]:
        x = first(ins)
        axis = normalize_axis(int(np.asarray(arg(ins, 1)).reshape(-1)[0]), x.ndim)
        y = np.flip(x, axis) if a.reverse else x
        s = (np.cumprod if product else np.cumsum)(y, axis=axis, dtype=x.dtype)
        if a.exclusive:
            head = np.full_like(np.take(s, [0], axis=axis), 1 if product else 0)
            s = np.concatenate([head, np.take(s, np.arange(s.shape[axis] - 1), axis=axis)], axis=axis)
        return [np.flip(s, axis) if a.reverse else s]

    return ref


@dataclass(frozen=True)
class EyeLikeAttrs:
    """EyeLike: the output's ONNX dtype code (None: the input's) and the diagonal offset ``k``."""

    dtype: int | None = None
    k: int = 0


def _infer_eyelike(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if t.rank is not None and t.rank != 2:
        raise ctx.fail(f"input must have rank 2, got {t.rank}")
    code = ctx.attrs.dtype
    try:
        dtype = t.dtype if code is None else DType(code)
    except ValueError:
        raise ctx.fail(f"unsupported dtype code {code}") from None
    if dtype in (DType.STRING, DType.BFLOAT16):
        raise ctx.fail(f"{dtype.short} outputs are not supported")
    return [t.with_shape(t.shape) if dtype is t.dtype else TensorType(dtype, t.shape)]


def _ref_eyelike(ins: list[np.ndarray | None], a: EyeLikeAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    dtype = x.dtype if a.dtype is None else DType(a.dtype).numpy
    return [np.eye(x.shape[0], x.shape[1], k=a.k, dtype=dtype)]


def _infer_onehot(ctx: InferContext) -> list[TensorType]:
    ti, tv = ctx.type(0), ctx.type(2)
    vs = tv.shape
    if vs is not None and (len(vs) != 1 or (isinstance(vs[0], int) and vs[0] != 2)):
        raise ctx.fail(f"values must have shape (2,), got {vs}")
    if ti.shape is None:
        return [tv.with_shape(None)]
    try:
        axis = normalize_axis(ctx.attrs.axis, len(ti.shape) + 1, "axis")
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    c = ctx.const(1)
    depth: int | str = UNKNOWN
    if c is not None:
        if c.size != 1:
            raise ctx.fail(f"depth must be one value, got shape {c.shape}")
        depth = int(c.reshape(-1)[0])
        if depth < 1:
            raise ctx.fail(f"depth must be >= 1, got {depth}")
    return [tv.with_shape((*ti.shape[:axis], depth, *ti.shape[axis:]))]


def _ref_onehot(ins: list[np.ndarray | None], a: OneHotAttrs, n: int) -> list[np.ndarray]:
    idx, values = first(ins), np.asarray(arg(ins, 2))
    depth = int(np.asarray(arg(ins, 1)).reshape(-1)[0])
    axis = normalize_axis(a.axis, idx.ndim + 1)
    i = idx.astype(np.int64)
    i = np.where(i < 0, i + depth, i)
    hot = np.expand_dims(i, axis) == np.arange(depth).reshape((-1,) + (1,) * (idx.ndim - axis))
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


def _infer_trilu(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if t.rank is not None and t.rank < 2:
        raise ctx.fail(f"input must have rank >= 2, got {t.rank}")
    if ctx.has(1) and ctx.type(1).dtype is not DType.INT64:
        raise ctx.fail(f"k must be int64, got {ctx.type(1).dtype.short}")
    return same_as_input()(ctx)


def _ref_trilu(ins: list[np.ndarray | None], a: TriluAttrs, n: int) -> list[np.ndarray]:
    x, k = first(ins), arg(ins, 1)
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return [np.triu(x, kk) if a.upper else np.tril(x, kk)]


register(
    OpDef(
        "CumSum",
        _infer_cumsum,
        _ref_scan(product=False),
        CumSumAttrs,
        inputs=(2, 2),
        doc="y[i] = sum of x[j] along axis for j <= i (j < i: exclusive; from the back: reverse)",
    )
)
register(
    OpDef(
        "CumProd",
        _infer_cumsum,
        _ref_scan(product=True),
        CumSumAttrs,
        inputs=(2, 2),
        min_opset=26,
        doc="y[i] = product of x[j] along axis for j <= i (j < i: exclusive; from the back: reverse)",
    )
)
register(
    OpDef(
        "EyeLike",
        _infer_eyelike,
        _ref_eyelike,
        EyeLikeAttrs,
        doc="y[i, j] = 1 if j - i == k else 0, shaped like the 2-D input, of dtype (default: x's)",
    )
)
register(
    OpDef(
        "OneHot",
        _infer_onehot,
        _ref_onehot,
        OneHotAttrs,
        inputs=(3, 3),
        doc="y = values[1] where indices == d along a new depth axis at axis, else values[0]",
    )
)
register(
    OpDef(
        "Trilu",
        _infer_trilu,
        _ref_trilu,
        TriluAttrs,
        inputs=(1, 2),
        doc="y = x where j - i >= k (upper) or j - i <= k (lower) on the last two axes, else 0",
    )
)
