"""Converters of Resize and Upsample into the canonical ``Resize(X, roi, scales, sizes)``.

* Upsample-7 (``scales`` attribute), Upsample-9 (``scales`` input) and
  Resize-10 ``(X, scales)`` all use asymmetric coordinates,
  x_in = x_out / scale; nearest takes floor(x_in). They become Resize with
  ``coordinate_transformation_mode="asymmetric"`` and, for nearest,
  ``nearest_mode="floor"``; the mode ``bilinear`` is ``linear``.
* GridSample-16 (4-D only) names its modes ``bilinear``/``bicubic``; they become
  the opset-20 ``linear``/``cubic``; GridSample-20 maps 1:1.
* Resize-11 and later map 1:1; a constant empty ``roi`` or ``scales`` (how
  exporters spell "absent" before opset 13) becomes an absent input.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []


def _upsample_style(ctx: NodeContext, scales: Value) -> list[Value]:
    mode = str(ctx.pop("mode", "nearest")).lower()
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise ctx.fail(f"mode {mode!r} is not supported")
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    return ctx.emit("Resize", [ctx.require(0), None, scales, None], ctx.rest(**attrs))


@converter("Upsample", since=7, needs=("Resize",))
def upsample(ctx: NodeContext) -> list[Value]:
    """Upsample-7/9/10 -> asymmetric Resize."""
    scales_attr = ctx.pop("scales")
    if scales_attr is not None:
        scales = ctx.constant(np.asarray(scales_attr, dtype=np.float32), "scales")
    else:
        scales = ctx.require(1)
    return _upsample_style(ctx, scales)


@converter("Resize", since=10)
def resize_v10(ctx: NodeContext) -> list[Value]:
    """Resize-10 ``(X, scales)`` -> asymmetric Resize."""
    return _upsample_style(ctx, ctx.require(1))


def _absent_if_empty(v: Value | None) -> Value | None:
    if v is None:
        return None
    c = v.const
    return None if c is not None and c.size == 0 else v


@converter("Resize", since=11)
def resize_v11(ctx: NodeContext) -> list[Value]:
    """Resize-11 and later: 1:1, with empty constant roi/scales/sizes made absent."""
    ins = [ctx.require(0)] + [_absent_if_empty(ctx.input(i)) for i in (1, 2, 3)]
    return ctx.emit("Resize", ins, ctx.rest())


register_generic({"GridSample": 20})

_GRID_SAMPLE_16_MODES = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}


@converter("GridSample", since=16)
def grid_sample_v16(ctx: NodeContext) -> list[Value]:
    """GridSample-16: opset-16 mode names -> opset-20 ones."""
    mode = str(ctx.pop("mode", "bilinear"))
    if mode not in _GRID_SAMPLE_16_MODES:
        raise ctx.fail(f"GridSample-16 mode {mode!r} is not bilinear, nearest or bicubic")
    return ctx.emit("GridSample", ctx.inputs, ctx.rest(mode=_GRID_SAMPLE_16_MODES[mode]))
