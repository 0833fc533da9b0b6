"""Comparison, boolean and variadic elementwise ops.

Comparisons (Equal, Less, Greater, LessOrEqual, GreaterOrEqual) take two
inputs of one dtype and give bool; Not, And, Or and Xor work on bool; the
bitwise ops and BitShift on integers; IsNaN and IsInf give bool; Min, Max,
Sum and Mean take 1..N inputs of one dtype. All broadcast numpy-style.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.registry import InferContext, Layout, NoAttrs, OpDef, register
from compiler.ops.shapes import broadcast_all

__all__ = ["COMPARE_OPS", "BOOL_OPS", "BITWISE_OPS", "VARIADIC_OPS", "BitShiftAttrs", "IsInfAttrs"]

Binary = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _broadcast_inputs(ctx: InferContext, out: DType | None, need: DType | None = None) -> list[TensorType]:
    """All inputs share one dtype (``need`` if given); the output broadcasts them, with dtype ``out``."""
    ts = [ctx.type(i) for i in range(len(ctx.types))]
    dtype = ts[0].dtype
    if any(t.dtype != dtype for t in ts):
        raise ctx.fail(f"input dtypes differ: {', '.join(t.dtype.short for t in ts)}")
    if need is not None and dtype != need:
        raise ctx.fail(f"inputs must be {need.short}, got {dtype.short}")
    try:
        shape = broadcast_all([t.shape for t in ts], ctx.where)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return [TensorType(out or dtype, shape)]


def _arrays(ins: list[np.ndarray | None]) -> list[np.ndarray]:
    return [np.asarray(x) for x in ins if x is not None]


def _ref_bool(fn: Binary) -> Callable[..., list[np.ndarray]]:
    def ref(ins: list[np.ndarray | None], a: NoAttrs, n: int) -> list[np.ndarray]:
        x, y = _arrays(ins)
        return [np.asarray(fn(x, y), dtype=bool)]

    return ref


COMPARE_OPS: dict[str, tuple[Binary, str]] = {
    "Equal": (np.equal, "=="),
    "Less": (np.less, "<"),
    "Greater": (np.greater, ">"),
    "LessOrEqual": (np.less_equal, "<="),
    "GreaterOrEqual": (np.greater_equal, ">="),
}

for _name, (_fn, _sym) in COMPARE_OPS.items():
    register(
        OpDef(
            _name,
            lambda ctx: _broadcast_inputs(ctx, DType.BOOL),
            _ref_bool(_fn),
            inputs=(2, 2),
            layout=Layout.AGNOSTIC,
            doc=f"y = a {_sym} b (bool, numpy broadcasting)",
        )
    )

BOOL_OPS: dict[str, tuple[Binary, str]] = {
    "And": (np.logical_and, "and"),
    "Or": (np.logical_or, "or"),
    "Xor": (np.logical_xor, "xor"),
}

for _name, (_fn, _sym) in BOOL_OPS.items():
    register(
        OpDef(
            _name,
            lambda ctx: _broadcast_inputs(ctx, DType.BOOL, DType.BOOL),
            _ref_bool(_fn),
            inputs=(2, 2),
            layout=Layout.AGNOSTIC,
            doc=f"y = a {_sym} b (bool, numpy broadcasting)",
        )
    )

register(
    OpDef(
        "Not",
        lambda ctx: _broadcast_inputs(ctx, DType.BOOL, DType.BOOL),
        lambda ins, a, n: [np.logical_not(_arrays(ins)[0])],
        layout=Layout.AGNOSTIC,
        doc="y = not x (bool)",
    )
)


BITWISE_OPS: dict[str, tuple[Binary, str]] = {
    "BitwiseAnd": (np.bitwise_and, "&"),
    "BitwiseOr": (np.bitwise_or, "|"),
    "BitwiseXor": (np.bitwise_xor, "^"),
}


def _infer_integer(ctx: InferContext) -> list[TensorType]:
    if not ctx.type(0).dtype.is_integer:
        raise ctx.fail(f"{ctx.op} needs integer inputs, got {ctx.type(0).dtype.short}")
    return _broadcast_inputs(ctx, None)


def _ref_same(fn: Binary) -> Callable[..., list[np.ndarray]]:
    def ref(ins: list[np.ndarray | None], a: object, n: int) -> list[np.ndarray]:
        x, y = _arrays(ins)
        return [np.asarray(fn(x, y)).astype(x.dtype)]

    return ref


for _name, (_fn, _sym) in BITWISE_OPS.items():
    register(
        OpDef(
            _name,
            _infer_integer,
            _ref_same(_fn),
            inputs=(2, 2),
            layout=Layout.AGNOSTIC,
            doc=f"y = a {_sym} b (integers, numpy broadcasting)",
        )
    )

register(
    OpDef(
        "BitwiseNot",
        _infer_integer,
        lambda ins, a, n: [np.bitwise_not(_arrays(ins)[0])],
        layout=Layout.AGNOSTIC,
        doc="y = ~x (integers)",
    )
)


@dataclass(frozen=True)
class BitShiftAttrs:
    """BitShift: ``direction`` is ``LEFT`` or ``RIGHT`` (required by ONNX; unsigned integers)."""

    direction: str = ""


def _bit_shift(ins: list[np.ndarray | None], a: BitShiftAttrs, n: int) -> list[np.ndarray]:
    x, y = _arrays(ins)
    if a.direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"BitShift direction {a.direction!r} is neither LEFT nor RIGHT")
    fn = np.left_shift if a.direction == "LEFT" else np.right_shift
    return [np.asarray(fn(x, y.astype(x.dtype))).astype(x.dtype)]


def _infer_shift(ctx: InferContext) -> list[TensorType]:
    if ctx.attrs.direction not in ("LEFT", "RIGHT"):
        raise ctx.fail(f"direction {ctx.attrs.direction!r} is neither LEFT nor RIGHT")
    if ctx.type(0).dtype.name not in ("UINT8", "UINT16", "UINT32", "UINT64"):
        raise ctx.fail(f"{ctx.type(0).dtype.short} inputs are not supported (Kiln's BitShift is unsigned)")
    return _broadcast_inputs(ctx, None)


register(
    OpDef(
        "BitShift",
        _infer_shift,
        _bit_shift,
        BitShiftAttrs,
        inputs=(2, 2),
        layout=Layout.AGNOSTIC,
        doc="y = x << s (LEFT) or x >> s (RIGHT) (unsigned integers, numpy broadcasting)",
    )
)


@dataclass(frozen=True)
class IsInfAttrs:
    """IsInf: which infinities count."""

    detect_negative: int = 1
    detect_positive: int = 1


def _is_inf(ins: list[np.ndarray | None], a: IsInfAttrs, n: int) -> list[np.ndarray]:
    x = _arrays(ins)[0]
    pos = np.isposinf(x) if a.detect_positive else np.zeros(x.shape, bool)
    neg = np.isneginf(x) if a.detect_negative else np.zeros(x.shape, bool)
    return [pos | neg]


def _infer_float_test(ctx: InferContext) -> list[TensorType]:
    if not ctx.type(0).dtype.is_float:
        raise ctx.fail(f"{ctx.op} needs float inputs, got {ctx.type(0).dtype.short}")
    return [TensorType(DType.BOOL, ctx.type(0).shape)]


register(
    OpDef(
        "IsNaN",
        _infer_float_test,
        lambda ins, a, n: [np.isnan(_arrays(ins)[0])],
        layout=Layout.AGNOSTIC,
        doc="y = x is NaN (bool)",
    )
)
register(
    OpDef(
        "IsInf",
        _infer_float_test,
        _is_inf,
        IsInfAttrs,
        layout=Layout.AGNOSTIC,
        doc="y = x is +inf (detect_positive) or -inf (detect_negative) (bool)",
    )
)


def _sum(xs: list[np.ndarray]) -> np.ndarray:
    """Sum in the inputs' dtype; float16 accumulates in float32, as ONNX Runtime does."""
    acc = np.float32 if xs[0].dtype == np.float16 else xs[0].dtype
    return np.asarray(reduce(np.add, (x.astype(acc) for x in xs)))


