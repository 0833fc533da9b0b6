"""Lowerings that need code: convolution, pooling, fully connected, batch norm, shapes.

* ``Conv`` / ``kiln::FusedConv`` -> ``Conv2D`` (NCHW; ``pads`` reordered from ONNX's
  [t, l, b, r] to GE's [top, bottom, left, right]; 4-element strides and dilations),
  then ``Add`` for a residual and the activation op of ``ACTIVATIONS``. The int8 regions
  arrive as ``kiln::QConv`` / ``kiln::QGemm`` (fuse-quantized-ops) and go to ``lower_quant.py``.
* ``MaxPool`` / ``AveragePool`` / ``GlobalAveragePool`` / ``GlobalMaxPool`` -> ``Pooling``
  (mode 0 max, 1 avg; GE's ``ceil_mode`` is 0 for ceil and 1 for floor). Pooling has no
  attribute for excluding the padding from the divisor, so a padded ``AveragePool`` with
  ``count_include_pad = 0`` becomes ``AvgPoolV2`` instead, the op ATC writes for ONNX
  AveragePool: ``ksize`` / ``strides`` of 4 (N, C = 1), ``pads`` [top, bottom, left, right],
  ``padding_mode = "CALCULATED"``, ``ceil_mode`` a bool and ``exclusive = true``.
* ``Gemm`` (alpha = 1, beta = 1 or no bias, transA = 0) -> ``FullyConnection``; GE's
  ``transpose`` is true when the weight is [K, N] (ONNX transB = 0).
* ``BatchNormalization`` -> ``BNInference`` (x, mean, variance, momentum = 1.0, scale, offset).
* ``Reshape`` / ``Flatten`` / ``Squeeze`` / ``Unsqueeze`` -> ``Reshape`` to the static output shape.
* ``Transpose`` -> ``TransposeD`` (explicit perm), ``Concat`` -> ``ConcatD`` (with ``N``),
  ``Clip`` -> ``ClipByValue`` (absent bounds become the dtype's extremes).
* ``LayerNormalization`` -> ``LayerNorm`` (outputs y, mean, variance; InvStdDev refused, so the
  decomposition serves it), ``ConvTranspose`` -> ``Conv2DTranspose`` (``input_size`` Const first).
"""

from __future__ import annotations

import numpy as np

from backends.cann.lower import Lowerer, Step, lowering
from backends.cann.nn_attrs import activation_steps, conv2d_attrs, conv2d_reason, fc_attrs
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType
from compiler.ops.shapes import normalize_axis
from passes.normalize_gemm import canonical_gemm_reason
from schemas.cann.codes import format_for
from schemas.cann.om_graph import Attr, TensorDesc
from schemas.cann.op_table import SIMPLE_BY_KILN

__all__: list[str] = []


@lowering("Conv", "kiln::FusedConv", check=conv2d_reason)
def _conv(low: Lowerer, node: Node) -> None:
    ins = low.g.inputs_of(node)
    w = ins[1]
    assert w is not None
    attrs = conv2d_attrs(node.attrs, w.type.static_shape)
    steps = [Step("Conv2D", [low.ref_of(w), low.ref_of(ins[2] if len(ins) > 2 else None)], attrs)]
    if len(ins) > 3 and ins[3] is not None:
        steps.append(Step("Add", [low.ref_of(ins[3])], {}))
    if node.domain:
        a = node.attrs
        steps += activation_steps(low, node, a.activation, a.alpha, a.beta)
    low.chain(node, [low.ref_of(ins[0])], steps)


