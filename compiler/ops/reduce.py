"""Reductions (opset-18 form, axes as an optional input), Softmax/LogSoftmax, ArgMax/ArgMin.

ReduceOp(x, axes): reduce ``x`` over ``axes`` (all axes when absent or empty, unless
noop_with_empty_axes=1 which reduces over no axis: only the elementwise part, e.g. the
square of ReduceSumSquare, is applied); keepdims keeps reduced axes as 1. An empty
reduction gives the identity: 0 for sums, 1 for products, -inf/+inf (or the dtype's
min/max) for max/min, -inf for the log-sums.
Softmax: y = exp(x - max) / sum(exp(x - max)) along one ``axis`` (default -1);
LogSoftmax: y = x - max - log(sum(exp(x - max))).
ArgMax/ArgMin: int64 index of the first (or, with select_last_index, the last) extremum.

Float references accumulate in float64 and cast back to the input dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.types import Dim, DType, TensorType
from compiler.ops.registry import InferContext, Layout, OpDef, register
from compiler.ops.shapes import UNKNOWN, normalize_axes, normalize_axis

__all__ = ["ReduceAttrs", "SoftmaxAttrs", "ArgReduceAttrs", "REDUCE_OPS", "reduce_axes"]


@dataclass(frozen=True)
class ReduceAttrs:
    """Attributes of every Reduce* op (opset 18)."""

    keepdims: int = 1
    noop_with_empty_axes: int = 0


@dataclass(frozen=True)
class SoftmaxAttrs:
    """Softmax / LogSoftmax attributes (opset 13)."""

    axis: int = -1


@dataclass(frozen=True)
class ArgReduceAttrs:
    """ArgMax / ArgMin attributes."""

    axis: int = 0
    keepdims: int = 1
    select_last_index: int = 0


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if x.dtype.kind == "f" else x


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else (False if dtype.kind == "b" else np.iinfo(dtype).min)


def _highest(dtype: np.dtype) -> Any:
    return np.inf if dtype.kind == "f" else (True if dtype.kind == "b" else np.iinfo(dtype).max)


def _log(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(v)


def _logsumexp(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    xf = x.astype(np.float64)
    m = np.max(xf, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    return _log(np.sum(np.exp(xf - m), axis=axes, keepdims=True)) + m


ReduceFn = Callable[[np.ndarray, tuple[int, ...]], np.ndarray]

REDUCE_OPS: dict[str, tuple[ReduceFn, str]] = {
    "ReduceSum": (lambda x, ax: np.sum(_wide(x), axis=ax, keepdims=True), "sum(x)"),
    "ReduceMean": (lambda x, ax: np.mean(_wide(x), axis=ax, keepdims=True), "mean(x)"),
    "ReduceMax": (lambda x, ax: np.max(x, axis=ax, keepdims=True, initial=_lowest(x.dtype)), "max(x)"),
    "ReduceMin": (lambda x, ax: np.min(x, axis=ax, keepdims=True, initial=_highest(x.dtype)), "min(x)"),
    "ReduceProd": (lambda x, ax: np.prod(_wide(x), axis=ax, keepdims=True), "prod(x)"),
    "ReduceL1": (lambda x, ax: np.sum(np.abs(_wide(x)), axis=ax, keepdims=True), "sum(|x|)"),
    "ReduceL2": (
        lambda x, ax: np.sqrt(np.sum(np.square(_wide(x).astype(np.float64)), axis=ax, keepdims=True)),
        "sqrt(sum(x^2))",
    ),
    "ReduceSumSquare": (lambda x, ax: np.sum(np.square(_wide(x)), axis=ax, keepdims=True), "sum(x^2)"),
    "ReduceLogSum": (lambda x, ax: _log(np.sum(_wide(x), axis=ax, keepdims=True)), "log(sum(x))"),
    "ReduceLogSumExp": (_logsumexp, "log(sum(exp(x)))"),
}


def reduce_axes(axes: np.ndarray | None, rank: int, noop: bool, where: str = "") -> tuple[int, ...]:
    """Normalized, sorted reduction axes; () (reduce nothing) for empty axes with
    noop_with_empty_axes, where e.g. ReduceSumSquare still squares elementwise."""
    if axes is None or axes.size == 0:
        return () if noop else tuple(range(rank))
    norm = normalize_axes([int(v) for v in axes.reshape(-1)], rank, where)
    if len(set(norm)) != len(norm):
        raise ValueError(f"{where}: repeated axes {axes.tolist()}")
    return tuple(sorted(norm))


def _unknown_axes_type(ctx: InferContext, t: TensorType, a: ReduceAttrs) -> TensorType:
    """Axes computed at run time: with keepdims the rank stays (dims other than 1 become
    unknown); without, the rank drops by the static number of axes, if it is known."""
    if t.shape is None:
        return t
    if a.keepdims:
        return TensorType(t.dtype, tuple(1 if d == 1 else UNKNOWN for d in t.shape))
    n_axes = ctx.shape(1)
    if len(n_axes) == 1 and isinstance(n_axes[0], int) and n_axes[0] > 0:
        return TensorType(t.dtype, (UNKNOWN,) * (len(t.shape) - n_axes[0]))
    return TensorType(t.dtype, None)


def _infer_reduce(ctx: InferContext) -> list[TensorType]:
    a: ReduceAttrs = ctx.attrs
    t = ctx.type(0)
    if t.dtype == DType.STRING or (t.dtype == DType.BOOL and ctx.op not in ("ReduceMax", "ReduceMin")):
        raise ctx.fail(f"unsupported dtype {t.dtype.short}")
    if ctx.has(1):
        if ctx.type(1).dtype != DType.INT64:
            raise ctx.fail(f"axes must be int64, got {ctx.type(1).dtype.short}")
        if ctx.const(1) is None:
            return [_unknown_axes_type(ctx, t, a)]
    if t.shape is None:
        return [t]
    try:
        axes = reduce_axes(ctx.const(1), len(t.shape), bool(a.noop_with_empty_axes), ctx.where)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    out: list[Dim] = []
    for i, d in enumerate(t.shape):
        if i not in axes:
            out.append(d)
        elif a.keepdims:
            out.append(1)
    return [TensorType(t.dtype, tuple(out))]


def _reduce_ref(fn: ReduceFn) -> Callable[[list[np.ndarray | None], ReduceAttrs, int], list[np.ndarray]]:
    def ref(ins: list[np.ndarray | None], a: ReduceAttrs, n: int) -> list[np.ndarray]:
        x = ins[0]
        assert x is not None
        axes = reduce_axes(ins[1] if len(ins) > 1 else None, x.ndim, bool(a.noop_with_empty_axes))
        y = np.asarray(fn(x, axes))
        if not a.keepdims:
            y = y.reshape([d for i, d in enumerate(x.shape) if i not in axes])
        return [y.astype(x.dtype)]

    return ref


for _name, (_fn, _math) in REDUCE_OPS.items():
    register(
        OpDef(
            _name,
            _infer_reduce,
            _reduce_ref(_fn),
            ReduceAttrs,
            inputs=(1, 2),
            layout=Layout.FIXED,
            doc=f"y = {_math} over axes (input 1; all if absent); keepdims, noop_with_empty_axes",
        )
    )


def _infer_softmax(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if not t.dtype.is_float:
        raise ctx.fail(f"input must be float, got {t.dtype.short}")
    if t.shape is not None:
        try:
            normalize_axis(ctx.attrs.axis, len(t.shape), ctx.where)
        except ValueError as exc:
            raise ctx.fail(str(exc)) from None
    return [t]


def _softmax_ref(log: bool) -> Callable[[list[np.ndarray | None], SoftmaxAttrs, int], list[np.ndarray]]:
    def ref(ins: list[np.ndarray | None], a: SoftmaxAttrs, n: int) -> list[np.ndarray]:
        x = ins[0]
        assert x is not None
        ax = normalize_axis(a.axis, x.ndim)
        xf = x.astype(np.float64)
        z = xf - np.max(xf, axis=ax, keepdims=True)
        if log:
            y = z - np.log(np.sum(np.exp(z), axis=ax, keepdims=True))
        else:
            e = np.exp(z)
            y = e / np.sum(e, axis=ax, keepdims=True)
        return [y.astype(x.dtype)]

    return ref


register(
    OpDef(
        "Softmax",
        _infer_softmax,
        _softmax_ref(False),
        SoftmaxAttrs,
        layout=Layout.FIXED,
        doc="y = exp(x - max) / sum(exp(x - max)) along axis",
    )
)
register(
    OpDef(
        "LogSoftmax",
        _infer_softmax,
        _softmax_ref(True),
        SoftmaxAttrs,
        layout=Layout.FIXED,
        doc="y = x - max - log(sum(exp(x - max))) along axis",
    )
)


def _hardmax_ref(ins: list[np.ndarray | None], a: SoftmaxAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    ax = normalize_axis(a.axis, x.ndim)
    first_max = np.expand_dims(np.argmax(x, axis=ax), ax)
    hot = np.arange(x.shape[ax]).reshape((-1,) + (1,) * (x.ndim - ax - 1)) == first_max
    return [hot.astype(x.dtype)]


register(
    OpDef(
        "Hardmax",
        _infer_softmax,
        _hardmax_ref,
        SoftmaxAttrs,
        layout=Layout.FIXED,
        doc="y = 1 at the first maximum of x along axis, else 0",
    )
)


def _infer_arg(ctx: InferContext) -> list[TensorType]:
    a: ArgReduceAttrs = ctx.attrs
    t = ctx.type(0)
    if t.dtype in (DType.STRING, DType.BOOL):
        raise ctx.fail(f"unsupported dtype {t.dtype.short}")
    if t.shape is None:
        return [TensorType(DType.INT64, None)]
    try:
        ax = normalize_axis(a.axis, len(t.shape), ctx.where)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    shape = list(t.shape)
    if a.keepdims:
        shape[ax] = 1
    else:
        del shape[ax]
    return [TensorType(DType.INT64, tuple(shape))]


def _arg_ref(
    fn: Callable[..., np.ndarray],
) -> Callable[[list[np.ndarray | None], ArgReduceAttrs, int], list[np.ndarray]]:
    def ref(ins: list[np.ndarray | None], a: ArgReduceAttrs, n: int) -> list[np.ndarray]:
        x = ins[0]
        assert x is not None
        ax = normalize_axis(a.axis, x.ndim)
        if a.select_last_index:
            idx = x.shape[ax] - 1 - fn(np.flip(x, axis=ax), axis=ax, keepdims=bool(a.keepdims))
        else:
            idx = fn(x, axis=ax, keepdims=bool(a.keepdims))
        return [np.asarray(idx, dtype=np.int64)]

    return ref


register(
    OpDef(
        "ArgMax",
        _infer_arg,
        _arg_ref(np.argmax),
        ArgReduceAttrs,
        layout=Layout.FIXED,
        doc="y = int64 index of the max along axis (first, or last with select_last_index)",
    )
)
register(
    OpDef(
        "ArgMin",
        _infer_arg,
        _arg_ref(np.argmin),
        ArgReduceAttrs,
        layout=Layout.FIXED,
        doc="y = int64 index of the min along axis (first, or last with select_last_index)",
    )
)
