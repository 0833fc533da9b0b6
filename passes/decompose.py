"""decompose: rewrite the ops a backend cannot write into exact equivalents it can.

For every node n with table.reason(graph, n) != None (the backend cannot write n), the first
rule r of :data:`passes.decompositions.DECOMPOSITIONS` [op(n)] with r.check(graph, n) = None and
every op of r.produces writable by the table (natively or, recursively, through further
rules) rewrites n; nodes the backend can write are kept. Rounds repeat to a fixed point
(produced nodes may need decompositions of their own) with a step cap. The rules and their
math are in :mod:`passes.decompositions`.

The table is ``ctx.capabilities`` when set, else
``get_backend(backend).capabilities(target or backend)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from compiler.backend import DYNAMIC_SHAPE, CapabilityTable, get_backend
from compiler.errors import OptionError
from compiler.ir.graph import Graph
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import NearMiss
from compiler.rewriter import PassResult, Rewriter
from passes.decompositions import choose_decomposition, decompositions_for

__all__ = ["Decompose", "MAX_ROUNDS"]

log = logging.getLogger(__name__)

MAX_ROUNDS = 8
"""Rounds over the graph before the pass stops and warns that it did not converge."""


@register_pass
@dataclass(frozen=True)
class Decompose(Pass):
    """Decompose ops the target backend lacks into exact rewrites using ops it has."""

    name = "decompose"
    backend: str = ""
    target: str = ""

    def table(self, ctx: PassContext) -> CapabilityTable[Any]:
        """The capability table this run legalizes for."""
        if ctx.capabilities is not None:
            return ctx.capabilities
        if not self.backend:
            raise OptionError("decompose needs a backend (decompose{backend=mnn}) or ctx.capabilities")
        return get_backend(self.backend).capabilities(self.target or self.backend)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        table = self.table(ctx)
        refused: dict[int, NearMiss] = {}
        with Rewriter(graph) as rw:
            for _ in range(MAX_ROUNDS):
                changed = False
                for node in graph.ops():
                    if not graph.has_node(node.id):
                        continue
                    why = table.reason(graph, node)
                    # a native op the backend refuses only for its dynamic shape stays as it is
                    if why is None or (why == DYNAMIC_SHAPE and node.qualified_op in table):
                        continue
                    rule = choose_decomposition(table, graph, node)
                    if isinstance(rule, str):
                        if decompositions_for(node.qualified_op):
                            refused[node.id] = NearMiss(self.name, node.describe(), rule)
                        continue
                    refused.pop(node.id, None)
                    rule.rewrite(rw, graph, node)
                    rw.applied(rule.name)
                    changed = True
                if not changed:
                    break
            else:
                log.warning("decompose: no fixed point after %d rounds", MAX_ROUNDS)
        ctx.near_misses.extend(m for nid, m in sorted(refused.items()) if graph.has_node(nid))
        return rw.result
