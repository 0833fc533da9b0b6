"""Admission by measurement: an op the pattern-level policy keeps float goes int8 where that is safe.

The rules of :mod:`compiler.ops.quant_rules` keep LayerNorm/GELU chains, residual adds and
Softmax inputs float by default. Each op L of a ``measured`` rule (all but the Softmax inputs) is
measured quantized alone (its input activations on their calibrated grids, as
:func:`compiler.quant.sensitivity.compute_sensitivity` does it for planned layers): at its worst
output o it adds the noise fraction

    r_L = Σ(ŷ_o - y_o)² / Σ y_o² = 10^(-SQNR_L / 10).

Under an additive noise model a set A of admitted ops costs Σ_{L in A} r_L. Ops are admitted,
smallest r_L first, while that sum stays within 10^(-(F + HEADROOM_DB) / 10), F the SQNR floor
(the default floor when it is off): together the admitted ops move a model that sits at the floor
by at most 10 log10(1 + 10^(-HEADROOM_DB/10)) ≈ 0.14 dB. The floor's fallback still measures the
full model afterwards, so an admission can cost layers, never the floor.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import numpy as np

from compiler.ir.graph import Graph
from compiler.ops.quant_rules import rule_named
from compiler.quant.options import DEFAULT_MIN_SQNR
from compiler.quant.params import QParams
from compiler.quant.plan import QuantPlan, activation_ports, node_label

__all__ = ["admit_by_measurement", "HEADROOM_DB"]

HEADROOM_DB = 15.0

log = logging.getLogger(__name__)


def _calibrated(graph: Graph, nid: int, params: Mapping[str, QParams]) -> bool:
    node = graph.node(nid)
    ins = graph.inputs_of(node)
    names = [v.name for p in activation_ports(node, graph) if (v := ins[p]) is not None and v.const is None]
    return all(n in params for n in names)


def admit_by_measurement(
    float_graph: Graph,
    plan: QuantPlan,
    params: Mapping[str, QParams],
    samples: Sequence[Mapping[str, np.ndarray]],
    floor_db: float | None,
    *,
    per_channel: bool = True,
    biases: Mapping[int, np.ndarray] | None = None,
) -> tuple[QuantPlan, list[str]]:
    """The plan with the rule-float ops that fit the noise budget added, and their labels."""
    from compiler.quant.sensitivity import compute_sensitivity

    planned = set(plan.nodes)
    cands = [
        n
        for n, rule in plan.by_rule.items()
        if n not in planned and rule_named(rule).measured and _calibrated(float_graph, n, params)
    ]
    if not cands or not samples:
        return plan, []
    probe = dataclasses.replace(plan, nodes=cands)
    report = compute_sensitivity(float_graph, probe, params, samples, per_channel=per_channel, biases=biases)
    budget = 10.0 ** (-((floor_db if floor_db is not None else DEFAULT_MIN_SQNR) + HEADROOM_DB) / 10.0)
    spent = 0.0
    admitted: list[int] = []
    for lay in sorted(report.layers, key=lambda lay: (-lay.worst_sqnr, lay.node)):
        cost = 10.0 ** (-lay.worst_sqnr / 10.0)
        if spent + cost > budget:
            break
        spent += cost
        admitted.append(lay.node)
    if not admitted:
        return plan, []
    keep = planned | set(admitted)
    labels = [node_label(float_graph.node(n)) for n in admitted]
    skipped = {k: v for k, v in plan.skipped.items() if k not in set(labels)}
    nodes = [n.id for n in float_graph.ops() if n.id in keep]
    log.info("policy: %d rule-float op(s) admitted to int8 by measurement", len(admitted))
    return dataclasses.replace(plan, nodes=nodes, skipped=skipped), sorted(labels)
