"""fold-constants: evaluate nodes whose inputs are all constants.

f(c1, ..., cn) -> c where c = reference_f(c1, ..., cn), for pure deterministic
ops only; outputs larger than ``max_elements``, or that grow more than
``max_growth`` times the inputs' size, are left alone so files do not bloat.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node
from compiler.ops.registry import get_op
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult, Rewriter

__all__ = ["FoldConstants", "fold_reason"]


def fold_reason(graph: Graph, node: Node, max_elements: int, max_growth: float) -> str | None:
    """None if ``node`` can be folded, else why not."""
    if node.op in (INPUT_OP, CONSTANT_OP) and not node.domain:
        return "already a leaf"
    opdef = get_op(node.op, node.domain)
    if not opdef.deterministic or not opdef.pure:
        return f"{node.qualified_op} is not deterministic and pure"
    ins = graph.inputs_of(node)
    present = [v for v in ins if v is not None]
    if not present:
        return "node has no inputs"
    if any(v.const is None for v in present):
        return "an input is not constant"
    if any(not t.is_static for t in node.output_types):
        return "output shape is not static"
    out_elems = sum(t.numel for t in node.output_types)
    in_elems = sum(int(np.asarray(v.const).size) for v in present)
    if out_elems > max_elements:
        return f"output has {out_elems} elements > cap {max_elements}"
    if out_elems > 4096 and out_elems > max_growth * in_elems:
        return f"output ({out_elems}) would be {out_elems / max(in_elems, 1):.0f}x its inputs"
    return None


@register_pass
@dataclass(frozen=True)
class FoldConstants(Pass):
    """Replace constant subexpressions by their values."""

    name = "fold-constants"
    max_elements: int = 1 << 22
    max_growth: float = 4.0

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        with Rewriter(graph) as rw:
            for node in graph.nodes():
                if not graph.has_node(node.id):
                    continue
                if fold_reason(graph, node, self.max_elements, self.max_growth) is not None:
                    continue
                args = [None if v is None else v.const for v in graph.inputs_of(node)]
                outs = get_op(node.op, node.domain).reference(args, node.attrs, node.num_outputs)
                new = [
                    rw.const(np.asarray(a).astype(t.dtype.numpy, copy=False), name=f"{nm}_const")
                    for a, t, nm in zip(outs, node.output_types, node.output_names, strict=True)
                ]
                rw.replace_node(node, new)
                rw.applied("fold")
        return rw.result
