"""Converters of NonMaxSuppression and RoiAlign.

* NonMaxSuppression-10 and 11 map 1:1 (11 only widened the types).
* RoiAlign-10 predates ``coordinate_transformation_mode``; its coordinates are
  opset 16's ``output_half_pixel``. RoiAlign-16 maps 1:1.
"""

from __future__ import annotations

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []

register_generic({"NonMaxSuppression": 10, "RoiAlign": 16})


@converter("RoiAlign", since=10)
def roi_align_v10(ctx: NodeContext) -> list[Value]:
    """RoiAlign-10: no half-pixel offset (``output_half_pixel``)."""
    return ctx.emit("RoiAlign", ctx.inputs, ctx.rest(coordinate_transformation_mode="output_half_pixel"))
