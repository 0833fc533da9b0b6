"""eliminate-dead-nodes: remove nodes whose outputs reach no graph output.

A node n is live iff some output of n is a graph output or feeds a live node.
Graph inputs are part of the interface and always stay.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir.graph import INPUT_OP, Graph
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult, Rewriter

__all__ = ["EliminateDeadNodes"]


@register_pass
@dataclass(frozen=True)
class EliminateDeadNodes(Pass):
    """Delete unused nodes and constants."""

    name = "eliminate-dead-nodes"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        with Rewriter(graph) as rw:
            for node in reversed(graph.nodes()):
                if node.op != INPUT_OP and not graph.has_users(node):
                    graph.remove(node)
                    rw.applied("dead")
        return rw.result
