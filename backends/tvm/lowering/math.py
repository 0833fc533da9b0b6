"""Pointwise ops composed from Relax's: Mod, BitShift, IsInf, CastLike and the activations ONNX
defines by formula (each as the ONNX operator defines it, in the input's float type):

* Celu(x) = max(0, x) + min(0, α (exp(x / α) - 1))
* Selu(x) = γ x for x > 0, else γ α (exp(x) - 1)
* ThresholdedRelu(x) = x for x > α, else 0;  Softsign(x) = x / (1 + |x|)
* Mish(x) = x tanh(softplus(x)) with softplus(x) = max(x, 0) + log(1 + exp(-|x|)) (no overflow)
* Shrink(x) = x + bias for x < -λ, x - bias for x > λ, else 0
* Mod: ``fmod=1`` is C's fmod (the sign of the dividend), ``fmod=0`` (integers) the sign of the
  divisor (floor modulo)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.tvm.lowering.table import LowerContext, lowers
from compiler.ir.graph import Graph, Node

__all__ = ["softplus"]


def _op() -> Any:
    from tvm import relax

    return relax.op


def softplus(ctx: LowerContext, x: Any, dt: str) -> Any:
    """log(1 + exp(x)) as max(x, 0) + log(1 + exp(-|x|)): finite for every finite x."""
    op = _op()
    tail = op.log(op.add(ctx.scalar(1.0, dt), op.exp(op.negative(op.abs(x)))))
    return ctx.emit(op.add(op.maximum(x, ctx.scalar(0.0, dt)), tail))


def _celu(ctx: LowerContext, node: Node, x: Any, dt: str) -> Any:
    op, a = _op(), float(node.attrs.alpha)
    neg = op.multiply(
        ctx.scalar(a, dt), op.subtract(op.exp(op.divide(x, ctx.scalar(a, dt))), ctx.scalar(1.0, dt))
    )
    return op.add(op.maximum(x, ctx.scalar(0.0, dt)), op.minimum(neg, ctx.scalar(0.0, dt)))


def _selu(ctx: LowerContext, node: Node, x: Any, dt: str) -> Any:
    op, a, g = _op(), float(node.attrs.alpha), float(node.attrs.gamma)
    neg = op.multiply(ctx.scalar(g * a, dt), op.subtract(op.exp(x), ctx.scalar(1.0, dt)))
    return op.where(op.greater(x, ctx.scalar(0.0, dt)), op.multiply(x, ctx.scalar(g, dt)), neg)


def _thresholded(ctx: LowerContext, node: Node, x: Any, dt: str) -> Any:
    op = _op()
    return op.where(op.greater(x, ctx.scalar(float(node.attrs.alpha), dt)), x, ctx.scalar(0.0, dt))


def _softsign(ctx: LowerContext, node: Node, x: Any, dt: str) -> Any:
    op = _op()
    return op.divide(x, op.add(ctx.scalar(1.0, dt), op.abs(x)))


def _mish(ctx: LowerContext, node: Node, x: Any, dt: str) -> Any:
    op = _op()
    return op.multiply(x, op.tanh(softplus(ctx, x, dt)))


def _shrink(ctx: LowerContext, node: Node, x: Any, dt: str) -> Any:
    op, lam, bias = _op(), float(node.attrs.lambd), float(node.attrs.bias)
    zero = ctx.scalar(0, dt)
    low = op.where(op.less(x, ctx.scalar(-lam, dt)), op.add(x, ctx.scalar(bias, dt)), zero)
    return op.where(op.greater(x, ctx.scalar(lam, dt)), op.subtract(x, ctx.scalar(bias, dt)), low)


_FORMULAS: dict[str, Callable[[LowerContext, Node, Any, str], Any]] = {
    "Celu": _celu,
    "Selu": _selu,
    "ThresholdedRelu": _thresholded,
    "Softsign": _softsign,
    "Mish": _mish,
    "Shrink": _shrink,
}


@lowers(*_FORMULAS)
def _formula(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    dt = ctx.in_type(node, 0).dtype.numpy.name
    return [ctx.emit(_FORMULAS[node.op](ctx, node, ins[0], dt))]


@lowers("Mod")
def _mod(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    op = _op()
    if node.attrs.fmod:  # truncated: x - trunc(x / y) * y, the sign of x
        dt = ctx.in_type(node, 0).dtype
        if dt.is_float:
            return [ctx.emit(op.mod(ins[0], ins[1]))]
        rem = op.floor_mod(ins[0], ins[1])  # the divisor's sign; fix where the signs differ
        zero = ctx.scalar(0, dt.numpy.name)
        signs = op.logical_xor(op.less(ins[0], zero), op.less(ins[1], zero))
        fix = op.logical_and(op.not_equal(rem, zero), signs)
        return [ctx.emit(op.where(fix, op.subtract(rem, ins[1]), rem))]
    return [ctx.emit(op.floor_mod(ins[0], ins[1]))]


def _bitshift_reason(graph: Graph, node: Node) -> str | None:
    if node.attrs.direction not in ("LEFT", "RIGHT"):
        return f"BitShift direction {node.attrs.direction!r} is neither LEFT nor RIGHT"
    return None


@lowers("BitShift", check=_bitshift_reason)
def _bitshift(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    fn = _op().left_shift if node.attrs.direction == "LEFT" else _op().right_shift
    return [ctx.emit(fn(ins[0], ins[1]))]


@lowers("IsInf")
def _isinf(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    op = _op()
    a = node.attrs
    dt = ctx.in_type(node, 0).dtype.numpy.name
    inf = op.isinf(ins[0])
    if a.detect_positive and a.detect_negative:
        return [ctx.emit(inf)]
    if not a.detect_positive and not a.detect_negative:
        return [ctx.emit(op.logical_and(inf, op.logical_not(inf)))]  # all false
    side = op.greater if a.detect_positive else op.less
    return [ctx.emit(op.logical_and(inf, side(ins[0], ctx.scalar(0, dt))))]


@lowers("CastLike")
def _cast_like(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [ctx.emit(_op().astype(ins[0], ctx.out_type(node).dtype.numpy.name))]
