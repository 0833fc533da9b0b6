"""canonicalize: rewrite decomposed activations and affine ops into their canonical single ops.

Rules, applied in priority order (larger patterns first, so a hard-swish is never
split into a hard-sigmoid or a relu6 before it can match):

0. sub-to-add: x - c = x + (-c) (bit-exact: IEEE subtraction is addition of the negation); first,
   so that x - (-3) is seen as x + 3 by the rules below.
1. hard-swish: x * Clip(x + 3, 0, 6) / 6 = HardSwish(x), in every association
   x * (g / 6), (x * g) / 6, x * (g * 1/6), (x * g) * 1/6 with g = Clip(x + 3, 0, 6)
   or kiln::Relu6(x + 3); and x * HardSigmoid(x; alpha=1/6, beta=1/2) = HardSwish(x).
2. hard-sigmoid: Clip(x + 3, 0, 6) / 6 = Clip(x + 3, 0, 6) * 1/6 = HardSigmoid(x; 1/6, 1/2).
3. relu6: Clip(x, 0, 6) = kiln::Relu6(x); Clip(x, 0, +inf) = Clip(x, 0, _) = Relu(x).
   gemm: MatMul(x, W) + b = Gemm(x, W, b) for 2-D x, constant 2-D W and constant b of shape
   [N] or [1, N].
   div-to-mul: x / c = x * (1/c) only when every c is a power of two, where 1/c is exact and
   both sides round the same real number; for other c the product can differ by one ulp,
   so those divisions stay.

Constants may be scalars or shape-[1] arrays; the 1/6 factor is accepted within 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph
from compiler.ops.fused import KILN, activation_of
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Const, Match, Op, Rule, apply_rules, scalar
from compiler.rewriter import PassResult, Rewriter

__all__ = ["Canonicalize", "PHASES", "exact_reciprocal"]

SIXTH_TOL = 1e-6


def _gates() -> list[Op]:
    """g = Clip(x2 + 3, lo, hi) and g = kiln::Relu6(x2 + 3); x2 must later equal x."""
    shifted = Op("Add", (Any_("x2"), Const("three")), name="add", commutative=True)
    return [
        Op("Clip", (shifted, Any_("lo", optional=True), Any_("hi", optional=True)), name="gate"),
        Op("Relu6", (shifted,), name="gate", domain=KILN),
    ]


def _const_reason(m: Match, name: str, want: float, tol: float, what: str) -> str | None:
    """None if constant ``name`` is one value equal to ``want`` (within ``tol``), else why not."""
    v = scalar(m.const(name))
    if v is None:
        return f"{what} is not a single value"
    return None if abs(float(v) - want) <= tol else f"{what} is {v}, not {want:g}"


def _gate_reason(graph: Graph, m: Match) -> str | None:
    """Why ``Clip(x2 + 3, 0, 6)`` (or Relu6(x2 + 3)) bound in ``m`` is not the hard-sigmoid core."""
    x = m.value("x2")
    if not x.type.dtype.is_float:
        return "x is not float"
    reason = _const_reason(m, "three", 3.0, 0.0, "the Add constant")
    if reason:
        return reason
    gate = m.node("gate")
    if gate.op == "Clip":
        lo, hi = m.values.get("lo"), m.values.get("hi")
        if lo is None or hi is None:
            return "Clip has no min or no max"
        if lo.const is None or hi.const is None:
            return "Clip bounds are not constant"
        lv, hv = scalar(lo.const), scalar(hi.const)
        if lv is None or hv is None:
            return "Clip bounds are not single values"
        if (lv, hv) != (0, 6):
            return f"Clip bounds are ({lv:g}, {hv:g}), not (0, 6)"
    if m.root.output_types[0] != x.type:
        return "the constants broadcast x to another shape"
    return None


def _scale_reason(m: Match) -> str | None:
    """Check the final / 6 or * 1/6 of a hard-sigmoid core."""
    if "six" in m.consts:
        return _const_reason(m, "six", 6.0, 0.0, "the divisor")
    return _const_reason(m, "sixth", 1.0 / 6.0, SIXTH_TOL, "the factor")


class HardSwish(Rule):
    """x * Clip(x + 3, 0, 6) / 6 = HardSwish(x) (one instance per association and gate)."""

    name = "hard-swish"

    def __init__(self, pattern: Op) -> None:
        self.pattern = pattern

    def check(self, graph: Graph, m: Match) -> str | None:
        if m.value("x") != m.value("x2"):
            return "x is used with different values"
        if "hsig" in m.nodes:
            a = m.node("hsig").attrs
            if abs(a.alpha - 1.0 / 6.0) > SIXTH_TOL or a.beta != 0.5:
                return f"HardSigmoid has alpha={a.alpha:g}, beta={a.beta:g}, not 1/6, 0.5"
            return None if m.root.output_types[0] == m.value("x").type else "x is broadcast"
        return _gate_reason(graph, m) or _scale_reason(m)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        new = rw.op("HardSwish", [m.value("x")], like=m.root)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


class HardSigmoid(Rule):
    """Clip(x + 3, 0, 6) / 6 = HardSigmoid(x; alpha=1/6, beta=1/2)."""

    name = "hard-sigmoid"

    def __init__(self, pattern: Op) -> None:
        self.pattern = pattern

    def check(self, graph: Graph, m: Match) -> str | None:
        return _gate_reason(graph, m) or _scale_reason(m)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        new = rw.op("HardSigmoid", [m.value("x2")], {"alpha": 1.0 / 6.0, "beta": 0.5}, like=m.root)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


def _hard_swish_patterns() -> list[Op]:
    x = Any_("x")
    out = []
    for g in _gates():
        out += [
            Op("Mul", (x, Op("Div", (g, Const("six")), name="scale")), commutative=True),
            Op("Mul", (x, Op("Mul", (g, Const("sixth")), name="scale", commutative=True)), commutative=True),
            Op("Div", (Op("Mul", (x, g), name="prod", commutative=True), Const("six"))),
            Op("Mul", (Op("Mul", (x, g), name="prod", commutative=True), Const("sixth")), commutative=True),
        ]
    hsig = Op("HardSigmoid", (Any_("x2"),), name="hsig")
    return [*out, Op("Mul", (x, hsig), commutative=True)]


def _hard_sigmoid_patterns() -> list[Op]:
    out = []
    for g in _gates():
        out += [Op("Div", (g, Const("six"))), Op("Mul", (g, Const("sixth")), commutative=True)]
    return out


class ClipToRelu(Rule):
    """Clip(x, 0, 6) = kiln::Relu6(x); Clip(x, 0, +inf) = Clip(x, 0, _) = Relu(x)."""

    name = "relu6"
    pattern = Op("Clip", (Any_("x"), Any_("lo", optional=True), Any_("hi", optional=True)))

    def check(self, graph: Graph, m: Match) -> str | None:
        if not m.value("x").type.dtype.is_float:
            return "x is not float"
        act = activation_of(m.root, graph)
        if act is None:
            return "Clip bounds are not constant"
        if act[0] == "clip":
            return f"Clip bounds ({act[1]:g}, {act[2]:g}) are neither (0, 6) nor (0, inf)"
        return None if m.root.output_types[0] == m.value("x").type else "the bounds broadcast x"

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        act = activation_of(m.root, rw.graph)
        assert act is not None
        x = m.value("x")
        if act[0] == "relu6":
            new = rw.op("Relu6", [x], domain=KILN, like=m.root)
        else:
            new = rw.op("Relu", [x], like=m.root)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


class MatMulAddToGemm(Rule):
    """MatMul(x, W) + b = Gemm(x, W, b) for 2-D x, constant 2-D W and constant b of shape [N] or [1, N]."""

    name = "gemm"
    pattern = Op("Add", (Op("MatMul", (Any_("x"), Any_("w")), name="matmul"), Any_("b")), commutative=True)

    def check(self, graph: Graph, m: Match) -> str | None:
        w, b, x = m.value("w").const, m.value("b").const, m.value("x")
        if not x.type.dtype.is_float:
            return "MatMul is not float"
        if w is None:
            return "W is not constant"
        if w.ndim != 2:
            return f"W is {w.ndim}-D, not 2-D"
        if x.type.rank != 2:
            return "input is not 2-D"
        if b is None:
            return "b is not constant"
        n = w.shape[1]
        if b.ndim > 2 or any(d != 1 for d in b.shape[:-1]) or (b.ndim and b.shape[-1] not in (1, n)):
            return f"b of shape {list(b.shape)} does not broadcast to [{n}]"
        same = m.root.output_types[0] == m.node("matmul").output_types[0]
        return None if same else "b broadcasts the output"

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        new = rw.op("Gemm", [m.value("x"), m.value("w"), m.value("b")], like=m.root)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


class SubToAdd(Rule):
    """x - c = x + (-c) for a constant float c (bit-exact)."""

    name = "sub-to-add"
    pattern = Op("Sub", (Any_("x"), Any_("c")))

    def check(self, graph: Graph, m: Match) -> str | None:
        c = m.value("c").const
        if c is None:
            return "c is not constant"
        if not m.value("x").type.dtype.is_float:
            return "Sub is not float (integer negation can overflow)"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        c = m.value("c").const
        assert c is not None
        neg = rw.const(np.negative(c), f"{m.value('c').name}_neg")
        rw.replace(rw.graph.value(m.root), rw.op("Add", [m.value("x"), neg], like=m.root), take_name=True)


def exact_reciprocal(c: np.ndarray) -> np.ndarray | None:
    """1/c in c's dtype if every element is a power of two whose reciprocal is representable, else None."""
    c64 = c.astype(np.float64)
    if c.size == 0 or not np.all(np.isfinite(c64)) or np.any(c64 == 0):
        return None
    mantissa, _ = np.frexp(c64)
    if not np.all(np.abs(mantissa) == 0.5):
        return None
    with np.errstate(over="ignore"):
        r = (1.0 / c64).astype(c.dtype)
    return r if np.all(r.astype(np.float64) * c64 == 1.0) else None


