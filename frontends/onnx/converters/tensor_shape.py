"""Converters of shape-only ops: Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Shape, Size,
Expand, Tile, DepthToSpace, SpaceToDepth.

Squeeze / Unsqueeze before opset 13 carry ``axes`` as an attribute; it becomes a
constant int64 input.
"""

from __future__ import annotations

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []

register_generic(
    {
        "Reshape": 5,
        "Flatten": 1,
        "Transpose": 1,
        "Squeeze": 13,
        "Unsqueeze": 13,
        "Shape": 1,
        "Size": 1,
        "Expand": 8,
        "Tile": 6,
        "DepthToSpace": 1,
        "SpaceToDepth": 1,
    }
)


def _axes_to_input(ctx: NodeContext) -> list[Value]:
    axes = ctx.pop("axes")
    ins = [ctx.require(0), None if axes is None else ctx.ints(axes, "axes")]
    return ctx.emit(ctx.op_type, ins, ctx.rest())


converter("Squeeze", since=1)(_axes_to_input)
converter("Unsqueeze", since=1)(_axes_to_input)
