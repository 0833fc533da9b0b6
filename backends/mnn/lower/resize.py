"""Resize -> Interp (nearest, bilinear, cubic) over H and W of a 4-D NC4HW4 tensor.

MNN maps an output coordinate x to the input coordinate ``x * s + offset``, with the
offset derived from ``ctm`` (MNN's ``_ConverterInterp``) and s = in / out, unless a
second, float input holds the scales (then s = 1 / scale). Kiln writes the ONNX
coordinate mode as ``ctm`` and the output size, and adds the scales input when the ONNX
scale is not exactly out / in (a fractional scale whose output size was floored).

==================  ==========  ===============================
ONNX mode           resizeType  note
==================  ==========  ===============================
nearest, floor      1           MNN floors the source coordinate
nearest, round_*    4           MNN rounds it (half up)
linear              2
cubic               3           cubicCoeffA = cubic_coeff_a
==================  ==========  ===============================
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node
from compiler.ops.resize import resize_plan
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "COORDINATE_MODES"]

COORDINATE_MODES: dict[str, int] = {
    "half_pixel": fb.CoordinateTransformationMode.HalfPixels,
    "pytorch_half_pixel": fb.CoordinateTransformationMode.PytorchHalfPixels,
    "align_corners": fb.CoordinateTransformationMode.AlignCorners,
    "asymmetric": fb.CoordinateTransformationMode.Asymmetric,
    "tf_half_pixel_for_nn": fb.CoordinateTransformationMode.TensorflowHalfPixels,
}
_NEAREST = {"floor": 1, "round_prefer_floor": 4, "round_prefer_ceil": 4}


def _plan(graph: Graph, node: Node) -> tuple[list[float | None], list[int]]:
    ins = graph.inputs_of(node)
    x = ins[0]
    assert x is not None
    scales = ins[2].const if len(ins) > 2 and ins[2] is not None else None
    sizes = ins[3].const if len(ins) > 3 and ins[3] is not None else None
    _, sc, axes = resize_plan(x.type.static_shape, node.attrs, scales, sizes)
    return sc, axes


def _check(graph: Graph, node: Node) -> str | None:
    a = node.attrs
    x = graph.inputs_of(node)[0]
    assert x is not None
    if len(x.type.static_shape) != 4 or not x.type.dtype.is_float:
        return "4-D float input only"
    if a.antialias or a.exclude_outside or a.keep_aspect_ratio_policy != "stretch":
        return "antialias / exclude_outside / keep_aspect_ratio_policy"
    if a.coordinate_transformation_mode not in COORDINATE_MODES:
        return f"coordinate_transformation_mode {a.coordinate_transformation_mode}"
    if a.mode == "nearest" and a.nearest_mode not in _NEAREST:
        return f"nearest_mode {a.nearest_mode}"
    ins = graph.inputs_of(node)
    if any(v is not None and v.const is None for v in ins[1:]):
        return "scales/sizes must be constant"
    sc, _ = _plan(graph, node)
    if sc[0] != 1.0 or sc[1] != 1.0:
        return "resizing N or C"
    return None


def _lower(ctx: LowerContext, node: Node) -> None:
    a = node.attrs
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    value = ctx.graph.value(node)
    out_shape = ctx.shape(value)
    sc, _ = _plan(ctx.graph, node)
    sh, sw = sc[2], sc[3]
    assert sh is not None and sw is not None
    ctm = a.coordinate_transformation_mode
    resize_type = {"nearest": _NEAREST.get(a.nearest_mode, 1), "linear": 2, "cubic": 3}[a.mode]
    fields: dict[str, object] = {
        "widthScale": 1.0 / sw,
        "heightScale": 1.0 / sh,
        "outputWidth": int(out_shape[3]),
        "outputHeight": int(out_shape[2]),
        "resizeType": resize_type,
        "alignCorners": ctm == "align_corners",
        "halfPixelCenters": ctm in ("half_pixel", "pytorch_half_pixel"),
        "ctm": COORDINATE_MODES[ctm],
    }
    if a.mode == "cubic":
        fields["cubicCoeffA"] = float(a.cubic_coeff_a)
    ins = [ctx.tensor(x_value, Format.NC4HW4)]
    in_shape = ctx.shape(x_value)
    if any(out_shape[i] != in_shape[i] * s for i, s in ((2, sh), (3, sw))):
        # MNN derives the scale from the sizes (in / out) unless a float scales input is given.
        scales = np.asarray([1.0, 1.0, sh, sw], np.float32)
        ins.append(ctx.const_tensor(scales, f"{ctx.op_name(node)}__scales"))
    out = ctx.define(value, Format.NC4HW4)
    param = Table("Interp", fields, force=frozenset({"resizeType"}))
    ctx.emit("Interp", ctx.op_name(node), ins, [out], param)


LOWERINGS: dict[str, Lowering] = {"Resize": Lowering(_lower, _check)}
