"""Comparison, boolean and variadic elementwise ops.

Comparisons (Equal, Less, Greater, LessOrEqual, GreaterOrEqual) take two
inputs of one dtype and give bool; Not, And, Or and Xor work on bool; Min,
Max, Sum and Mean take 1..N inputs of one dtype. All broadcast numpy-style.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.registry import InferContext, Layout, NoAttrs, OpDef, register
from compiler.ops.shapes import broadcast_all

__all__ = ["COMPARE_OPS", "BOOL_OPS", "VARIADIC_OPS"]

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
