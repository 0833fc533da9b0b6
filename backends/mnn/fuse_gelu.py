"""mnn-fuse-gelu: recognize the erf form of GELU as one Gelu node, for the MNN writer's own lowering.

    x * 1/2 * (1 + erf(x / sqrt(2))) = Gelu(x; approximate=none)

in each association of the three factors ((x * p) * 1/2, (x * 1/2) * p, x * (p * 1/2), p = 1 + erf),
and x * p = Gelu(x) * 2 where the 1/2 was folded into the next layer (the 2 goes back into that
layer's weights, L(2 g; W) = L(g; 2 W), exact in float32, where it is a Conv, MatMul or Gemm with a
constant weight that alone reads the product, possibly through reshapes), and with the argument
written as x / sqrt(2) or x * (1/sqrt(2)); the constants must equal sqrt(2), 1/sqrt(2), 1 and 1/2
to float32 rounding (relative 1e-6) and be scalars, and the interior values must have no other users.
MNN's exact erf kernel is scalar and slow; the Gelu lowering (:mod:`backends.mnn.lower.gelu`)
computes the same function with vectorized kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.elementwise import GeluAttrs
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Const, Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["MnnFuseGelu", "RULES"]

_WANT = {"c_div": math.sqrt(2.0), "c_mul": math.sqrt(0.5), "one": 1.0, "half": 0.5}


class ErfGelu(Rule):
    """x * 1/2 * (1 + erf(x / sqrt(2))) -> Gelu(x) (one association and argument form)."""

    def __init__(self, name: str, pattern: Op) -> None:
        self.name = name
        self.pattern = pattern

    def check(self, graph: Graph, m: Match) -> str | None:
        x = m.value("x")
        if not x.type.dtype.is_float:
            return "x is not float"
        if x.type != m.root.output_types[0]:
            return "the constants broadcast x to another shape"
        for key, want in _WANT.items():
            if key not in m.consts:
                continue
            c = m.consts[key]
            if c is None or c.size != 1:
                return f"{key} is not a scalar"
            if not math.isclose(float(np.asarray(c).reshape(-1)[0]), want, rel_tol=1e-6):
                return f"{key} is {float(np.asarray(c).reshape(-1)[0])!r}, not {want!r}"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        gelu = rw.op("Gelu", [m.value("x")], GeluAttrs("none"), like=m.root)
        rw.replace(rw.graph.value(m.root), gelu, take_name=True)


class ErfGeluTwice(ErfGelu):
    """x * (1 + erf(x / sqrt(2))) -> Gelu(x) * 2 (the 1/2 was folded into the next layer).

    Not where the product's only user multiplies it by a scalar constant: that is the whole Gelu,
    which the rules above match at that user.
    """

    def check(self, graph: Graph, m: Match) -> str | None:
        out = graph.value(m.root)
        users = graph.users(out)
        if len(users) == 1 and not graph.is_output(out):
            user = users[0][0]
            ins = graph.inputs_of(user)
            if user.op == "Mul" and any(
                v is not None and v.const is not None and v.const.size == 1 for v in ins
            ):
                return "the product is scaled by a constant (the whole Gelu matches there)"
        return super().check(graph, m)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        x = m.value("x")
        graph = rw.graph
        out = graph.value(m.root)
        layer = _linear_reader(graph, out)
        if layer is not None:
            w = graph.inputs_of(layer)[1]
            assert w is not None and w.const is not None
            doubled = rw.const(w.const * np.asarray(2, w.const.dtype), f"{w.name}__x2")
            graph.set_input(layer, 1, doubled)
            rw.replace(out, rw.op("Gelu", [x], GeluAttrs("none"), like=m.root), take_name=True)
            return
        gelu = rw.op("Gelu", [x], GeluAttrs("none"), name=f"{m.root.name}__gelu")
        two = rw.const(np.array(2.0, x.type.dtype.numpy), f"{m.root.name}__two")
        rw.replace(out, rw.op("Mul", [gelu, two], like=m.root), take_name=True)


_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})  # pass 2 g through unchanged
_LINEAR = frozenset({("", "Conv"), ("", "MatMul"), ("", "Gemm"), ("kiln", "FusedConv")})


def _linear_reader(graph: Graph, v: Value) -> Node | None:
    """The layer linear in ``v`` that alone reads it (input 0; a constant float weight at 1), or None."""
    while True:
        users = graph.users(v)
        if len(users) != 1 or graph.is_output(v):
            return None
        node, port = users[0]
        if node.op not in _RESHAPES or node.domain or port != 0:
            break
        v = graph.value(node)
    ins = graph.inputs_of(node)
    if (node.domain, node.op) not in _LINEAR or port != 0 or len(ins) < 2 or ins[0] is ins[1]:
        return None
    w = ins[1]
    if w is None or w.const is None or not np.issubdtype(w.const.dtype, np.floating):
        return None
    if node.op == "Gemm" and (node.attrs.transA or node.attrs.alpha != 1.0):
        return None
    return node


def _rules() -> list[Rule]:
    x = Any_("x")
    args = {
        "div": Op("Div", (x, Const("c_div"))),
        "mul": Op("Mul", (x, Const("c_mul")), commutative=True),
    }
    rules: list[Rule] = []
    for form, arg in args.items():
        p = Op("Add", (Op("Erf", (arg,)), Const("one")), commutative=True)
        half = Const("half")
        shapes = {
            "xp-half": Op("Mul", (Op("Mul", (x, p), commutative=True), half), commutative=True),
            "xhalf-p": Op("Mul", (Op("Mul", (x, half), commutative=True), p), commutative=True),
            "x-phalf": Op("Mul", (x, Op("Mul", (p, half), commutative=True)), commutative=True),
        }
        rules += [ErfGelu(f"erf-gelu-{form}-{shape}", pat) for shape, pat in shapes.items()]
        rules.append(ErfGeluTwice(f"erf-gelu-{form}-xp", Op("Mul", (x, p), commutative=True)))
    return rules


RULES: list[Rule] = _rules()


@register_pass
@dataclass(frozen=True)
class MnnFuseGelu(Pass):
    """Fuse x/2 * (1 + erf(x/sqrt(2))) into Gelu(x) (MNN legalization)."""

    name = "mnn-fuse-gelu"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return apply_rules(graph, RULES, near_misses=ctx.near_misses)
