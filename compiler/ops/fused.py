"""Kiln's own fused ops (domain ``kiln``) and the table of fusible activations.

* ``kiln::Relu6``: y = min(max(x, 0), 6).
* ``kiln::FusedConv``: y = act(conv(x, W) + b + z) with an optional residual z.

FusedConv may run in a channel-blocked layout (see ``blocked_layout``): ``layout`` is the
layout of x, ``out_layout`` that of y and z ("" = same as ``layout``). Blocks may differ,
e.g. NCHW3c in and NCHW16c out. W stays OIHW in the IR; ``weight_layout`` only records
the packing the backend applies (e.g. OIHW16i16o). In blocked form
y = act(pack(conv(unpack(x), W) + b) + z): padded output lanes hold act(0 + z_pad).

Each expands back to standard ONNX ops for export, so onnxruntime can check it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.errors import ConversionError
from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import TensorType
from compiler.ops import blocked_layout as bl
from compiler.ops.conv import ConvAttrs
from compiler.ops.registry import (
    InferContext,
    Layout,
    OpDef,
    QuantPolicy,
    QuantSpec,
    get_op,
    register,
    same_as_input,
)

__all__ = ["KILN", "Activation", "ACTIVATIONS", "FusedConvAttrs", "activation_of"]

KILN = "kiln"


@dataclass(frozen=True)
class Activation:
    """A fusible activation: its numpy form and its expansion into ONNX ops.

    ``alpha``/``beta`` carry the parameters: LeakyRelu slope (alpha), HardSigmoid
    (alpha, beta), Clip bounds (alpha = min, beta = max).
    """

    name: str
    apply: Callable[[np.ndarray, float, float], np.ndarray]
    expand: Callable[[Graph, Value, float, float, str], Value]


def _unary(
    op: str, attrs: dict[str, str] | None = None
) -> Callable[[Graph, Value, float, float, str], Value]:
    def expand(g: Graph, x: Value, alpha: float, beta: float, name: str) -> Value:
        a = {k: (alpha if v == "alpha" else beta) for k, v in (attrs or {}).items()}
        return g.value(g.add_node(op, [x], a or None, name=name))

    return expand


def _clip(lo: float | None, hi: float | None) -> Callable[[Graph, Value, float, float, str], Value]:
    def expand(g: Graph, x: Value, alpha: float, beta: float, name: str) -> Value:
        dt = x.type.dtype.numpy
        lo_v = alpha if lo is None else lo
        hi_v = beta if hi is None else hi
        bounds = [
            g.add_constant(np.array(lo_v, dt), f"{name}_min"),
            g.add_constant(np.array(hi_v, dt), f"{name}_max"),
        ]
        return g.value(g.add_node("Clip", [x, *bounds], name=name))

    return expand


def _np(x: np.ndarray, v: float) -> np.ndarray:
    return np.asarray(v, dtype=x.dtype)


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in [
        Activation("relu", lambda x, a, b: np.maximum(x, _np(x, 0)), _unary("Relu")),
        Activation("relu6", lambda x, a, b: np.clip(x, _np(x, 0), _np(x, 6)), _clip(0.0, 6.0)),
        Activation("clip", lambda x, a, b: np.clip(x, _np(x, a), _np(x, b)), _clip(None, None)),
        Activation(
            "leaky_relu",
            lambda x, a, b: np.where(x >= 0, x, x * _np(x, a)),
            _unary("LeakyRelu", {"alpha": "alpha"}),
        ),
        Activation(
            "sigmoid", lambda x, a, b: get_op("Sigmoid").reference([x], None, 1)[0], _unary("Sigmoid")
        ),
        Activation(
            "hard_sigmoid",
            lambda x, a, b: np.clip(x * _np(x, a) + _np(x, b), _np(x, 0), _np(x, 1)),
            _unary("HardSigmoid", {"alpha": "alpha", "beta": "beta"}),
        ),
        Activation(
            "hard_swish",
            lambda x, a, b: get_op("HardSwish").reference([x], None, 1)[0],
            _unary("HardSwish"),
        ),
        Activation("tanh", lambda x, a, b: np.tanh(x), _unary("Tanh")),
    ]
}


def activation_of(node: Node, graph: Graph) -> tuple[str, float, float] | None:
    """If ``node`` is a fusible activation, its (name, alpha, beta); else None."""
    if node.domain == KILN and node.op == "Relu6":
        return ("relu6", 0.0, 6.0)
    if node.domain:
        return None
    if node.op == "Relu":
        return ("relu", 0.0, 0.0)
    if node.op in ("Sigmoid", "Tanh", "HardSwish"):
        return ({"Sigmoid": "sigmoid", "Tanh": "tanh", "HardSwish": "hard_swish"}[node.op], 0.0, 0.0)
    if node.op == "LeakyRelu":
        return ("leaky_relu", float(node.attrs.alpha), 0.0)
    if node.op == "HardSigmoid":
        return ("hard_sigmoid", float(node.attrs.alpha), float(node.attrs.beta))
    if node.op == "Clip":
        ins = graph.inputs_of(node)
        bounds: list[float | None] = []
        for i in (1, 2):
            v = ins[i] if i < len(ins) else None
            if v is None:
                bounds.append(None)
                continue
            c = v.const
            if c is None or c.size != 1:
                return None
            bounds.append(float(c.reshape(())))
        lo = bounds[0] if bounds[0] is not None else float("-inf")
        hi = bounds[1] if bounds[1] is not None else float("inf")
        if lo == 0.0 and hi == float("inf"):
            return ("relu", 0.0, 0.0)
        if lo == 0.0 and hi == 6.0:
            return ("relu6", 0.0, 6.0)
        return ("clip", lo, hi)
    return None


# ------------------------------------------------------------------ kiln::Relu6
def _relu6_expand(g: Graph, node: Node) -> list[Value]:
    x = g.inputs_of(node)[0]
    assert x is not None
    return [ACTIVATIONS["relu6"].expand(g, x, 0.0, 6.0, node.name or node.output_names[0])]


register(
    OpDef(
        "Relu6",
        same_as_input(),
        lambda ins, a, n: [ACTIVATIONS["relu6"].apply(np.asarray(ins[0]), 0.0, 6.0)],
        domain=KILN,
        layout=Layout.AGNOSTIC,
        quant=QuantPolicy.ACTIVATION,
        qspec=QuantSpec(activations=(0,), weight=None, bias=None, shares_output_grid=True),
        expand=_relu6_expand,
        doc="y = min(max(x, 0), 6)",
    )
)


# -------------------------------------------------------------- kiln::FusedConv
@dataclass(frozen=True)
class FusedConvAttrs(ConvAttrs):
    """Conv attributes plus the fused activation, its parameters and the chosen layouts.

    ``layout``: data layout of x; ``out_layout``: of y and the residual ("" = ``layout``);
    ``weight_layout``: the weight packing the backend applies (W itself stays OIHW).
    """

    activation: str = "none"
    alpha: float = 0.0
    beta: float = 0.0
    layout: str = bl.NCHW
    out_layout: str = ""
    weight_layout: str = bl.OIHW

    @property
    def output_layout(self) -> str:
        """The layout of y (and of the residual z)."""
        return self.out_layout or self.layout

    @property
    def is_blocked(self) -> bool:
        """True if x or y is channel-blocked."""
        return bl.is_blocked(self.layout) or bl.is_blocked(self.output_layout)


def _conv_attrs(a: FusedConvAttrs) -> ConvAttrs:
    return ConvAttrs(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ConvAttrs)})


def _in_channels(ctx: InferContext, a: FusedConvAttrs) -> int:
    w = ctx.shape(1)
    if not isinstance(w[1], int):
        raise ctx.fail(f"a blocked conv needs static weight dims, got {w}")
    return int(w[1]) * a.group


def _infer_fused(ctx: InferContext) -> list[TensorType]:
    a: FusedConvAttrs = ctx.attrs
    if a.activation != "none" and a.activation not in ACTIVATIONS:
        raise ctx.fail(f"unknown activation {a.activation!r}")
    types = ctx.types[:3]
    try:
        if a.is_blocked:
            x = ctx.type(0)
            nchw = bl.nchw_shape(ctx.shape(0), a.layout, _in_channels(ctx, a))
            types = [x.with_shape(nchw), *types[1:]]
        sub = dataclasses.replace(ctx, attrs=_conv_attrs(a), types=types, consts=ctx.consts[:3])
        out = get_op("Conv").infer(sub)
        if a.is_blocked:
            shape = out[0].shape
            assert shape is not None
            out = [out[0].with_shape(bl.layout_shape(shape, a.output_layout))]
    except bl.LayoutError as exc:
        raise ctx.fail(str(exc)) from None
    if ctx.has(3) and ctx.type(3) != out[0]:
        raise ctx.fail(f"residual {ctx.type(3)} does not match the conv output {out[0]}")
    return out


def _fused_ref(ins: list[np.ndarray | None], a: FusedConvAttrs, n: int) -> list[np.ndarray]:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    if bl.is_blocked(a.layout):
        x = bl.unpack(x, w.shape[1] * a.group)
    y = get_op("Conv").reference([x, *ins[1:3]], _conv_attrs(a), 1)[0]
    ob = bl.block_of(a.output_layout)
    if ob:
        y = bl.pack(y, ob)
    if len(ins) > 3 and ins[3] is not None:
        y = y + ins[3]
    if a.activation != "none":
        y = ACTIVATIONS[a.activation].apply(y, a.alpha, a.beta)
    return [np.asarray(y, dtype=ins[0].dtype if ins[0] is not None else y.dtype)]


def _fused_expand(g: Graph, node: Node) -> list[Value]:
    a: FusedConvAttrs = node.attrs
    if a.is_blocked:
        raise ConversionError(
            f"{node.describe()}: a FusedConv in layout {a.layout} -> {a.output_layout} has no ONNX form; "
            "only NCHW convs expand to ONNX Conv (run choose-layout only for backends taking blocked layouts)"
        )
    ins = g.inputs_of(node)
    base = node.name or node.output_names[0]
    y = g.value(g.add_node("Conv", ins[:3], _conv_attrs(a), name=base))
    if len(ins) > 3 and ins[3] is not None:
        y = g.value(g.add_node("Add", [y, ins[3]], name=f"{base}_residual"))
    if a.activation != "none":
        y = ACTIVATIONS[a.activation].expand(g, y, a.alpha, a.beta, f"{base}_{a.activation}")
    return [y]


register(
    OpDef(
        "FusedConv",
        _infer_fused,
        _fused_ref,
        FusedConvAttrs,
        domain=KILN,
        inputs=(2, 4),
        layout=Layout.SPATIAL,
        quant=QuantPolicy.WEIGHTED,
        qspec=QuantSpec(activations=(0, 3), weight_axis=lambda attrs, rank: 0),
        expand=_fused_expand,
        doc="y = act(conv(x, W) + b + z); z is an optional residual",
    )
)
