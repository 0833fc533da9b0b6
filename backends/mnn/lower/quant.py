"""QDQ (``--quantize int8``) regions -> MNN: the 3.x integer form, or explicit fake-quant casts.

* ``DequantizeLinear`` of a constant (a weight) is folded into a float constant before
  lowering (:func:`fold_weight_dequant`); a conv that stays in float is then written like any
  float layer (and takes the ``--mnn-weights`` storage).
* **Integer form** (:func:`integer_form`, then
  :func:`backends.mnn.lower.int8_net.finish_int8`), written whenever every
  activation Q/DQ is per-tensor, for both activation types: Q/DQ pairs become per-tensor
  ``quantInfo`` in ``extraTensorDescribe`` (no cast ops; MNN inserts its own), and a
  ``kiln::QConv`` (the QDQ conv regions the ``fuse-quantized-ops{depthwise=0,...}`` step of
  ``legalize-mnn`` found) becomes MNN's int8 conv: its int8 weights and weight scales as
  symmetric IDST int8 weights, its int32 bias as ``bias_q * s_x * s_w``, then ``scaleIn`` /
  ``scaleOut`` and ``symmetricQuan`` metadata. uint8 grids map exactly onto int8:
  ``q_int8 = q_uint8 - 128``, zero point ``z - 128``, same scale.
* **Explicit form** (otherwise): each ``kiln::QConv`` is expanded back into its QDQ definition
  (:func:`expand_qconv`), an activation ``QuantizeLinear`` becomes ``FloatToInt8``
  (``tensorScale = 1/s``) and a ``DequantizeLinear`` ``Int8ToFloat`` (``tensorScale = s``), with
  ``QuantizedFloatParam`` as MNN's legacy form stores it (NOTES §2); convs run in float.

What MNN 3.6.1's CPU runtime does with zero points (*observed*, tiny nets compared with the
QDQ model in onnxruntime, and *source*: ``CPUConvolution::MutableResourceInt8``):

* int8 ``Convolution`` honours the tensor zero points (input and output ``quantInfo.zero``,
  clamp from the output's min/max): results equal the QDQ model's;
* int8 ``ConvolutionDepthwise`` does **not** (errors of several LSB with zero points != 0; with
  zero points 0 exact on tiny nets but drifting on yunet), so depthwise convs are written with float weights:
  MNN casts around it, which is exactly the QDQ model's fake-quant (``legalize-mnn`` does not fuse
  them: ``depthwise=0``; *observed* on yunet_n_320 with ``--activation-type int8``: obj_32
  cosine 0.9812 with int8 depthwise kernels, 0.9865 with float ones, against 0.9854 for the
  QDQ model);
* int8 ``Pooling`` came out ~128 LSB off on an asymmetric grid, was wrong when fed through a
  runtime cast even on a symmetric grid, and pads a MaxPool with q = 0; such a Pooling runs in
  float between identity depthwise 1x1 convs with float weights (:func:`_float_islands`), so
  the int8 convs around it stay int8 (explicit FloatToInt8 / Int8ToFloat ops did not work in
  the integer form);
* int8 ``BinaryOp`` and ``Interp`` with zero points matched exactly.
"""

from __future__ import annotations

import logging

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.activation import SUPPORTED_ACTIVATIONS
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.conv import conv_weight, write_conv
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table, TensorQuant
from backends.mnn.weights import WeightStorage
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType
from compiler.ops.fused import KILN
from compiler.ops.qconv import qconv_multiplier
from compiler.ops.registry import get_op
from schemas.mnn.quantized_weights import QuantizedWeights
from schemas.mnn.schema import fb

__all__ = [
    "LOWERINGS",
    "fold_weight_dequant",
    "emit_int8_to_float",
    "from_quantize",
    "integer_form",
    "expand_qconv",
]

log = logging.getLogger(__name__)

_Q = "QuantizeLinear"
_DQ = "DequantizeLinear"


