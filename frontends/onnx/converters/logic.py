"""Converters of comparison, boolean, bitwise and selection ops (1:1; signed BitShift decomposed)."""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []

register_generic(
    {
        "Equal": 7,
        "Less": 7,
        "Greater": 7,
        "LessOrEqual": 12,
        "GreaterOrEqual": 12,
        "Not": 1,
        "And": 7,
        "Or": 7,
        "Xor": 7,
        "Where": 9,
        "IsNaN": 9,
        "IsInf": 10,
        "BitwiseAnd": 18,
        "BitwiseOr": 18,
        "BitwiseXor": 18,
        "BitwiseNot": 18,
    }
)

_UNSIGNED = {DType.INT8: DType.UINT8, DType.INT32: DType.UINT32, DType.INT64: DType.UINT64}


@converter("BitShift", since=11)
def bit_shift(ctx: NodeContext) -> list[Value]:
    """BitShift; signed inputs (opset 28) through the unsigned shift of the same width.

    For shift s valid (0 <= s < width): LEFT is the unsigned shift of x's bits, wrapped back;
    RIGHT is arithmetic, ~((~x) >> s) for x < 0. For s out of range the result is 0, or -1 for a
    RIGHT shift of a negative x: the unsigned shift of 0, sign-filled. int16 is computed in int32
    (onnxruntime has no int16 Where) and cast back, which wraps a LEFT shift to the same 16 bits.
    """
    x, y = ctx.require(0), ctx.require(1)
    signed = x.type.dtype
    if signed not in (*_UNSIGNED, DType.INT16):
        return ctx.emit("BitShift", ctx.inputs, ctx.rest())
    direction = ctx.pop("direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.fail(f"direction {direction!r} is neither LEFT nor RIGHT")
    width = 8 * signed.itemsize

    def op(name: str, ins: list[Value], attrs: dict[str, object] | None = None) -> Value:
        return ctx.emit(name, ins, attrs, final=False)[0]

    compute = DType.INT32 if signed is DType.INT16 else signed
    if compute is not signed:
        x, y = (op("Cast", [v], {"to": int(compute)}) for v in (x, y))
    unsigned = _UNSIGNED[compute]
    zero, bits = (ctx.constant(np.asarray(v, compute.numpy), f"c{v}") for v in (0, width))
    valid = op("And", [op("GreaterOrEqual", [y, zero]), op("Less", [y, bits])])
    amount = op("Cast", [op("Where", [valid, y, zero])], {"to": int(unsigned)})
    negative = op("Less", [x, zero])
    bits_in = x if direction == "LEFT" else op("Where", [negative, op("BitwiseNot", [x]), x])
    shifted = op("BitShift", [op("Cast", [bits_in], {"to": int(unsigned)}), amount], {"direction": direction})
    out = op("Where", [valid, op("Cast", [shifted], {"to": int(compute)}), zero])
    if direction == "RIGHT":
        out = op("Where", [negative, op("BitwiseNot", [out]), out])
    if compute is not signed:
        return ctx.emit("Cast", [out], ctx.rest(to=int(signed)))
    return ctx.emit("Identity", [out], ctx.rest())
