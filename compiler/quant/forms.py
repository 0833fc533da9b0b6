"""Per-node choice between an op class's int8 forms (``QUANT_FORMS``: the recurrent ops), by measurement.

For a planned node L with candidate forms F_1, ..., F_n (most int8 first, from
:mod:`compiler.ops.quant_rules`), each form is measured with L alone quantized in it, as
:func:`compiler.quant.sensitivity.compute_sensitivity` measures a layer: the worst output's
noise fraction r_L(F) = 10^(-SQNR_L(F) / 10) on the evaluation samples. L takes the first form with

    r_L(F) <= 10^(-(floor + HEADROOM_DB) / 10)

(the admission budget of :mod:`compiler.quant.admission`: that form's int8 costs nothing
measurable at the floor), else the form with the highest SQNR_L. The floor's fallback still
measures the full model afterwards, and may send L back to float. Without samples, or when an
activation of a form has no calibrated grid (``--scales`` without it), L keeps the last form.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.ir.graph import Graph
from compiler.ops.quant_rules import QuantForm, quant_forms
from compiler.quant.admission import HEADROOM_DB
from compiler.quant.options import DEFAULT_MIN_SQNR
from compiler.quant.params import QParams
from compiler.quant.plan import QuantPlan, activation_ports, node_label

__all__ = ["FormChoice", "choose_forms"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FormChoice:
    """The form one node took, and each candidate's measured worst-output SQNR (dB)."""

    node: int
    name: str
    op: str
    form: str
    sqnr_db: dict[str, float] = field(default_factory=dict)
    why: str = ""

    def as_json(self) -> dict[str, object]:
        """Manifest form (dB to 2 decimals)."""
        return {
            "op": self.op,
            "form": self.form,
            "sqnr_db": {k: round(v, 2) for k, v in self.sqnr_db.items()},
            "why": self.why,
        }


def _calibrated(graph: Graph, nid: int, params: Mapping[str, QParams]) -> bool:
    node = graph.node(nid)
    ins = graph.inputs_of(node)
    names = [v.name for p in activation_ports(node, graph) if (v := ins[p]) is not None and v.const is None]
    return all(n in params for n in names)


def _choose(scores: Mapping[str, float], forms: Sequence[QuantForm], budget_db: float) -> tuple[str, str]:
    for f in forms:
        if f.name in scores and scores[f.name] >= budget_db:
            return f.name, f"the most int8 form at >= {budget_db:g} dB alone (floor + {HEADROOM_DB:g} dB)"
    best = max((f for f in forms if f.name in scores), key=lambda f: scores[f.name])
    return best.name, f"no form at >= {budget_db:g} dB alone: the best measured"


def choose_forms(
    float_graph: Graph,
    plan: QuantPlan,
    params: Mapping[str, QParams],
    samples: Sequence[Mapping[str, np.ndarray]],
    floor_db: float | None,
    *,
    per_channel: bool = True,
    biases: Mapping[int, np.ndarray] | None = None,
) -> tuple[QuantPlan, list[FormChoice]]:
    """The plan with each multi-form node in its measured form, and the choices (plan order)."""
    from compiler.quant.sensitivity import compute_sensitivity

    cands = {n: f for n in plan.nodes if (f := quant_forms(float_graph.node(n)))}
    if not cands:
        return plan, []
    budget_db = (floor_db if floor_db is not None else DEFAULT_MIN_SQNR) + HEADROOM_DB
    scores: dict[int, dict[str, float]] = {n: {} for n in cands}
    if samples:
        names = list(dict.fromkeys(f.name for forms in cands.values() for f in forms))
        for name in names:
            cand = next(f for forms in cands.values() for f in forms if f.name == name)
            nodes = [
                n
                for n, forms in cands.items()
                if cand in forms and (cand.weight_only or _calibrated(float_graph, n, params))
            ]
            if not nodes:
                continue
            wo = frozenset(nodes) if cand.weight_only else frozenset()
            probe = dataclasses.replace(plan, nodes=nodes, weight_only=wo)
            report = compute_sensitivity(
                float_graph, probe, params, samples, per_channel=per_channel, biases=biases
            )
            for lay in report.layers:
                scores[lay.node][name] = lay.worst_sqnr
    weight_only = set(plan.weight_only) - set(cands)
    choices: list[FormChoice] = []
    for n, forms in cands.items():
        node = float_graph.node(n)
        if scores[n]:
            form, why = _choose(scores[n], forms, budget_db)
        else:
            form, why = forms[-1].name, "not measured (no samples): the most conservative form"
        if next(f for f in forms if f.name == form).weight_only:
            weight_only.add(n)
        choices.append(FormChoice(n, node_label(node), node.qualified_op, form, scores[n], why))
        log.info("int8 form of %s: %s %s", node_label(node), form, scores[n])
    return dataclasses.replace(plan, weight_only=frozenset(weight_only)), choices
