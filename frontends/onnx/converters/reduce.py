"""Converters of reductions and arg-reductions.

ReduceX before opset 18 (ReduceSum before 13) carries ``axes`` as an
attribute; it becomes a constant int64 input (absent axes stay absent: reduce
over all axes).
"""

from __future__ import annotations

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []

REDUCE_OPS = (
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
)


def _axes_attr_to_input(ctx: NodeContext) -> list[Value]:
    axes = ctx.pop("axes")
    ins = [ctx.require(0), None if axes is None else ctx.ints(axes, "axes")]
    return ctx.emit(ctx.op_type, ins, ctx.rest())


for _op in REDUCE_OPS:
    converter(_op, since=1)(_axes_attr_to_input)
register_generic({op: (13 if op == "ReduceSum" else 18) for op in REDUCE_OPS})
register_generic({"ArgMax": 1, "ArgMin": 1})
