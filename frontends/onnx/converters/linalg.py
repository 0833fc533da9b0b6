"""Converters of MatMul, Gemm, Det, Softmax / LogSoftmax / Hardmax.

Softmax-1/11 coerce the input to 2-D at ``axis`` (``[prod(d[:axis]),
prod(d[axis:])]``) and normalise each row. When ``axis`` is the last axis that
equals the canonical per-axis Softmax; otherwise the node becomes
``Reshape(Softmax(Flatten(x, axis), axis=-1), Shape(x))``.
"""

from __future__ import annotations

from compiler.ir.graph import Value
from compiler.ops.shapes import normalize_axis
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []

register_generic(
    {"MatMul": 1, "Gemm": 7, "Softmax": 13, "LogSoftmax": 13, "Hardmax": 13, "Einsum": 12, "Det": 11}
)


def _coerced_softmax(ctx: NodeContext) -> list[Value]:
    x = ctx.require(0)
    rank = x.type.rank
    if rank is None:
        raise ctx.fail("the input rank must be known to convert this opset's 2-D-coerced softmax")
    try:
        axis = normalize_axis(int(ctx.pop("axis", 1)), max(rank, 1), ctx.where)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    op = ctx.op_type
    if axis >= rank - 1:
        return ctx.emit(op, [x], ctx.rest(axis=-1))
    flat = ctx.emit("Flatten", [x], {"axis": axis}, final=False)[0]
    y = ctx.emit(op, [flat], ctx.rest(axis=-1), final=False)[0]
    shape = ctx.emit("Shape", [x], None, final=False)[0]
    return ctx.emit("Reshape", [y, shape], None)


for _op in ("Softmax", "LogSoftmax", "Hardmax"):
    converter(_op, since=1, needs=(_op, "Flatten", "Shape", "Reshape"))(_coerced_softmax)
