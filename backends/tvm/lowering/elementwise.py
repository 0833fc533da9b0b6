"""Elementwise ops: numpy-broadcasting binaries, unaries, activations, Quantize/DequantizeLinear.

Relax's LegalizeOps turns these into TIR; FuseOps merges chains of them and
Kiln's generic rule schedules the fused kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from backends.tvm.lowering.table import LowerContext, const_inputs, lowers
from compiler.errors import ConversionError
from compiler.ir.graph import Node

__all__ = ["activation", "quantize", "dequantize"]


def _op() -> Any:
    from tvm import relax

    return relax.op


_BINARY: dict[str, str] = {
    "Add": "add",
    "Sub": "subtract",
    "Mul": "multiply",
    "Div": "divide",
    "Pow": "power",
    "Max": "maximum",
    "Min": "minimum",
    "Equal": "equal",
    "Less": "less",
    "Greater": "greater",
    "LessOrEqual": "less_equal",
    "GreaterOrEqual": "greater_equal",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "logical_xor",
    "BitwiseAnd": "bitwise_and",
    "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
}

_UNARY: dict[str, str] = {
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Neg": "negative",
    "Abs": "abs",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Erf": "erf",
    "Sign": "sign",
    "Sin": "sin",
    "Cos": "cos",
    "Not": "logical_not",
    "BitwiseNot": "bitwise_not",
    "Tan": "tan",
    "Asin": "asin",
    "Acos": "acos",
    "Atan": "atan",
    "Sinh": "sinh",
    "Cosh": "cosh",
    "Asinh": "asinh",
    "Acosh": "acosh",
    "Atanh": "atanh",
    "IsNaN": "isnan",
    "Reciprocal": "",  # 1 / x below
}


@lowers(*_BINARY)
def _binary(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    fn = getattr(_op(), _BINARY[node.op])
    if node.op in ("Max", "Min") and len(ins) != 2:
        out = ins[0]
        for x in ins[1:]:
            out = ctx.emit(fn(out, x))
        return [out]
    return [ctx.emit(fn(ins[0], ins[1]))]


@lowers(*_UNARY)
def _unary(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    if node.op == "Reciprocal":
        dt = ctx.in_type(node, 0).dtype.numpy.name
        return [ctx.emit(_op().divide(ctx.scalar(1.0, dt), ins[0]))]
    return [ctx.emit(getattr(_op(), _UNARY[node.op])(ins[0]))]


def activation(ctx: LowerContext, x: Any, name: str, alpha: float, beta: float, dtype: str) -> Any:
    """act(x) in Relax ops, with ONNX's definitions (names as in compiler.ops.fused.ACTIVATIONS)."""
    op = _op()

    def s(v: float) -> Any:
        return ctx.scalar(v, dtype)

    def clip(v: Any, lo: float, hi: float) -> Any:
        return op.minimum(op.maximum(v, s(lo)), s(hi))

    forms: dict[str, Callable[[], Any]] = {
        "none": lambda: x,
        "relu": lambda: op.maximum(x, s(0.0)),
        "relu6": lambda: clip(x, 0.0, 6.0),
        "clip": lambda: clip(x, alpha, beta),
        "leaky_relu": lambda: op.where(op.greater_equal(x, s(0.0)), x, op.multiply(x, s(alpha))),
        "sigmoid": lambda: op.sigmoid(x),
        "tanh": lambda: op.tanh(x),
        "hard_sigmoid": lambda: clip(op.add(op.multiply(x, s(alpha)), s(beta)), 0.0, 1.0),
        "hard_swish": lambda: op.multiply(x, clip(op.add(op.multiply(x, s(1.0 / 6.0)), s(0.5)), 0.0, 1.0)),
    }
    if name not in forms:
        raise ConversionError(f"activation {name!r} has no TVM lowering")
    return x if name == "none" else ctx.emit(forms[name]())


_ACT_OPS = {
    "Relu": "relu",
    "kiln::Relu6": "relu6",
    "LeakyRelu": "leaky_relu",
    "HardSigmoid": "hard_sigmoid",
    "HardSwish": "hard_swish",
}


@lowers(*_ACT_OPS)
def _activation_op(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    a = node.attrs
    alpha = float(getattr(a, "alpha", 0.0))
    beta = float(getattr(a, "beta", 0.0))
    dt = ctx.in_type(node, 0).dtype.numpy.name
    return [activation(ctx, ins[0], _ACT_OPS[node.qualified_op], alpha, beta, dt)]


@lowers("Clip")
def _clip(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    op = _op()
    out = ins[0]
    if len(ins) > 1 and ins[1] is not None:
        out = ctx.emit(op.maximum(out, ins[1]))
    if len(ins) > 2 and ins[2] is not None:
        out = ctx.emit(op.minimum(out, ins[2]))
    return [out]


@lowers("Identity")
def _identity(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [ins[0]]


@lowers("Cast")
def _cast(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [ctx.emit(_op().astype(ins[0], ctx.out_type(node).dtype.numpy.name))]


@lowers("Where")
def _where(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [ctx.emit(_op().where(ins[0], ins[1], ins[2]))]


def _axis_shape(ctx: LowerContext, node: Node, param: np.ndarray, axis: int) -> np.ndarray:
    """A per-axis quantization parameter reshaped to broadcast against input 0."""
    rank = len(ctx.in_type(node, 0).shape or ())
    if param.ndim == 0 or rank == 0:
        return param
    shape = [1] * rank
    shape[axis % rank] = param.size
    return param.reshape(shape)


def quantize(ctx: LowerContext, x: Any, scale: np.ndarray, zero: np.ndarray, out_dtype: str) -> Any:
    """q = saturate(round_half_even(x / s) + z)."""
    op = _op()
    info = np.iinfo(out_dtype)
    y = op.round(op.divide(x, ctx.const(scale.astype(np.float32))))
    y = op.add(y, ctx.const(zero.astype(np.float32)))
    y = op.minimum(op.maximum(y, ctx.scalar(info.min, "float32")), ctx.scalar(info.max, "float32"))
    return ctx.emit(op.astype(y, out_dtype))


def dequantize(ctx: LowerContext, q: Any, scale: np.ndarray, zero: np.ndarray) -> Any:
    """x = (q - z) * s, in float32 (exact: |q - z| < 2^24)."""
    op = _op()
    y = op.subtract(op.astype(q, "float32"), ctx.const(zero.astype(np.float32)))
    return ctx.emit(op.multiply(y, ctx.const(scale.astype(np.float32))))


@lowers("QuantizeLinear", check=const_inputs((1, "scale")))
def _quantize(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    axis = int(node.attrs.axis)
    scale = _axis_shape(ctx, node, ctx.require_const(node, 1, "scale"), axis)
    z = ctx.input_const(node, 2)
    out_dt = ctx.out_type(node).dtype.numpy.name
    zero = _axis_shape(ctx, node, z if z is not None else np.zeros((), out_dt), axis)
    return [quantize(ctx, ins[0], scale, zero, out_dt)]


@lowers("DequantizeLinear", check=const_inputs((1, "scale")))
def _dequantize(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    axis = int(node.attrs.axis)
    scale = _axis_shape(ctx, node, ctx.require_const(node, 1, "scale"), axis)
    z = ctx.input_const(node, 2)
    zero = _axis_shape(ctx, node, z if z is not None else np.zeros((), np.int32), axis)
    return [dequantize(ctx, ins[0], scale, zero)]