def _pool_reason(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if x.type.rank != 4:
        return f"only 2-D pooling maps to Pooling (input rank {x.type.rank})"
    if node.op.startswith("Global"):
        return None
    a = node.attrs
    if a.auto_pad not in ("NOTSET", ""):
        return f"auto_pad={a.auto_pad} (run the default pipeline to make pads explicit)"
    if any(d != 1 for d in a.dilations):
        return f"dilations {list(a.dilations)} (Pooling has none)"
    if node.op == "MaxPool" and a.storage_order != 0:
        return "storage_order=1 has no CANN equivalent"
    return None


def _exclusive_avg(node: Node) -> bool:
    """A padded AveragePool that divides by the taps inside the input (AvgPoolV2, exclusive)."""
    return node.op == "AveragePool" and any(node.attrs.pads) and not node.attrs.count_include_pad


@lowering("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", check=_pool_reason)
def _pool(low: Lowerer, node: Node) -> None:
    x = low.g.inputs_of(node)[0]
    assert x is not None
    mode = 0 if node.op in ("MaxPool", "GlobalMaxPool") else 1
    if node.op.startswith("Global"):
        hw = x.type.static_shape[2:]
        attrs = _pool_attrs(mode, True, hw, (1, 1), (0, 0, 0, 0), 1)
    else:
        a = node.attrs
        pads = tuple(a.pads) or (0, 0, 0, 0)
        strides = tuple(a.strides) or (1, 1)
        ge_pads = (pads[0], pads[2], pads[1], pads[3])
        if _exclusive_avg(node):
            attrs = _avg_pool_v2_attrs(a.kernel_shape, strides, ge_pads, bool(a.ceil_mode))
            low.chain(node, [low.ref_of(x)], [Step("AvgPoolV2", [], attrs)])
            return
        attrs = _pool_attrs(mode, False, a.kernel_shape, strides, ge_pads, 0 if a.ceil_mode else 1)
    low.chain(node, [low.ref_of(x)], [Step("Pooling", [], attrs)])


def _avg_pool_v2_attrs(
    window: tuple[int, ...], stride: tuple[int, ...], pad: tuple[int, ...], ceil: bool
) -> dict[str, Attr]:
    return {
        "ksize": Attr.li((1, 1, *window)),
        "strides": Attr.li((1, 1, *stride)),
        "padding_mode": Attr.s("CALCULATED"),
        "pads": Attr.li(pad),
        "data_format": Attr.s("NCHW"),
        "global_pooling": Attr.b(False),
        "ceil_mode": Attr.b(ceil),
        "exclusive": Attr.b(True),
    }


def _pool_attrs(
    mode: int, glob: bool, window: tuple[int, ...], stride: tuple[int, ...], pad: tuple[int, ...], ceil: int
) -> dict[str, Attr]:
    return {
        "mode": Attr.i(mode),
        "global_pooling": Attr.b(glob),
        "window": Attr.li(window),
        "stride": Attr.li(stride),
        "pad": Attr.li(pad),
        "dilation": Attr.li((1, 1, 1, 1)),
        "ceil_mode": Attr.i(ceil),
        "data_format": Attr.s("NCHW"),
    }


def _gemm_reason(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if (reason := canonical_gemm_reason(node)) is not None:
        return reason
    if x.type.rank != 2:
        return "only a Gemm with a 2-D input maps to FullyConnection"
    return None


@lowering("Gemm", check=_gemm_reason)
def _gemm(low: Lowerer, node: Node) -> None:
    a = node.attrs
    ins = low.g.inputs_of(node)
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    assert x is not None and w is not None
    n_out = w.type.static_shape[0 if a.transB else 1]
    attrs = fc_attrs(n_out, a.transB)
    low.chain(node, [low.ref_of(x)], [Step("FullyConnection", [low.ref_of(w), low.ref_of(b)], attrs)])


def _batchnorm_reason(graph: Graph, node: Node) -> str | None:
    if node.attrs.training_mode:
        return "training-mode batch normalization has no CANN inference op"
    return None


@lowering("BatchNormalization", check=_batchnorm_reason)
def _batchnorm(low: Lowerer, node: Node) -> None:
    a = node.attrs
    x, scale, bias, mean, var = low.g.inputs_of(node)
    assert x is not None
    dt = x.type.dtype.numpy
    momentum = low.const(np.array(1.0, dt), f"{low.g.value(node).name}/momentum")
    inputs = [low.ref_of(v) for v in (x, mean, var)] + [momentum] + [low.ref_of(v) for v in (scale, bias)]
    attrs = {"epsilon": Attr.f(a.epsilon), "use_global_stats": Attr.b(True), "mode": Attr.i(1)}
    low.chain(node, inputs, [Step("BNInference", [], attrs)])


@lowering("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(low: Lowerer, node: Node) -> None:
    x = low.g.inputs_of(node)[0]
    assert x is not None
    out = low.g.value(node)
    shape = low.desc(out.type, node).shape
    c = low.const(np.array(shape, np.int64), f"{out.name}/shape")
    low.chain(node, [low.ref_of(x), c], [Step("Reshape", [], {"axis": Attr.i(0), "num_axes": Attr.i(-1)})])


@lowering("Transpose")
def _transpose(low: Lowerer, node: Node) -> None:
    x = low.g.inputs_of(node)[0]
    assert x is not None and x.type.rank is not None
    perm = node.attrs.perm if node.attrs.perm is not None else tuple(reversed(range(x.type.rank)))
    low.chain(node, [low.ref_of(x)], [Step("TransposeD", [], {"perm": Attr.li(perm)})])


@lowering("Concat")
def _concat(low: Lowerer, node: Node) -> None:
    n = len(low.g.inputs_of(node))
    low.simple(node, SIMPLE_BY_KILN["Concat"], {"N": Attr.i(n)})


@lowering("Clip")
def _clip(low: Lowerer, node: Node) -> None:
    ins = list(low.g.inputs_of(node)) + [None, None]
    x = ins[0]
    assert x is not None
    dt = x.type.dtype.numpy
    info = np.finfo(dt) if np.issubdtype(dt, np.floating) else np.iinfo(dt)
    base = low.g.value(node).name
    refs = [low.ref_of(x)]
    for v, extreme, tag in ((ins[1], -np.inf, "min"), (ins[2], np.inf, "max")):
        if v is not None:
            refs.append(low.ref_of(v))
        else:
            bound = extreme if np.issubdtype(dt, np.floating) else (info.min if tag == "min" else info.max)
            refs.append(low.const(np.array(bound, dt), f"{base}/ClipByValue/{tag}"))
    low.chain(node, refs, [Step("ClipByValue", [], {})])


def _layer_norm_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    x = ins[0]
    assert x is not None and x.type.rank is not None
    if x.type.dtype is not DType.FLOAT32:
        return f"dtype {x.type.dtype.name} (Kiln writes LayerNorm for float32 only)"
    inv = graph.value(node, 2) if node.num_outputs > 2 else None
    if inv is not None and (
        graph.users(inv) or any((o.node, o.port) == (inv.node, 2) for o in graph.outputs)
    ):
        return "InvStdDev is read (GE's LayerNorm gives the variance instead)"
    axis = normalize_axis(node.attrs.axis, x.type.rank)
    want = x.type.static_shape[axis:] if x.type.is_static else None
    for v, what in ((ins[1], "scale"), (ins[2] if len(ins) > 2 else None, "bias")):
        if v is not None and v.type.shape != want and v.const is None:
            return (
                f"{what} of shape {v.type} is broadcast and not constant (GE's gamma/beta are x.shape[axis:])"
            )
    return None


@lowering("LayerNormalization", check=_layer_norm_reason, multi_output=True)
def _layer_norm(low: Lowerer, node: Node) -> None:
    """``LayerNormalization`` -> ``LayerNorm(x, gamma, beta)`` with ``begin_norm_axis`` =
    ``begin_params_axis`` = axis and ``epsilon``; outputs y, mean, variance (ONNX's Mean is GE's
    mean; InvStdDev is refused). A broadcast constant scale/bias is expanded, an absent bias is 0."""
    ins = list(low.g.inputs_of(node)) + [None]
    x = ins[0]
    assert x is not None and x.type.rank is not None
    shape = x.type.static_shape
    axis = normalize_axis(node.attrs.axis, x.type.rank)
    name = low.g.value(node).name
    params = []
    for v, what in ((ins[1], "gamma"), (ins[2], "beta")):
        if v is not None and v.type.shape == shape[axis:]:
            params.append(low.ref_of(v))
        else:
            c = np.zeros((), np.float32) if v is None else v.const
            assert c is not None  # checked: a broadcast scale/bias is constant
            arr = np.broadcast_to(c, shape[axis:])
            params.append(low.const(np.ascontiguousarray(arr), f"{name}/{what}"))
    stats = TensorDesc(DType.FLOAT32, (*shape[:axis], *(1,) * (len(shape) - axis)), format_for(len(shape)))
    attrs = {
        "begin_norm_axis": Attr.i(axis),
        "begin_params_axis": Attr.i(axis),
        "epsilon": Attr.f(node.attrs.epsilon),
    }
    low.emit(name, "LayerNorm", [low.ref_of(x), *params], [low.desc(x.type, node), stats, stats], attrs)
    for port in range(min(node.num_outputs, 2)):
        low.bind(node, f"{name}:{port}", port)


def _conv_transpose_reason(graph: Graph, node: Node) -> str | None:
    w = graph.inputs_of(node)[1]
    assert w is not None
    a = node.attrs
    if w.type.rank != 4:
        return f"only 2-D transposed convolutions map to Conv2DTranspose (weight {w.type})"
    if a.auto_pad not in ("NOTSET", "") or a.output_shape:
        return "auto_pad / output_shape (run the default pipeline to make pads explicit)"
    return None


@lowering("ConvTranspose", check=_conv_transpose_reason)
def _conv_transpose(low: Lowerer, node: Node) -> None:
    """``ConvTranspose`` -> ``Conv2DTranspose(input_size, x, filter[, bias])``: input_size an int32
    Const of the NCHW output shape, the filter in ONNX's [C_in, C_out/group, kH, kW] (NCHW), pads
    [top, bottom, left, right], 4-element strides, dilations and output_padding."""
    ins = list(low.g.inputs_of(node)) + [None]
    x, w, b = ins[0], ins[1], ins[2]
    assert x is not None and w is not None
    a = node.attrs
    out = low.g.value(node)
    size = low.int_const(out.type.static_shape, f"{out.name}/input_size", np.int32)
    pads = tuple(a.pads) or (0, 0, 0, 0)
    attrs = {
        "strides": Attr.li((1, 1, *(tuple(a.strides) or (1, 1)))),
        "pads": Attr.li((pads[0], pads[2], pads[1], pads[3])),
        "dilations": Attr.li((1, 1, *(tuple(a.dilations) or (1, 1)))),
        "groups": Attr.i(a.group),
        "data_format": Attr.s("NCHW"),
        "output_padding": Attr.li((0, 0, *(tuple(a.output_padding) or (0, 0)))),
        "offset_x": Attr.i(0),
    }
    inputs = [size, low.ref_of(x), low.ref_of(w)] + ([low.ref_of(b)] if b is not None else [])
    low.chain(node, inputs, [Step("Conv2DTranspose", [], attrs)])
