"""inline-constant-if: an If whose condition is a constant becomes the branch it takes.

If(c, x) = then_branch(x) if c else else_branch(x), so for a constant c the taken branch's
nodes are copied into the enclosing graph with its capture inputs bound to x, and each If
output y_i is replaced by branch output i. The If's output types are the union of both
branches'; the inlined values may be more specific, so the types downstream are re-inferred.
Typical source: a condition on a shape (Silero's ``sr == 16000``, ``x.shape[1] == 512``) that
fold-constants turned into a constant once the input shapes were bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.subgraphs import inline_graph, refresh_types
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Const, Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["InlineConstantIf", "InlineIf"]


class InlineIf(Rule):
    """If(c, x) with c constant -> the nodes of the branch c selects, applied to x."""

    name = "inline-constant-if"
    pattern = Op("If", (Const("cond"),))

    def check(self, graph: Graph, m: Match) -> str | None:
        cond = m.const("cond")
        if cond is None or cond.size != 1:
            return f"condition has {0 if cond is None else cond.size} elements, expected 1"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        node, g = m.root, rw.graph
        taken = bool(np.asarray(m.const("cond")).reshape(-1)[0])
        branch = node.attrs.then_branch if taken else node.attrs.else_branch
        caps = [v for v in g.inputs_of(node)[1:] if v is not None]
        new = inline_graph(g, branch, caps, scope=f"{node.name}/" if node.name else "")
        rw.replace_node(node, new)
        # downstream of every new value: a branch output may now be a constant, and value-dependent
        # inference (Range, Reshape) gives other types from equal input types
        refresh_types(g, [v for v in new if g.has_node(v.node)])


@register_pass
@dataclass(frozen=True)
class InlineConstantIf(Pass):
    """Replace every If with a constant condition by the nodes of its taken branch."""

    name = "inline-constant-if"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return apply_rules(graph, [InlineIf()], near_misses=ctx.near_misses)
