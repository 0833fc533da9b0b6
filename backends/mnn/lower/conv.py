"""Convolutions: Conv and kiln::FusedConv -> Convolution / ConvolutionDepthwise, ConvTranspose ->
Deconvolution / DeconvolutionDepthwise.

Weights stay in ONNX order ([oc, ic/group, kh, kw] for Conv) and go through
:func:`backends.mnn.weights.conv_weight_fields` (fp32, fp16, int8/int4 per the options).
A conv whose group equals its input and output channels (> 1) is depthwise; any other
group count is written natively (``group = g``). Fused ``relu``/``relu6`` become the
``relu``/``relu6`` flags of ``Convolution2DCommon``; a residual input becomes a BinaryOp
ADD after the conv (``activationType`` 1 fuses a ReLU), other activations separate ops.
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.activation import SUPPORTED_ACTIVATIONS, emit_activation
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.registry import Lowering, WeightView
from backends.mnn.lower.slicing import emit_strided_slice
from backends.mnn.model import Table
from backends.mnn.weights import WeightStorage, conv_weight_fields
from compiler.ir.graph import Graph, Node
from compiler.ops.conv import conv_transpose_geometry
from compiler.ops.shapes import resolve_pads, window_params
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "conv_common", "emit_conv", "write_conv", "conv_weight", "conv_transpose_weight"]


def conv_common(
    kernel: tuple[int, int],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads: tuple[int, ...],
    group: int,
    oc: int,
    ic: int,
    relu: bool = False,
    relu6: bool = False,
    out_pads: tuple[int, ...] = (),
) -> Table:
    """``Convolution2DCommon`` for 2-D geometry (``pads`` = [top, left, bottom, right])."""
    fields: dict[str, object] = {
        "padX": int(pads[1]),
        "padY": int(pads[0]),
        "kernelX": int(kernel[1]),
        "kernelY": int(kernel[0]),
        "strideX": int(strides[1]),
        "strideY": int(strides[0]),
        "dilateX": int(dilations[1]),
        "dilateY": int(dilations[0]),
        "group": int(group),
        "outputCount": int(oc),
        "inputCount": int(ic),
        "relu": bool(relu),
        "relu6": bool(relu6),
        "pads": np.asarray(pads, np.int32),
    }
    if out_pads:
        fields["outPads"] = np.asarray(out_pads, np.int32)
    return Table("Convolution2DCommon", fields)


def emit_conv(
    ctx: LowerContext,
    node: Node,
    op_type: str,
    name: str,
    x: int,
    out: int,
    common: Table,
    view: WeightView,
    bias: np.ndarray,
    storage: WeightStorage | None = None,
) -> None:
    """Emit one conv-family op (NC4HW4 in and out) with ``node``'s weights as planned (or as
    ``storage`` says: integer levels given as they are, one scale per row)."""
    block = view.block_elems(ctx.options.block_size) if storage is None else None
    storage = ctx.storage(node) if storage is None else storage
    weights = conv_weight_fields(view.rows, bias, storage, ctx.external, block)
    ctx.emit(op_type, name, [x], [out], Table("Convolution2D", {"common": common, **weights}))


def conv_weight(graph: Graph, node: Node) -> WeightView:
    """Conv / FusedConv weight [oc, ic/g, kh, kw]: one row per output channel."""
    w_value = graph.inputs_of(node)[1]
    assert w_value is not None and w_value.const is not None
    w = w_value.const.astype(np.float32)
    return WeightView(
        1, w.reshape(w.shape[0], -1), lambda r: r.reshape(w.shape), w.shape[1], w.shape[2] * w.shape[3]
    )


def conv_transpose_weight(graph: Graph, node: Node) -> WeightView:
    """ConvTranspose weight [ic, oc/g, kh, kw], kept in that order: one row per input channel."""
    w_value = graph.inputs_of(node)[1]
    assert w_value is not None and w_value.const is not None
    w = w_value.const.astype(np.float32)
    return WeightView(
        1, w.reshape(w.shape[0], -1), lambda r: r.reshape(w.shape), w.shape[1], w.shape[2] * w.shape[3]
    )


# ------------------------------------------------------------------------ Conv
def _check_conv(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    if len(x.type.static_shape) != 4:
        return "2-D convolutions only"
    if w.const is None or (len(ins) > 2 and ins[2] is not None and ins[2].const is None):
        return "weight and bias must be constant"
    if not x.type.dtype.is_float:
        return "float tensors only"
    act = getattr(node.attrs, "activation", "none")
    if act != "none" and act not in SUPPORTED_ACTIVATIONS:
        return f"activation {act}"
    return None


def _lower_conv(ctx: LowerContext, node: Node) -> None:
    ins = ctx.graph.inputs_of(node)
    w_value = ins[1]
    assert w_value is not None and w_value.const is not None
    b_value = ins[2] if len(ins) > 2 else None
    oc = w_value.const.shape[0]
    bias = b_value.const if b_value is not None and b_value.const is not None else np.zeros(oc, np.float32)
    write_conv(ctx, node, conv_weight(ctx.graph, node), bias)


def write_conv(
    ctx: LowerContext, node: Node, view: WeightView, bias: np.ndarray, storage: WeightStorage | None = None
) -> int:
    """Write a Conv-like ``node`` (FusedConv attributes; input 3: residual) with weights ``view``
    and float ``bias``, then its residual Add and activation; returns the output tensor."""
    g = ctx.graph
    ins = g.inputs_of(node)
    x_value, w_value = ins[0], ins[1]
    assert x_value is not None and w_value is not None
    a = node.attrs
    oc, icg, kh, kw = w_value.type.static_shape
    shape = ctx.shape(x_value)
    ic = shape[1]
    kernel = (kh, kw)
    strides, dilations, pads = window_params(2, kernel, a.strides, a.dilations, a.pads)
    pads = resolve_pads(a.auto_pad, shape[2:], kernel, strides, dilations, pads)
    residual = ins[3] if len(ins) > 3 else None
    act, alpha, beta = getattr(a, "activation", "none"), getattr(a, "alpha", 0.0), getattr(a, "beta", 0.0)
    flag = act if residual is None and act in ("relu", "relu6") else None
    depthwise = a.group == ic == oc  # 1 -> 1 channel too: MNN's depthwise kernel is ~2x faster there
    common = conv_common(kernel, strides, dilations, pads, a.group, oc, ic, flag == "relu", flag == "relu6")

    name = ctx.op_name(node)
    value = g.value(node)
    x = ctx.tensor(x_value, Format.NC4HW4)
    out = ctx.define(value, Format.NC4HW4)
    post = residual is not None or (act != "none" and flag is None)
    conv_out = ctx.temp(f"{value.name}__conv") if post else out
    op_type = "ConvolutionDepthwise" if depthwise else "Convolution"
    emit_conv(ctx, node, op_type, name, x, conv_out, common, view, bias, storage)
    if not post:
        return out
    y = conv_out
    if residual is not None:
        fuse_relu = act == "relu"
        z = ctx.tensor(residual, Format.NC4HW4)
        added = out if fuse_relu or act == "none" else ctx.temp(f"{value.name}__add")
        param = Table(
            "BinaryOp",
            {"opType": fb.BinaryOpOperation.ADD, "T": fb.DataType.DT_FLOAT, "activationType": int(fuse_relu)},
        )
        ctx.emit("BinaryOp", f"{name}__residual", [conv_out, z], [added], param)
        if fuse_relu or act == "none":
            return out
        y = added
    emit_activation(ctx, act, alpha, beta, y, out, Format.NC4HW4, f"{name}__{act}")
    return out


# --------------------------------------------------------------- ConvTranspose
def _lower_conv_transpose(ctx: LowerContext, node: Node) -> None:
    g = ctx.graph
    ins = g.inputs_of(node)
    x_value, w_value = ins[0], ins[1]
    assert x_value is not None and w_value is not None and w_value.const is not None
    a = node.attrs
    w = w_value.const.astype(np.float32)
    ic, ocg, kh, kw = w.shape
    oc = ocg * a.group
    shape = ctx.shape(x_value)
    kernel = (kh, kw)
    strides, dilations, pads = window_params(2, kernel, a.strides, a.dilations, a.pads)
    out_sp, begins = conv_transpose_geometry(a, shape[2:], kernel, strides, dilations, pads)
    assert begins is not None
    natural = [
        strides[i] * (shape[2 + i] - 1)
        + dilations[i] * (kernel[i] - 1)
        + 1
        + (tuple(a.output_padding) or (0, 0))[i]
        for i in range(2)
    ]
    ends = [natural[i] - int(out_sp[i]) - begins[i] for i in range(2)]
    full_pads = (begins[0], begins[1], ends[0], ends[1])
    b_value = ins[2] if len(ins) > 2 else None
    bias = b_value.const if b_value is not None and b_value.const is not None else np.zeros(oc, np.float32)
    depthwise = a.group == ic == oc  # 1 -> 1 channel too: MNN's depthwise kernel is ~2x faster there
    out_pads = tuple(a.output_padding) or (0, 0)
    view = conv_transpose_weight(g, node)
    name = ctx.op_name(node)
    value = g.value(node)
    if a.group == 1 or depthwise:
        common = conv_common(kernel, strides, dilations, full_pads, a.group, oc, ic, out_pads=out_pads)
        x = ctx.tensor(x_value, Format.NC4HW4)
        out = ctx.define(value, Format.NC4HW4)
        op_type = "DeconvolutionDepthwise" if depthwise else "Deconvolution"
        emit_conv(ctx, node, op_type, name, x, out, common, view, bias)
        return
    # MNN has no grouped (non-depthwise) deconvolution: one Deconvolution per group, then Concat.
    icg = ic // a.group
    x_plain = ctx.tensor(x_value, Format.NCHW)
    parts = []
    for i in range(a.group):
        part_in = ctx.temp(f"{value.name}__group{i}_in")
        begin, end = [0, i * icg, 0, 0], [shape[0], (i + 1) * icg, shape[2], shape[3]]
        emit_strided_slice(ctx, f"{name}__group{i}_slice", x_plain, part_in, begin, end, [1, 1, 1, 1], 0)
        packed = ctx.convert(part_in, Format.NCHW, Format.NC4HW4, f"{value.name}__group{i}_in__nc4hw4")
        part_out = ctx.temp(f"{value.name}__group{i}")
        common = conv_common(kernel, strides, dilations, full_pads, 1, ocg, icg, out_pads=out_pads)
        rows = WeightView(1, view.rows[i * icg : (i + 1) * icg], view.restore, view.channels, view.area)
        part_bias = np.asarray(bias, np.float32).reshape(-1)[i * ocg : (i + 1) * ocg]
        emit_conv(ctx, node, "Deconvolution", f"{name}__group{i}", packed, part_out, common, rows, part_bias)
        parts.append(part_out)
    out = ctx.define(value, Format.NC4HW4)
    ctx.emit("Concat", name, parts, [out], Table("Axis", {"axis": 1}, force=frozenset({"axis"})))


def _check_conv_transpose(graph: Graph, node: Node) -> str | None:
    return _check_conv(graph, node)


LOWERINGS: dict[str, Lowering] = {
    "Conv": Lowering(_lower_conv, _check_conv, conv_weight),
    "kiln::FusedConv": Lowering(_lower_conv, _check_conv, conv_weight),
    "ConvTranspose": Lowering(_lower_conv_transpose, _check_conv_transpose, conv_transpose_weight),
}