def _dequant(node: Node, graph: Graph) -> np.ndarray | None:
    """The float array of a DequantizeLinear whose inputs are all constant, else None."""
    ins = graph.inputs_of(node)
    if ins[0] is None or ins[0].const is None or ins[1] is None or ins[1].const is None:
        return None
    x = ins[0].const.astype(np.float64)
    s = ins[1].const.astype(np.float64)
    z = (
        ins[2].const.astype(np.float64)
        if len(ins) > 2 and ins[2] is not None and ins[2].const is not None
        else None
    )
    if len(ins) > 2 and ins[2] is not None and ins[2].const is None:
        return None
    block = int(getattr(node.attrs, "block_size", 0) or 0)
    axis = int(getattr(node.attrs, "axis", 1)) % max(x.ndim, 1)
    if s.size > 1:
        shape = [1] * x.ndim
        if block:
            s = np.repeat(s, block, axis=axis)
            s = np.take(s, np.arange(x.shape[axis]), axis=axis)
            if z is not None and z.size > 1:
                z = np.take(np.repeat(z, block, axis=axis), np.arange(x.shape[axis]), axis=axis)
        else:
            shape[axis] = x.shape[axis]
            s = s.reshape(shape)
            if z is not None and z.size > 1:
                z = z.reshape(shape)
    y = (x - (z if z is not None else 0.0)) * s
    return y.astype(np.float32)


def fold_weight_dequant(graph: Graph) -> Graph:
    """``graph`` with each DequantizeLinear of constants replaced by its float constant.

    Returns ``graph`` itself when there is nothing to fold (otherwise a clone).
    """
    todo = [n for n in graph.nodes() if n.qualified_op == _DQ and _dequant(n, graph) is not None]
    if not todo:
        return graph
    g = graph.clone()
    for old in todo:
        node = g.node(old.id)
        array = _dequant(node, g)
        assert array is not None
        value = g.value(node)
        name = value.name
        const = g.add_constant(array, f"{name}__folded")
        g.replace_all_uses(value, const)
        if g.is_output(value):
            g.set_outputs(
                [const if (v.node, v.port) == (value.node, value.port) else v for v in g.outputs],
                g.output_names,
            )
        g.remove(node)
        g.rename(const, name)
    return g


# ---------------------------------------------------------------- activation casts
def _params(ctx: LowerContext, node: Node) -> tuple[float, int, DType]:
    """(scale, zero point in int8 terms, quantised dtype) of a per-tensor Q or DQ."""
    ins = ctx.graph.inputs_of(node)
    s_value = ins[1]
    assert s_value is not None and s_value.const is not None
    z_value = ins[2] if len(ins) > 2 else None
    if node.qualified_op == _Q:
        dtype = z_value.type.dtype if z_value is not None else DType.UINT8
        if int(getattr(node.attrs, "output_dtype", 0) or 0) and z_value is None:
            dtype = DType.INT8 if node.output_types[0].dtype == DType.INT8 else node.output_types[0].dtype
    else:
        x = ins[0]
        assert x is not None
        dtype = x.type.dtype
    zero = (
        int(np.asarray(z_value.const).reshape(-1)[0])
        if z_value is not None and z_value.const is not None
        else 0
    )
    if dtype == DType.UINT8:
        zero -= 128
    return float(np.asarray(s_value.const).reshape(-1)[0]), zero, dtype