def _mean(xs: list[np.ndarray]) -> np.ndarray:
    total = _sum(xs)
    return np.asarray(total / np.asarray(len(xs), dtype=total.dtype))


def _infer_float(ctx: InferContext) -> list[TensorType]:
    if not ctx.type(0).dtype.is_float:
        raise ctx.fail(f"{ctx.op} needs float inputs, got {ctx.type(0).dtype.short}")
    return _broadcast_inputs(ctx, None)


VARIADIC_OPS: dict[str, tuple[Callable[[list[np.ndarray]], np.ndarray], str]] = {
    "Min": (lambda xs: reduce(np.minimum, xs), "y = elementwise min of all inputs"),
    "Max": (lambda xs: reduce(np.maximum, xs), "y = elementwise max of all inputs"),
    "Sum": (_sum, "y = elementwise sum of all inputs (float only)"),
    "Mean": (_mean, "y = elementwise sum of all inputs / number of inputs (float only)"),
}


def _ref_variadic(fn: Callable[[list[np.ndarray]], np.ndarray]) -> Callable[..., list[np.ndarray]]:
    def ref(ins: list[np.ndarray | None], a: NoAttrs, n: int) -> list[np.ndarray]:
        xs = _arrays(ins)
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        return [np.broadcast_to(fn(xs), shape).astype(xs[0].dtype)]

    return ref


for _name, (_vfn, _doc) in VARIADIC_OPS.items():
    register(
        OpDef(
            _name,
            _infer_float if _name in ("Sum", "Mean") else (lambda ctx: _broadcast_inputs(ctx, None)),
            _ref_variadic(_vfn),
            inputs=(1, -1),
            layout=Layout.AGNOSTIC,
            doc=f"{_doc} (numpy broadcasting)",
        )
    )
