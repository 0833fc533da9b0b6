"""deduplicate-constants: one constant node per distinct value.

c_i = c_j (same dtype, shape and bytes) -> every use of c_j reads c_i, the first in graph order;
c_j is then dead. Writers store each constant once (ultraface's prior boxes appear twice in the
source model). A constant that is itself a graph output keeps its own node (and name).
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir.graph import CONSTANT_OP, Graph, Value, array_digest
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult, Rewriter

__all__ = ["DeduplicateConstants"]


@register_pass
@dataclass(frozen=True)
class DeduplicateConstants(Pass):
    """Merge constants with identical contents (deterministic: the first in node order survives)."""

    name = "deduplicate-constants"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        first: dict[str, Value] = {}
        with Rewriter(graph) as rw:
            for node in graph.nodes():
                if node.op != CONSTANT_OP or node.domain:
                    continue
                v = graph.value(node)
                key = array_digest(node.attrs.value)
                keep = first.setdefault(key, v)
                if keep is not v and not graph.is_output(v):
                    rw.replace(v, keep)
        return rw.result
