"""fuse-conv-bias-act: fold a following bias and activation into one fused conv.

* conv(x, W, b) + c = conv(x, W, b + c) for a per-channel constant c.
* act(conv(x, W, b)) = FusedConv(x, W, b){act} for act in the ACTIVATIONS table
  (Relu, Relu6, Clip(lo, hi), LeakyRelu, Sigmoid, HardSigmoid, HardSwish, Tanh).
* With ``residual=True``: act(conv(x, W, b) + z) = FusedConv(x, W, b, z){act}
  for a non-constant z of the conv output's type.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.fused import KILN, FusedConvAttrs, activation_of
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Const, Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["FuseConvBiasAct"]

_ACT_OPS = ("Relu", "Sigmoid", "Tanh", "HardSwish", "LeakyRelu", "HardSigmoid", "Clip")


def _fused_attrs(
    conv: Node, activation: str = "none", alpha: float = 0.0, beta: float = 0.0
) -> FusedConvAttrs:
    a = conv.attrs
    base = {
        f.name: getattr(a, f.name)
        for f in dataclasses.fields(a)
        if f.name in FusedConvAttrs.__dataclass_fields__
    }
    if activation != "none":
        base.update(activation=activation, alpha=alpha, beta=beta)
    return FusedConvAttrs(**base)


def _per_channel(c: np.ndarray, out_rank: int, channels: int) -> np.ndarray | None:
    """``c`` as a [C] vector if it broadcasts only along the channel axis of an NC... tensor."""
    if c.ndim > out_rank:
        return None
    full = (1,) * (out_rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(full) if i != 1):
        return None
    if full[1] not in (1, channels):
        return None
    return np.broadcast_to(c.reshape(-1), (channels,))


class ConvAddBias(Rule):
    """conv(x, W, b) + c = conv(x, W, b + c) for per-channel constant c."""

    name = "conv-add-bias"
    pattern = Op(
        "Add",
        (Op("Conv", (Any_("x"), Const("w"), Const("b", optional=True)), name="conv"), Const("c")),
        commutative=True,
    )

    def check(self, graph: Graph, m: Match) -> str | None:
        out = m.node("conv").output_types[0]
        c = m.const("c")
        assert c is not None
        shape = out.shape
        if shape is None or len(shape) < 2 or not isinstance(shape[1], int):
            return "conv output channels are unknown"
        if _per_channel(c, len(shape), shape[1]) is None:
            return f"addend of shape {list(c.shape)} is not per-channel"
        if m.root.output_types[0] != out:
            return "the Add broadcasts beyond the conv output"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        conv = m.node("conv")
        out = conv.output_types[0]
        channels = int(out.static_shape[1])
        addend = m.const("c")
        assert addend is not None
        c = _per_channel(addend, out.rank or 0, channels)
        assert c is not None
        b = m.const("b")
        bias = (c.astype(np.float64) + (0.0 if b is None else b.astype(np.float64))).astype(out.dtype.numpy)
        new = rw.op(
            "Conv",
            [m.value("x"), m.value("w"), rw.const(bias, f"{conv.name or 'conv'}_bias")],
            conv.attrs,
            like=conv,
        )
        rw.replace(rw.graph.value(m.root), new, take_name=True)


class _ActRule(Rule):
    """act(conv(x, W, b)) = FusedConv(x, W, b){act}."""

    def check(self, graph: Graph, m: Match) -> str | None:
        if activation_of(m.root, graph) is None:
            return "activation parameters are not constant scalars"
        conv = m.node("conv")
        if conv.domain == KILN and conv.attrs.activation != "none":
            return "the conv already has an activation"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        act = activation_of(m.root, rw.graph)
        assert act is not None
        conv = m.node("conv")
        ins = [v for v in rw.graph.inputs_of(conv)]
        new = rw.op("FusedConv", ins, _fused_attrs(conv, *act), domain=KILN, like=conv)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


class ConvAct(_ActRule):
    """ONNX activation after Conv or FusedConv."""

    name = "conv-act"
    pattern = Op(_ACT_OPS, (Op(("Conv",), name="conv"),))


class FusedConvAct(_ActRule):
    """ONNX activation after a FusedConv without activation."""

    name = "fusedconv-act"
    pattern = Op(_ACT_OPS, (Op(("FusedConv",), name="conv", domain=KILN),))


class ConvRelu6(_ActRule):
    """kiln::Relu6 after Conv."""

    name = "conv-relu6"
    pattern = Op("Relu6", (Op(("Conv",), name="conv"),), domain=KILN)


class ConvResidual(Rule):
    """conv(x, W, b) + z = FusedConv(x, W, b, z) for non-constant z of the same type."""

    name = "conv-residual"
    pattern = Op("Add", (Op(("Conv",), name="conv"), Any_("z")), commutative=True)

    def check(self, graph: Graph, m: Match) -> str | None:
        z: Value = m.value("z")
        if z.const is not None:
            return "addend is a constant (a bias, not a residual)"
        if z.type != m.node("conv").output_types[0]:
            return "residual type differs from the conv output"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        conv = m.node("conv")
        ins = rw.graph.inputs_of(conv)
        ins = [*ins, *([None] * (3 - len(ins)))]
        new = rw.op("FusedConv", [*ins, m.value("z")], _fused_attrs(conv), domain=KILN, like=conv)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


@register_pass
@dataclass(frozen=True)
class FuseConvBiasAct(Pass):
    """Fuse Conv + bias + activation (and optionally a residual Add) into kiln::FusedConv."""

    name = "fuse-conv-bias-act"
    residual: bool = False

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        result = apply_rules(graph, [ConvAddBias()], near_misses=ctx.near_misses)
        if self.residual:
            result.merge(apply_rules(graph, [ConvResidual()], near_misses=ctx.near_misses))
        result.merge(
            apply_rules(graph, [ConvAct(), FusedConvAct(), ConvRelu6()], near_misses=ctx.near_misses)
        )
        return result
