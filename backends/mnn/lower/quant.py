"""QDQ (``--quantize int8``) regions -> MNN, as explicit fake-quant casts.

What this writes (a correct subset of MNN's int8 representation, **not** integer conv
kernels):

* ``DequantizeLinear`` of a constant (a weight) is folded into a float constant before
  lowering (:func:`fold_weight_dequant`); the conv / FC that consumes it is then written
  like any float layer (and takes the ``--mnn-weights`` storage).
* An activation ``QuantizeLinear`` becomes ``FloatToInt8`` (``tensorScale = 1/s``) and a
  ``DequantizeLinear`` becomes ``Int8ToFloat`` (``tensorScale = s``), both NC4HW4 in and
  out, with ``QuantizedFloatParam`` as MNN's legacy explicit form stores it (NOTES §2). The
  int8 tensor between them carries ``quantInfo`` in ``extraTensorDescribe``. uint8 values
  are shifted into int8 (``q - 128``, zero point ``z - 128``), which is the same real value.

A Q->DQ pair therefore computes exactly the ONNX fake-quant, but the conv between two pairs
still runs MNN's float kernels: MNN only uses its int8 conv when the conv itself is
written in the 3.x form (quanParameter with scaleIn/scaleOut and int8 quantInfo on its
input/output tensors, no cast ops).

That 3.x form is written instead (:func:`integer_form`, :func:`finish_int8`) when every
activation is quantised symmetrically (``--activation-type int8``): convs between a DQ and a
Q become MNN int8 convs, and MNN inserts its own casts around the ops it runs in float.
uint8 (asymmetric) activations keep the explicit-cast form.
"""

from __future__ import annotations

import logging

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.registry import Lowering, require_static
from backends.mnn.model import MnnNet, MnnOp, Table, TensorQuant
from backends.mnn.schema import fb
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType

__all__ = [
    "LOWERINGS",
    "fold_weight_dequant",
    "emit_int8_to_float",
    "from_quantize",
    "integer_form",
    "int8_convs",
    "finish_int8",
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


def _check(ctx: LowerContext, node: Node) -> str | None:
    if (reason := require_static(node, ctx.graph)) is not None:
        return reason
    ins = ctx.graph.inputs_of(node)
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
    if not 2 <= len(ctx.shape(x)) <= 5:
        return "2-D to 5-D tensors only"
    return None


def _lower_q(ctx: LowerContext, node: Node) -> None:
    scale, zero, _ = _params(ctx, node)
    if ctx.int8_form:
        _mark_int8(ctx, node, scale)
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
_CONVS = ("Conv", "kiln::FusedConv")


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
"""Write the 3.x integer form where :func:`integer_form` allows it (symmetric int8 activations).

Per-layer comparison with MNN's op callback showed why it once broke ppocr_mobile_v2_cls
(cosine 0.02): MNN's int8 Pooling ignores the tensor scales, so a MaxPool / GlobalAveragePool
whose input and output scales differ came out scaled wrong; :func:`_plan_int8` now keeps
quantInfo only around int8 convs and gives a MaxPool between them its input's scale.
"""


def integer_form(graph: Graph) -> bool:
    """True if ``graph`` (weights already folded) can be written in MNN's 3.x int8 form.

    That form stores only per-tensor ``quantInfo`` (zero point 0, range [-127, 127]) and lets
    the runtime insert the casts, so every activation QuantizeLinear must be symmetric
    (``--activation-type int8``) and feed only DequantizeLinear nodes, and every
    DequantizeLinear must read a QuantizeLinear. Asymmetric (uint8) activations gave wrong
    results in MNN 3.x's int8 path (*observed*: yunet cosine 0.83 vs 0.996), so they keep
    the explicit FloatToInt8/Int8ToFloat form.
    """
    if not INTEGER_FORM:
        return False
    found = False
    for node in graph.nodes():
        op = node.qualified_op
        if op == _Q:
            found = True
            if _zero_int8(graph, node) != 0:
                return False
            if any(user.qualified_op != _DQ for user, _ in graph.users(graph.value(node))):
                return False
        elif op == _DQ:
            x = graph.inputs_of(node)[0]
            if x is None or x.const is not None or x.producer.qualified_op != _Q:
                return False
            if _zero_int8(graph, node) != 0:
                return False
    return found


def int8_convs(graph: Graph) -> list[Node]:
    """Convs between a DequantizeLinear (input) and only QuantizeLinear users (output)."""
    out = []
    for node in graph.nodes():
        if node.qualified_op not in _CONVS:
            continue
        x = graph.inputs_of(node)[0]
        users = graph.users(graph.value(node))
        from_dq = x is not None and x.const is None and x.producer.qualified_op == _DQ
        if from_dq and users and all(user.qualified_op == _Q for user, _ in users):
            out.append(node)
    return out


def _mark_int8(ctx: LowerContext, node: Node, scale: float) -> None:
    """Integer form: the Q output is the activation itself, with int8 quantInfo."""
    x = ctx.graph.inputs_of(node)[0]
    assert x is not None
    ctx.alias(ctx.graph.value(node), x)
    ctx.net.tensor_quant[ctx.tensor(x)] = TensorQuant(scale, 0.0, -127.0, 127.0)


_CONV_OPS = ("Convolution", "ConvolutionDepthwise")
INT8_BINARY = True
"""Let MNN run BinaryOps between int8 tensors in int8 (its CPUBinaryInt8 rescales per tensor)."""


def _int8_weights(op: MnnOp) -> bool:
    """True for a conv whose weights are symmetric IDST int8 and that has no float ``weight``."""
    if op.type not in _CONV_OPS or op.param is None or op.param.get("weight") is not None:
        return False
    idst = op.param.get("quanParameter")
    return isinstance(idst, Table) and idst.get("type") == 1 and not idst.get("aMin", 0)


def _plan_int8(net: MnnNet) -> dict[str, list[str]]:
    """Keep ``quantInfo`` only where MNN's int8 kernels compute what the QDQ model means.

    MNN runs an op in int8 when its output and all its inputs carry quantInfo and the op
    has an int8 kernel (conv with int8 weights, Pooling, BinaryOp, Softmax, ...); other ops
    get runtime casts. Its int8 Pooling ignores the scales (it assumes input scale = output
    scale) and the rest are not needed, so quantInfo stays only on the inputs and outputs of
    int8 convs; a MaxPool between two of them gets its input's scale (max commutes with the
    int8 grid), any other op between them loses its output's quantInfo (its consumers then run
    in float). Returns ``{reason: [op names]}`` of ops kept in float that touch int8 tensors.
    """
    quant = net.tensor_quant
    for op in net.ops:
        if op.type == "ConvertTensor" and op.inputs[0] in quant and op.outputs[0] not in quant:
            quant[op.outputs[0]] = quant[op.inputs[0]]
    fallback: dict[str, list[str]] = {}
    while True:
        convs = [o for o in net.ops if _int8_weights(o) and o.inputs[0] in quant and o.outputs[0] in quant]
        keep = {t for op in convs for t in (op.inputs[0], op.outputs[0])}
        for t in [t for t in quant if t not in keep]:
            del quant[t]
        changed = False
        for op in net.ops:
            if op in convs or not op.outputs or op.outputs[0] not in quant:
                continue
            if not op.inputs or any(t not in quant for t in op.inputs):
                continue
            if op.type == "Pooling" and op.param is not None and op.param.get("type") == fb.PoolType.MAXPOOL:
                if quant[op.outputs[0]] != quant[op.inputs[0]]:
                    quant[op.outputs[0]] = quant[op.inputs[0]]
                    changed = True
                continue
            if op.type == "BinaryOp" and INT8_BINARY:
                continue
            del quant[op.outputs[0]]
            fallback.setdefault(f"{op.type} (no exact int8 kernel)", []).append(op.name)
            changed = True
        if not changed:
            return fallback


def finish_int8(net: MnnNet) -> int:
    """Integer form, after lowering: choose the int8 tensors, and scaleIn/scaleOut on convs.

    A Convolution whose input and output tensors both carry quantInfo (:func:`_plan_int8`) and
    whose weights are IDST int8 gets ``scaleIn``/``scaleOut`` and the ``symmetricQuan``
    metadata that MNN's quantization tool writes (NOTES §2). Returns the number of such convs.
    """
    fallback = _plan_int8(net)
    for reason, names in fallback.items():
        log.info("MNN int8: %s kept in float: %s", reason, ", ".join(names))
    quant = net.tensor_quant
    count = 0
    for op in net.ops:
        if not _int8_weights(op) or op.inputs[0] not in quant or op.outputs[0] not in quant:
            continue
        assert op.param is not None
        idst = op.param.get("quanParameter")
        assert isinstance(idst, Table)
        fields = {**idst.fields, "scaleIn": quant[op.inputs[0]].scale, "scaleOut": quant[op.outputs[0]].scale}
        meta = Table(
            "QuantizedFloatParam",
            {"nbits": 8, "clampMin": -127, "clampMax": 127, "outputDataType": fb.DataType.DT_INT8},
            force=frozenset({"nbits", "clampMin", "clampMax"}),
        )
        op.param = Table(
            op.param.name,
            {
                **op.param.fields,
                "quanParameter": Table("IDSTQuan", fields, idst.force),
                "symmetricQuan": meta,
            },
            op.param.force,
        )
        count += 1
    return count


LOWERINGS: dict[str, Lowering] = {
    _Q: Lowering(_lower_q, _check),
    _DQ: Lowering(_lower_dq, _check),
}
