"""Which nodes to quantize and which activations need calibration.

The registry decides: WEIGHTED ops (Conv, FusedConv, ConvTranspose, Gemm, MatMul)
get int8 weights and quantized activations; ACTIVATION ops get quantized inputs
and outputs; PASSTHROUGH ops (``carried``) keep their input's scale, and their outputs
stay on that grid when the input is quantized; everything else stays float.
``--keep-float`` patterns (node name, op type, or a regex on the name) opt out.

Pattern-level policy (:mod:`compiler.ops.quant_rules`): an ACTIVATION op that a registered rule
recognises (the elementwise ops of a decomposed LayerNorm or a GELU chain, a transformer block's
residual Add, the input of a Softmax) stays float; the plan lists it in ``by_rule`` with the
rule's name, so that a measurement may still admit it (see :mod:`compiler.quant.quantize`).
An op class with several int8 forms (:data:`compiler.ops.quant_rules.QUANT_FORMS`, the recurrent
ops) is planned in its most conservative form until a measurement picks one
(:mod:`compiler.quant.forms`); a weight-only node is listed in ``weight_only``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.quant_rules import float_by_rule, quant_forms
from compiler.ops.registry import QuantPolicy, QuantSpec, get_op

__all__ = ["QuantPlan", "make_plan", "node_label", "activation_ports", "keep_float_match"]


@dataclass
class QuantPlan:
    """Nodes to quantize (ids, topological order), values to observe, and why others were skipped.

    ``carried`` are the PASSTHROUGH nodes (topological order) not kept float: when their
    input is an int8 value, their outputs are re-quantized on the same grid (exact), so
    that no DequantizeLinear output reaches a graph output or a float op through them.
    ``float_tail``: ops past the last weighted layer stay float, and a quantized node whose
    output only float ops read dequantizes in its epilogue (no 8-bit rounding of that output).
    ``by_rule``: nodes the pattern-level policy kept float (node id -> rule name), plan order.
    ``weight_only``: planned nodes whose weights alone are int8 (their input activations stay float).
    """

    nodes: list[int] = field(default_factory=list)
    observe: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    carried: list[int] = field(default_factory=list)
    float_tail: bool = False
    by_rule: dict[int, str] = field(default_factory=dict)
    weight_only: frozenset[int] = frozenset()


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
    given = spec.activations if spec is not None else None
    ports = given if given is not None else tuple(range(len(ins)))  # None: every input
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


def feeds_weighted(graph: Graph) -> set[int]:
    """Ids of nodes from which some quantizable WEIGHTED node is reachable downstream.

    Ops past the last weighted layer (box decoding, softmax heads, resizing of a
    final score map) do no int8 arithmetic worth having; quantizing them only adds
    rounding, so the plan leaves that tail in float.
    """
    reach: set[int] = set()
    for node in reversed(graph.ops()):
        for v in graph.outputs_of(node):
            for user, _ in graph.users(v):
                if user.id in reach or (
                    get_op(user.op, user.domain).quant == QuantPolicy.WEIGHTED
                    and _why_not(user, graph) is None
                ):
                    reach.add(node.id)
    return reach


def make_plan(
    graph: Graph,
    keep_float: Sequence[str] = (),
    *,
    float_tail: bool = False,
    policy_rules: bool = True,
    admit: Sequence[int] = (),
) -> QuantPlan:
    """Decide the quantized nodes and the activation values to calibrate.

    With ``float_tail`` (the driver's choice), non-weighted ops after the last
    weighted layer stay float (see :func:`feeds_weighted`). ``policy_rules`` applies the
    pattern-level rules; ``admit`` lists node ids that a measurement re-admitted to int8.
    """
    plan = QuantPlan(float_tail=float_tail)
    observe: dict[str, None] = {}
    upstream = feeds_weighted(graph) if float_tail else None
    rules = float_by_rule(graph) if policy_rules else {}
    for node in graph.ops():
        policy = get_op(node.op, node.domain).quant
        if upstream is not None and policy != QuantPolicy.WEIGHTED and node.id not in upstream:
            if policy in (QuantPolicy.ACTIVATION, QuantPolicy.PASSTHROUGH):
                plan.skipped[node_label(node)] = "float post-processing after the last weighted layer"
            continue
        if policy == QuantPolicy.PASSTHROUGH:
            pat = keep_float_match(node, keep_float)
            if pat is None:
                plan.carried.append(node.id)
            else:
                plan.skipped[node_label(node)] = f"kept float by --keep-float {pat!r}"
            continue
        reason = _why_not(node, graph)
        if reason is not None:
            if reason != "op stays float":
                plan.skipped[node_label(node)] = reason
            continue
        pat = keep_float_match(node, keep_float)
        if pat is not None:
            plan.skipped[node_label(node)] = f"kept float by --keep-float {pat!r}"
            continue
        observe.update(dict.fromkeys(_activations(node, graph)))  # rule-float ones too: admittable
        rule = rules.get(node.id)
        if rule is not None and policy != QuantPolicy.WEIGHTED:
            plan.by_rule[node.id] = rule.name
            if node.id not in admit:
                plan.skipped[node_label(node)] = rule.why()
                continue
        plan.nodes.append(node.id)
        forms = quant_forms(node)
        if forms and forms[-1].weight_only:
            plan.weight_only = plan.weight_only | {node.id}
    plan.observe = list(observe)
    return plan


def _activations(node: Node, graph: Graph) -> list[str]:
    """Names of the non-constant activation inputs and float outputs of a planned node."""
    ins = graph.inputs_of(node)
    names = [v.name for p in activation_ports(node, graph) if (v := ins[p]) is not None and v.const is None]
    spec = get_op(node.op, node.domain).qspec
    if spec is not None and spec.float_output:
        return names
    return names + [v.name for v in graph.outputs_of(node) if v.type.dtype.is_float]
