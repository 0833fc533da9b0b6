"""eliminate-identities: remove ops that compute y = x, and cancel inverse pairs.

* Identity(x) = x; Dropout(x) = x at inference; Cast(x: T, to=T) = x.
* Reshape/Flatten/Expand/Squeeze/Tile with out shape == in shape = x.
* Transpose(x, id) = x; Transpose(Transpose(x, p), q) = Transpose(x, p∘q), = x when p∘q = id.
* Reshape(Reshape(x, s1), s2) = Reshape(x, s2).
* Squeeze(Unsqueeze(x, a), a) = x and Unsqueeze(Squeeze(x, a), a) = x.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Const, Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["EliminateIdentities", "RULES"]


def _perm(attrs: object, rank: int) -> list[int]:
    perm = getattr(attrs, "perm", None)
    return list(range(rank))[::-1] if perm is None else [int(p) for p in perm]


class IdentityOp(Rule):
    """Identity(x) = x."""

    name = "identity"
    pattern = Op("Identity", (Any_("x"),))

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        rw.replace(rw.graph.value(m.root), m.value("x"))


class InferenceDropout(Rule):
    """Dropout(x) = x when not training and the mask is unused."""

    name = "dropout"
    pattern = Op("Dropout", (Any_("x"), Const("ratio", optional=True), Const("training", optional=True)))

    def check(self, graph: Graph, m: Match) -> str | None:
        training = m.const("training")
        if training is not None and bool(np.asarray(training).reshape(-1)[0]):
            return "training_mode is true"
        if m.root.num_outputs > 1 and graph.has_users(m.root) and graph.users(graph.value(m.root, 1)):
            return "the mask output is used"
        if m.root.num_outputs > 1 and graph.is_output(graph.value(m.root, 1)):
            return "the mask output is a graph output"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        rw.replace(rw.graph.value(m.root), m.value("x"))


class NoopCast(Rule):
    """Cast(x: T, to=T) = x."""

    name = "noop-cast"
    pattern = Op("Cast", (Any_("x"),))

    def check(self, graph: Graph, m: Match) -> str | None:
        same = m.value("x").type.dtype == m.root.output_types[0].dtype
        return None if same else "Cast changes the dtype"

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        rw.replace(rw.graph.value(m.root), m.value("x"))


class NoopShapeOp(Rule):
    """Reshape/Flatten/Expand/Squeeze/Tile whose output shape equals the input's = x."""

    name = "noop-reshape"
    pattern = Op(("Reshape", "Flatten", "Expand", "Squeeze", "Tile"), (Any_("x"),))

    def check(self, graph: Graph, m: Match) -> str | None:
        tin, tout = m.value("x").type, m.root.output_types[0]
        if not (tin.is_static and tout.is_static):
            return "shapes are not static"
        return None if tin == tout else f"shape changes {tin} -> {tout}"

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        rw.replace(rw.graph.value(m.root), m.value("x"))


class TransposePair(Rule):
    """Transpose(x, id) = x; Transpose(Transpose(x, p), q) = Transpose(x, p∘q)."""

    name = "transpose"
    pattern = Op("Transpose", (Any_("x"),))

    def check(self, graph: Graph, m: Match) -> str | None:
        x = m.value("x")
        rank = x.type.rank
        if rank is None:
            return "unknown rank"
        if _perm(m.root.attrs, rank) == list(range(rank)):
            return None
        inner = x.producer
        if inner.op != "Transpose" or inner.domain:
            return "not an identity permutation and not a Transpose pair"
        if len(graph.users(x)) != 1 or graph.is_output(x):
            return "the inner Transpose has other users"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        x = m.value("x")
        rank = x.type.rank or 0
        q = _perm(m.root.attrs, rank)
        if q == list(range(rank)):
            rw.replace(rw.graph.value(m.root), x)
            return
        inner = x.producer
        src = rw.graph.inputs_of(inner)[0]
        assert src is not None
        p = _perm(inner.attrs, rank)
        composed = [p[i] for i in q]
        out = rw.graph.value(m.root)
        if composed == list(range(rank)):
            rw.replace(out, src)
        else:
            rw.replace(out, rw.op("Transpose", [src], {"perm": tuple(composed)}, like=m.root), take_name=True)


class ReshapeChain(Rule):
    """Reshape(Reshape(x, s1), s2) = Reshape(x, s2) (static output shape)."""

    name = "reshape-chain"
    pattern = Op(("Reshape", "Flatten"), (Op(("Reshape", "Flatten"), (Any_("x"),), name="inner"),))

    def check(self, graph: Graph, m: Match) -> str | None:
        return None if m.root.output_types[0].is_static else "output shape is not static"

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        shape = np.array(m.root.output_types[0].static_shape, dtype=np.int64)
        new = rw.op("Reshape", [m.value("x"), rw.const(shape, "shape")], like=m.root)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


class SqueezePair(Rule):
    """Squeeze(Unsqueeze(x, a), a) = x and Unsqueeze(Squeeze(x, a), a) = x."""

    name = "squeeze-pair"
    pattern = Op(
        ("Squeeze", "Unsqueeze"),
        (
            Op(("Squeeze", "Unsqueeze"), (Any_("x"), Const("a", optional=True)), name="inner"),
            Const("b", optional=True),
        ),
    )

    def check(self, graph: Graph, m: Match) -> str | None:
        if m.root.op == m.node("inner").op:
            return "not an inverse pair"
        a, b = m.const("a"), m.const("b")
        if a is None or b is None:
            return "axes are not explicit constants"
        if m.value("x").type != m.root.output_types[0]:
            return "the pair does not restore the input type"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        rw.replace(rw.graph.value(m.root), m.value("x"))


RULES: list[Rule] = [
    IdentityOp(),
    InferenceDropout(),
    NoopCast(),
    NoopShapeOp(),
    TransposePair(),
    ReshapeChain(),
    SqueezePair(),
]


@register_pass
@dataclass(frozen=True)
class EliminateIdentities(Pass):
    """Remove identity ops and cancel inverse reshape/transpose pairs."""

    name = "eliminate-identities"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return apply_rules(graph, RULES, near_misses=ctx.near_misses)