class DivToMul(Rule):
    """x / c = x * (1/c) for a constant float c whose elements are all powers of two (bit-exact)."""

    name = "div-to-mul"
    pattern = Op("Div", (Any_("x"), Any_("c")))

    def check(self, graph: Graph, m: Match) -> str | None:
        c = m.value("c").const
        if c is None:
            return "divisor is not constant"
        if not m.value("x").type.dtype.is_float:
            return "Div is not float"
        if exact_reciprocal(c) is None:
            return "divisor is not a power of two (x * (1/c) would not be bit-exact)"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        c = m.value("c").const
        assert c is not None
        r = exact_reciprocal(c)
        assert r is not None
        inv = rw.const(r, f"{m.value('c').name}_inv")
        rw.replace(rw.graph.value(m.root), rw.op("Mul", [m.value("x"), inv], like=m.root), take_name=True)


PHASES: list[list[Rule]] = [
    [SubToAdd()],
    [HardSwish(p) for p in _hard_swish_patterns()],
    [HardSigmoid(p) for p in _hard_sigmoid_patterns()],
    [ClipToRelu(), MatMulAddToGemm(), DivToMul()],
]
"""Rule lists applied one after the other: each phase runs to its own fixed point first."""


@register_pass
@dataclass(frozen=True)
class Canonicalize(Pass):
    """Fuse decomposed hard-swish/hard-sigmoid/relu6 and MatMul+Add; normalize Sub and Div by constants."""

    name = "canonicalize"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        result = PassResult()
        for rules in PHASES:
            result.merge(apply_rules(graph, rules, near_misses=ctx.near_misses))
        return result
