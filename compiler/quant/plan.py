"""Which nodes to quantize and which activations need calibration.

The registry decides: WEIGHTED ops (Conv, FusedConv, ConvTranspose, Gemm, MatMul)
get int8 weights and quantized activations; ACTIVATION ops get quantized inputs
and outputs; PASSTHROUGH ops keep their input's scale; everything else stays float.
``--keep-float`` patterns (node name, op type, or a regex on the name) opt out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.registry import QuantPolicy, QuantSpec, get_op

__all__ = ["QuantPlan", "make_plan", "node_label", "activation_ports", "keep_float_match"]


@dataclass
class QuantPlan:
    """Nodes to quantize (ids, topological order), values to observe, and why others were skipped."""

    nodes: list[int] = field(default_factory=list)
    observe: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def node_label(node: Node) -> str:
    """The name a user sees for a node: its source name, else its first output's name."""
    return node.name or node.output_names[0]


def keep_float_match(node: Node, patterns: Sequence[str]) -> str | None:
    """The first pattern that matches the node's name, op type or (as a regex) its name."""
    label = node_label(node)
    for pat in patterns:
        if pat in (label, node.op, node.qualified_op) or pat in node.output_names:
            return pat
        try:
            if re.fullmatch(pat, label):
                return pat
        except re.error:
            continue
    return None


def activation_ports(node: Node, graph: Graph) -> list[int]:
    """Input ports of ``node`` whose (non-constant, float) values are quantized."""
    opdef = get_op(node.op, node.domain)
    spec: QuantSpec | None = opdef.qspec
    ins = graph.inputs_of(node)
    ports = spec.activations if spec is not None else tuple(range(len(ins)))
    return [p for p in ports if p < len(ins) and _float(ins[p])]


def _float(v: Value | None) -> bool:
    return v is not None and v.type.dtype.is_float


def _why_not(node: Node, graph: Graph) -> str | None:
    opdef = get_op(node.op, node.domain)
    if opdef.quant not in (QuantPolicy.WEIGHTED, QuantPolicy.ACTIVATION):
        return "op stays float"
    ins = graph.inputs_of(node)
    if not any(t.dtype.is_float for t in node.output_types):
        return "output is not float"
    if opdef.quant == QuantPolicy.WEIGHTED:
        spec = opdef.qspec
        assert spec is not None and spec.weight is not None
        w = ins[spec.weight] if spec.weight < len(ins) else None
        if w is None or w.const is None:
            return "weight is not constant"
        if not w.type.dtype.is_float:
            return "weight is not float"
        if not _float(ins[0]):
            return "input is not float"
    elif not activation_ports(node, graph):
        return "no float inputs"
    return None


def make_plan(graph: Graph, keep_float: Sequence[str] = ()) -> QuantPlan:
    """Decide the quantized nodes and the activation values to calibrate."""
    plan = QuantPlan()
    observe: dict[str, None] = {}
    for node in graph.ops():
        reason = _why_not(node, graph)
        if reason is not None:
            if reason != "op stays float":
                plan.skipped[node_label(node)] = reason
            continue
        pat = keep_float_match(node, keep_float)
        if pat is not None:
            plan.skipped[node_label(node)] = f"kept float by --keep-float {pat!r}"
            continue
        plan.nodes.append(node.id)
        ins = graph.inputs_of(node)
        for p in activation_ports(node, graph):
            v = ins[p]
            assert v is not None
            if v.const is None:
                observe[v.name] = None
        for v in graph.outputs_of(node):
            if v.type.dtype.is_float:
                observe[v.name] = None
    plan.observe = list(observe)
    return plan
