"""Activations and unary math: ReLU, ReLU6/Clip, LeakyRelu, Sigmoid, Tanh, HardSwish,
HardSigmoid, Elu, PRelu and the UnaryOp family (Exp, Sqrt, ...).

Kiln's fused-activation names (``compiler.ops.fused.ACTIVATIONS``) map to MNN as:

=============  ====================================================================
relu           ReLU{slope 0} (or ``Convolution2DCommon.relu`` when fused into a conv)
relu6          ReLU6{0, 6}  (or ``Convolution2DCommon.relu6``)
clip(a, b)     ReLU6{minValue a, maxValue b} (MNN uses ReLU6 as a general clip)
leaky_relu(a)  ReLU{slope a}
sigmoid/tanh   UnaryOp SIGMOID / TANH
hard_swish     UnaryOp HARDSWISH: x * relu6(x + 3) / 6
hard_sigmoid   BinaryOp MUL a, BinaryOp ADD b, ReLU6{0, 1}: clip(a x + b, 0, 1)
=============  ====================================================================

All of them keep the layout of their input. On a fully connected layer's output they run on its
packed [P, N, 1, 1] NC4HW4 form and keep it (``LowerContext.rows_view``), so the next fully connected
layer reads it without a layout copy; a ReLU / ReLU6 there then becomes the conv's own
``relu`` / ``relu6`` flag (:func:`backends.mnn.lower.fuse_conv_act.fuse_conv_activation`).

Gelu (erf form) has its own lowering (:mod:`backends.mnn.lower.gelu`, a sigmoid of a rational
function; ``mnn-fuse-gelu`` finds the erf pattern); the ``gelu-tanh`` decomposition writes the tanh
form (Mul, UnaryOp TANH, Add, Mul). MNN 3.6.1's native forms are either slow or inexact:

* UnaryOp GELU_STANDARD (erf form) computes ``(erf(x * 0.70710679) + 1) * x * 0.5`` with the
  double-precision erf, one element at a time: accurate (max abs 4.8e-7 against onnxruntime
  over [-12, 12]), but 3.1x slower than the erf decomposition (observed, 1 thread, a [1, 197, 1536]
  tensor as in ViT-Tiny's MLP: 6.1 ms against 2.0 ms);
* UnaryOp GELU (tanh form; also what MNN's converter writes for the erf form) replaces tanh by a
  [7/6] Padé fraction clipped at |v| > 5, whose 1 + tanh(v) loses all precision for x in about
  [-5, -3] (observed: x = -3.792 gives -4.5e-7 against onnxruntime's -1.82e-4, an absolute
  error of 1.8e-4). The converter's files are faster on GELU models for that reason (bert:
  max rel 5.8e-4 against onnxruntime, over Kiln's fp32 tolerance).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node
from compiler.ops.fused import activation_of
from schemas.mnn.schema import fb

__all__ = ["emit_activation", "LOWERINGS", "UNARY_OPS"]

_F32_MAX = float(np.finfo(np.float32).max)

UNARY_OPS: dict[str, int] = {
    "Abs": fb.UnaryOpOperation.ABS,
    "Neg": fb.UnaryOpOperation.NEG,
    "Floor": fb.UnaryOpOperation.FLOOR,
    "Ceil": fb.UnaryOpOperation.CEIL,
    "Sqrt": fb.UnaryOpOperation.SQRT,
    "Exp": fb.UnaryOpOperation.EXP,
    "Log": fb.UnaryOpOperation.LOG,
    "Reciprocal": fb.UnaryOpOperation.RECIPROCAL,
    "Erf": fb.UnaryOpOperation.ERF,
    "Sign": fb.UnaryOpOperation.SIGN,
    # (no Round: MNN 3.6.1's UnaryOp ROUND rounds halves away from zero, ONNX's Round to even;
    # observed: -2.5 -> -3, 0.5 -> 1 against -2, 0)
    "Sin": fb.UnaryOpOperation.SIN,
    "Cos": fb.UnaryOpOperation.COS,
    "Sigmoid": fb.UnaryOpOperation.SIGMOID,
    "Tanh": fb.UnaryOpOperation.TANH,
    "HardSwish": fb.UnaryOpOperation.HARDSWISH,
}
# f(0) is infinite: the packed form's zero channel padding would reach the next conv as inf * 0
_INF_AT_ZERO = frozenset({"Log", "Reciprocal"})
_ACT_UNARY = {"sigmoid": "Sigmoid", "tanh": "Tanh", "hard_swish": "HardSwish"}


def _relu6(lo: float, hi: float) -> Table:
    lo, hi = max(lo, -_F32_MAX), min(hi, _F32_MAX)
    return Table("Relu6", {"minValue": lo, "maxValue": hi}, force=frozenset({"minValue", "maxValue"}))


def _unary(kind: int) -> Table:
    return Table("UnaryOp", {"opType": kind, "T": fb.DataType.DT_FLOAT}, force=frozenset({"opType"}))


def emit_activation(
    ctx: LowerContext, act: str, alpha: float, beta: float, x: int, out: int, fmt: Format, name: str
) -> None:
    """Emit ``out = act(x)`` (tensors ``x`` and ``out`` in layout ``fmt``)."""
    if act == "relu":
        ctx.emit("ReLU", name, [x], [out], Table("Relu", {"slope": 0.0}))
    elif act == "leaky_relu":
        ctx.emit("ReLU", name, [x], [out], Table("Relu", {"slope": float(alpha)}))
    elif act == "relu6":
        ctx.emit("ReLU6", name, [x], [out], _relu6(0.0, 6.0))
    elif act == "clip":
        ctx.emit("ReLU6", name, [x], [out], _relu6(float(alpha), float(beta)))
    elif act in _ACT_UNARY:
        ctx.emit("UnaryOp", name, [x], [out], _unary(UNARY_OPS[_ACT_UNARY[act]]))
    elif act == "hard_sigmoid":
        scaled = ctx.temp(f"{name}__scaled")
        shifted = ctx.temp(f"{name}__shifted")
        a = ctx.const_tensor(np.array(alpha, np.float32), f"{name}__alpha")
        b = ctx.const_tensor(np.array(beta, np.float32), f"{name}__beta")
        ctx.emit("BinaryOp", f"{name}__mul", [x, a], [scaled], _binary(fb.BinaryOpOperation.MUL))
        ctx.emit("BinaryOp", f"{name}__add", [scaled, b], [shifted], _binary(fb.BinaryOpOperation.ADD))
        ctx.emit("ReLU6", name, [shifted], [out], _relu6(0.0, 1.0))
    elif act == "elu":
        ctx.emit("ELU", name, [x], [out], Table("ELU", {"alpha": float(alpha)}))
    else:
        raise KeyError(f"no MNN lowering for activation {act!r}")


SUPPORTED_ACTIVATIONS = frozenset({"relu", "leaky_relu", "relu6", "clip", "hard_sigmoid", "elu", *_ACT_UNARY})


def _binary(kind: int) -> Table:
    return Table("BinaryOp", {"opType": kind, "T": fb.DataType.DT_FLOAT}, force=frozenset({"opType"}))


def _activation(node: Node, graph: Graph) -> tuple[str, float, float] | None:
    if node.op == "Elu":
        return ("elu", float(node.attrs.alpha), 0.0)
    return activation_of(node, graph)


def _check_activation(graph: Graph, node: Node) -> str | None:
    act = _activation(node, graph)
    if act is None:
        return "bounds must be constant"
    if not node.output_types[0].dtype.is_float:
        return "float tensors only"
    return None


def _packed_rows(ctx: LowerContext, node: Node) -> int | None:
    """The packed [P, N, 1, 1] form of the input when it has one (a fully connected layer's output)."""
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    if ctx.int8_form or node.op in _INF_AT_ZERO or ctx.shape(x_value) != ctx.shape(ctx.graph.value(node)):
        return None
    return ctx.rows_view(x_value)


def _lower_elementwise(ctx: LowerContext, node: Node, emit: Callable[[int, int, Format, str], None]) -> None:
    """``emit(x, out, fmt, name)`` on the input's packed rows when it has them, else in its layout."""
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    value = ctx.graph.value(node)
    name = ctx.op_name(node)
    rows = _packed_rows(ctx, node)
    if rows is not None:
        packed = ctx.temp(f"{value.name}__rows")
        emit(rows, packed, Format.NC4HW4, f"{name}__rows")
        ctx.define_rows(value, packed, name)
        return
    fmt = ctx.format_of(x_value)
    x = ctx.tensor(x_value, fmt)
    emit(x, ctx.define(value, fmt), fmt, name)


def _lower_activation(ctx: LowerContext, node: Node) -> None:
    act = _activation(node, ctx.graph)
    assert act is not None

    def emit(x: int, out: int, fmt: Format, name: str) -> None:
        emit_activation(ctx, act[0], act[1], act[2], x, out, fmt, name)

    _lower_elementwise(ctx, node, emit)


def _lower_unary(ctx: LowerContext, node: Node) -> None:
    def emit(x: int, out: int, fmt: Format, name: str) -> None:
        ctx.emit("UnaryOp", name, [x], [out], _unary(UNARY_OPS[node.op]))

    _lower_elementwise(ctx, node, emit)


def _check_unary(graph: Graph, node: Node) -> str | None:
    return None if node.output_types[0].dtype.is_float else "float tensors only"


def _check_prelu(graph: Graph, node: Node) -> str | None:
    x, slope = graph.inputs_of(node)
    assert x is not None and slope is not None
    s = slope.const
    if s is None:
        return "slope must be constant"
    shape = x.type.static_shape
    if len(shape) != 4:
        return "4-D input only"
    per_channel = s.size == shape[1] and np.broadcast_shapes(s.shape, (1, shape[1], 1, 1)) == (
        1,
        shape[1],
        1,
        1,
    )
    if s.size != 1 and not per_channel:
        return "slope must be per channel or a scalar"
    return None


def _lower_prelu(ctx: LowerContext, node: Node) -> None:
    x_value, slope_value = ctx.graph.inputs_of(node)
    assert x_value is not None and slope_value is not None and slope_value.const is not None
    channels = ctx.shape(x_value)[1]
    slope = np.broadcast_to(slope_value.const.astype(np.float32).reshape(-1), (channels,)).copy()
    x = ctx.tensor(x_value, Format.NC4HW4)
    out = ctx.define(ctx.graph.value(node), Format.NC4HW4)
    param = Table("PRelu", {"slopeCount": channels, "slope": slope})
    ctx.emit("PReLU", ctx.op_name(node), [x], [out], param)


LOWERINGS: dict[str, Lowering] = {
    **{
        op: Lowering(_lower_activation, _check_activation)
        for op in ("Relu", "LeakyRelu", "kiln::Relu6", "Clip", "HardSigmoid", "Elu")
    },
    **{op: Lowering(_lower_unary, _check_unary) for op in UNARY_OPS},
    "PRelu": Lowering(_lower_prelu, _check_prelu),
}