def _check(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    s = ins[1]
    z = ins[2] if len(ins) > 2 else None
    s_array = None if s is None else s.const
    z_array = None if z is None else z.const
    if s_array is None or (z is not None and z_array is None):
        return "scale and zero point must be constant"
    if s_array.size != 1 or (z_array is not None and z_array.size != 1):
        return "per-tensor activation quantisation only (weights are folded)"
    x = ins[0]
    assert x is not None
    dtype = x.type.dtype if node.qualified_op == _DQ else node.output_types[0].dtype
    if dtype not in (DType.INT8, DType.UINT8):
        return f"{dtype} (int8/uint8 only)"
    if not 2 <= len(x.type.static_shape) <= 5:
        return "2-D to 5-D tensors only"
    return None


def _lower_q(ctx: LowerContext, node: Node) -> None:
    scale, zero, _ = _params(ctx, node)
    if ctx.int8_form:
        _mark_int8(ctx, node, scale, zero)
        return
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    x = ctx.tensor(x_value, Format.NC4HW4)
    out = ctx.define(ctx.graph.value(node), Format.NC4HW4)
    param = Table(
        "QuantizedFloatParam",
        {
            "tensorScale": np.asarray([1.0 / scale], np.float32),
            "zeroPoint": zero,
            "clampMin": -128,
            "clampMax": 127,
            "outputDataType": fb.DataType.DT_INT8,
        },
        force=frozenset({"zeroPoint", "clampMin", "clampMax"}),
    )
    ctx.emit("FloatToInt8", ctx.op_name(node), [x], [out], param)
    ctx.net.tensor_quant[out] = TensorQuant(scale, float(zero))


def emit_int8_to_float(ctx: LowerContext, node: Node, scale: float, zero: int) -> None:
    """``node``'s output (float) = (int8 input 0 - zero) * scale, as an Int8ToFloat op."""
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    x = ctx.tensor(x_value, Format.NC4HW4)
    out = ctx.define(ctx.graph.value(node), Format.NC4HW4)
    param = Table(
        "QuantizedFloatParam",
        {
            "tensorScale": np.asarray([scale], np.float32),
            "zeroPoint": zero,
            "clampMin": -128,
            "clampMax": 127,
        },
        force=frozenset({"zeroPoint", "clampMin", "clampMax"}),
    )
    ctx.emit("Int8ToFloat", ctx.op_name(node), [x], [out], param)


def from_quantize(ctx: LowerContext, node: Node) -> bool:
    """True if input 0 of ``node`` is the int8 output of a QuantizeLinear (an MNN FloatToInt8)."""
    x = ctx.graph.inputs_of(node)[0]
    return x is not None and x.const is None and x.producer.qualified_op == _Q and x.type.dtype == DType.INT8


def _lower_dq(ctx: LowerContext, node: Node) -> None:
    scale, zero, _ = _params(ctx, node)
    if ctx.int8_form:
        x = ctx.graph.inputs_of(node)[0]
        assert x is not None
        ctx.alias(ctx.graph.value(node), x)
        return
    emit_int8_to_float(ctx, node, scale, zero)


# ------------------------------------------------------- the 3.x integer form
_QCONV = "kiln::QConv"


def _zero_int8(graph: Graph, node: Node) -> int | None:
    """The int8-terms zero point of a per-tensor Q/DQ (uint8 shifted by -128), None if not per-tensor."""
    ins = graph.inputs_of(node)
    s = ins[1]
    z = ins[2] if len(ins) > 2 else None
    if s is None or s.const is None or s.const.size != 1:
        return None
    if z is None:
        return 0 if node.qualified_op == _DQ or node.output_types[0].dtype == DType.INT8 else -128
    if z.const is None or z.const.size != 1:
        return None
    shift = 128 if z.type.dtype == DType.UINT8 else 0
    return int(np.asarray(z.const).reshape(-1)[0]) - shift


INTEGER_FORM = True
"""Write the 3.x integer form where :func:`integer_form` allows it (per-tensor activations).

Per-layer comparison with MNN's op callback showed why it once broke ppocr_mobile_v2_cls
(cosine 0.02): MNN's int8 Pooling ignores the tensor scales, so a MaxPool / GlobalAveragePool
whose input and output scales differ came out scaled wrong; :func:`_plan_int8` now keeps
quantInfo only around int8 convs and gives a MaxPool between them its input's scale.
"""


def integer_form(graph: Graph) -> bool:
    """True if ``graph`` (weights already folded) can be written in MNN's 3.x int8 form.

    That form stores only per-tensor ``quantInfo`` (symmetric: zero 0, range [-127, 127];
    asymmetric uint8: zero z - 128, range [-128, 127]) and lets the runtime insert the casts,
    so every activation QuantizeLinear must be per-tensor and feed only DequantizeLinear
    and kiln::QConv nodes, and every DequantizeLinear must read a QuantizeLinear or a
    kiln::QConv. (Poolings MNN's int8 kernel
    gets wrong are kept in float by :func:`finish_int8`.)
    """
    if not INTEGER_FORM:
        return False
    found = False
    for node in graph.nodes():
        op = node.qualified_op
        if op == _Q:
            found = True
            zero = _zero_int8(graph, node)
            if zero is None:
                return False
            if any(user.qualified_op not in (_DQ, _QCONV) for user, _ in graph.users(graph.value(node))):
                return False
        elif op == _DQ:
            x = graph.inputs_of(node)[0]
            if x is None or x.const is not None or x.producer.qualified_op not in (_Q, _QCONV):
                return False
            if _zero_int8(graph, node) is None:
                return False
    return found


def expand_qconv(graph: Graph) -> Graph:
    """``graph`` with every kiln::QConv expanded back into DequantizeLinear -> FusedConv ->
    QuantizeLinear (its registry expansion), for the explicit form; ``graph`` itself if it has none."""
    todo = [n for n in graph.nodes() if n.qualified_op == _QCONV]
    if not todo:
        return graph
    g = graph.clone()
    expand = get_op("QConv", KILN).expand
    assert expand is not None
    for old in todo:
        node = g.node(old.id)
        value = g.value(node)
        name = value.name
        new = expand(g, node)[0]
        g.replace_all_uses(value, new)
        if g.is_output(value):
            outs = [new if (v.node, v.port) == (value.node, value.port) else v for v in g.outputs]
            g.set_outputs(outs, g.output_names)
        g.remove(node)
        g.rename(new, name)
    return g


def _check_qconv(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    if len(x.type.static_shape) != 4 or w.const is None:
        return "2-D convolutions with a constant weight only"
    if node.attrs.is_blocked:
        return "NCHW only"
    act = node.attrs.activation
    if act != "none" and act not in SUPPORTED_ACTIVATIONS:
        return f"activation {act}"
    return None


def _lower_qconv(ctx: LowerContext, node: Node) -> None:
    """Integer form: MNN's int8 conv with the QConv's int8 weights and scales (one per row), the
    float bias ``bias_q * s_x * s_w`` and the output grid as the output's quantInfo (scaleIn,
    scaleOut and the zero points are added by :func:`finish_int8`)."""
    if not ctx.int8_form:
        raise ValueError(f"{node.describe()}: kiln::QConv outside MNN's integer form (expand_qconv it)")
    a = node.attrs
    ins = ctx.graph.inputs_of(node)
    w_value = ins[1]
    assert w_value is not None and w_value.const is not None
    w = w_value.const
    oc = w.shape[0]
    scales = np.broadcast_to(np.asarray(a.w_scales, np.float32), (oc,))
    m = np.broadcast_to(qconv_multiplier(a.x_scale, a.w_scales), (oc,)).astype(np.float64)
    b_value = ins[2] if len(ins) > 2 else None
    bias = np.zeros(oc, np.float32)
    if b_value is not None and b_value.const is not None:
        bias = (b_value.const.astype(np.float64) * m).astype(np.float32)
    levels = QuantizedWeights(w.reshape(oc, -1).astype(np.int32), np.ascontiguousarray(scales), 8, False, oc)
    out = write_conv(ctx, node, conv_weight(ctx.graph, node), bias, WeightStorage("int8", levels=levels))
    if a.out_dtype != "float32":
        zero = a.y_zero - 128 if a.out_dtype == "uint8" else a.y_zero
        lo = -127.0 if zero == 0 else -128.0
        ctx.net.tensor_quant[out] = TensorQuant(a.y_scale, float(zero), lo, 127.0)


def _mark_int8(ctx: LowerContext, node: Node, scale: float, zero: int) -> None:
    """Integer form: the Q output is the activation itself, with int8 quantInfo."""
    x = ctx.graph.inputs_of(node)[0]
    assert x is not None
    ctx.alias(ctx.graph.value(node), x)
    lo = -127.0 if zero == 0 else -128.0
    ctx.net.tensor_quant[ctx.tensor(x)] = TensorQuant(scale, float(zero), lo, 127.0)


LOWERINGS: dict[str, Lowering] = {
    _Q: Lowering(_lower_q, _check),
    _DQ: Lowering(_lower_dq, _check),
    _QCONV: Lowering(_lower_qconv, _check_qconv),
}
