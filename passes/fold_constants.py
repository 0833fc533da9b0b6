"""fold-constants: evaluate nodes whose inputs are all constants.

f(c1, ..., cn) -> c where c = reference_f(c1, ..., cn), for pure deterministic
ops only. An output c is left alone, so files do not bloat, when

    |c| > max_elements,  or  |c| > 4096 and |c| > max_growth * (|c1| + ... + |cn|),

unless c is an operand-to-be of a linear op: some path c -> n1 -> ... -> nk -> W, where
every ni is data-independent (pure, deterministic, every input data-independent, leaves
constants) and W's op is quantized as WEIGHTED (Conv, Gemm, MatMul). Such a c is a weight
computed at run time (ConViT's relative-position grid: ScatterND of expanded iotas into
zeros, then pos_proj); folded, it is stored once, the linear op folds or reads a constant
weight quantized per channel, instead of an activation on one per-tensor grid. The
max_elements cap still holds on that path.

With ``dequantize=0`` a DequantizeLinear of an integer constant that only linear ops read stays a
node: dq(W_q) of a model that arrives quantized (QDQ, or QOperator lifted to QDQ) keeps its integer
weights through the optimize pipelines, for the backends' integer forms (fuse-quantized-ops) and
the ONNX artifact (other readers, e.g. a batchnorm's quantized scale, get the float constant);
``only_dequantize=1`` folds those alone (a backend's dq(W_q) left to float ops after its fusions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.errors import ConversionError
from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node
from compiler.ops.registry import QuantPolicy, get_op
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult, Rewriter

__all__ = ["FoldConstants", "fold_reason", "weight_operand_cone"]


def _foldable_op(node: Node) -> bool:
    opdef = get_op(node.op, node.domain)
    return opdef.deterministic and opdef.pure


def weight_operand_cone(graph: Graph) -> set[int]:
    """Ids of the data-independent nodes with a path, through data-independent nodes only,
    to an input of a WEIGHTED op (see the module docstring)."""
    order = graph.nodes()
    indep: set[int] = set()
    for node in order:
        if node.op == CONSTANT_OP and not node.domain:
            indep.add(node.id)
        elif node.op != INPUT_OP and _foldable_op(node):
            ins = [v for v in graph.inputs_of(node) if v is not None]
            if ins and all(v.producer.id in indep for v in ins):
                indep.add(node.id)
    cone: set[int] = set()
    for node in reversed(order):
        if node.id not in indep or node.op == CONSTANT_OP:
            continue
        for out in graph.outputs_of(node):
            for user, _ in graph.users(out):
                if user.id in cone or get_op(user.op, user.domain).quant is QuantPolicy.WEIGHTED:
                    cone.add(node.id)
                    break
            if node.id in cone:
                break
    return cone


def _dequantizes_integers(graph: Graph, node: Node) -> bool:
    """``node`` is a DequantizeLinear of integer levels (not of a float8 or float tensor)."""
    if node.op != "DequantizeLinear" or node.domain:
        return False
    x = graph.inputs_of(node)[0]
    return x is not None and x.type.dtype.numpy.kind in "iu"


def _linear_levels(graph: Graph, node: Node) -> bool:
    """``node`` dequantizes integer levels that only linear ops (Conv, Gemm, MatMul...: WEIGHTED)
    read, whose integer forms take the levels. Another reader (a batchnorm's quantized scale, a
    requantizing QuantizeLinear of a tied bias) gets the float value."""
    if not _dequantizes_integers(graph, node):
        return False
    readers = [u for out in graph.outputs_of(node) for u, _ in graph.users(out)]
    return bool(readers) and all(get_op(u.op, u.domain).quant is QuantPolicy.WEIGHTED for u in readers)


def fold_reason(
    graph: Graph, node: Node, max_elements: int, max_growth: float, *, weight_operand: bool = False
) -> str | None:
    """None if ``node`` can be folded, else why not; ``weight_operand``: ``node`` is in
    :func:`weight_operand_cone`, which lifts the growth cap."""
    if node.op in (INPUT_OP, CONSTANT_OP) and not node.domain:
        return "already a leaf"
    if not _foldable_op(node):
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
    if not weight_operand and out_elems > 4096 and out_elems > max_growth * in_elems:
        return f"output ({out_elems}) would be {out_elems / max(in_elems, 1):.0f}x its inputs"
    return None


@register_pass
@dataclass(frozen=True)
class FoldConstants(Pass):
    """Replace constant subexpressions by their values."""

    name = "fold-constants"
    max_elements: int = 1 << 22
    max_growth: float = 4.0
    dequantize: bool = True  # fold DequantizeLinear of integer constants too
    only_dequantize: bool = False  # fold nothing else (a backend's leftover dq(W_q) after its fusions)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        cone = weight_operand_cone(graph)
        with Rewriter(graph) as rw:
            for node in graph.nodes():
                if not graph.has_node(node.id):
                    continue
                why = fold_reason(
                    graph, node, self.max_elements, self.max_growth, weight_operand=node.id in cone
                )
                if why is not None:
                    continue
                if not self.dequantize and _linear_levels(graph, node):
                    continue
                if self.only_dequantize and not _dequantizes_integers(graph, node):
                    continue
                args = [None if v is None else v.const for v in graph.inputs_of(node)]
                try:
                    with np.errstate(all="ignore"):  # inf / nan results are IEEE's, as every runtime's
                        outs = get_op(node.op, node.domain).reference(args, node.attrs, node.num_outputs)
                except IndexError as exc:  # constant indices out of range: the model is wrong
                    label = node.name or node.output_names[0]
                    raise ConversionError(
                        f"node '{label}' ({node.qualified_op}): {exc} on its constant inputs"
                    ) from None
                new = [
                    rw.const(np.asarray(a).astype(t.dtype.numpy, copy=False), name=f"{nm}_const")
                    for a, t, nm in zip(outs, node.output_types, node.output_names, strict=True)
                ]
                rw.replace_node(node, new)
                rw.applied("fold")
        return rw.result
