"""The output floor of weight-only quantization: which layers keep int8 (under int4) or float weights.

Every layer at ``bits`` can miss the cosine floor the artifact is judged by (ViT-Tiny, int4 blocks
of 32, nearest rounding: 0.975 against the 0.98 int4w floor). The plan measures the rounding on the
compile's samples and keeps the most sensitive layers finer, with
:func:`compiler.quant.layer_fallback.tiered_fallback` over the tiers

    int4w: (W_int4, W_int8, W),    int8w: (W_int8, W),

where W_b = dequantize(levels_b) is the weight the layer computes with at b bits (the same grid,
rounding and block size the pass writes) and W the float weight. A trial is the float graph in
onnxruntime with each planned B fed as a graph input; its score is the worst output cosine, over
the outputs and the samples, against the float weights. The floor defaults to the verification
floor of the precision (:data:`compiler.verification.TOLERANCES`: int4w 0.98, int8w 0.999).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Node
from compiler.ir.types import TensorType
from compiler.quant.layer_fallback import WeightTrials, goal_of, tiered_fallback
from compiler.quant.plan import node_label

__all__ = [
    "PlanLayer",
    "WeightOnlyPlan",
    "plan_weight_only",
    "default_floor",
    "plan_samples",
    "fallback_summary",
    "PLAN_CALIB",
]

log = logging.getLogger(__name__)

PLAN_CALIB = 4
"""Calibration samples the plan measures on (besides the compile inputs)."""


def default_floor(bits: int) -> float:
    """The verification cosine floor of weight-only ``bits`` (int4w, int8w)."""
    from compiler.verification import TOLERANCES

    return TOLERANCES[f"int{bits}w"].min_cosine


@dataclass(frozen=True)
class PlanLayer:
    """One candidate: its node, the port of B, B as it is (float), and B at ``bits`` (decoded)."""

    node: Node
    port: int
    weight: np.ndarray
    decoded: Callable[[int], np.ndarray]


@dataclass
class WeightOnlyPlan:
    """Bits per node id (None: float) for the layers the plan raised, and the manifest record."""

    bits: dict[int, int | None] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)


def plan_samples(graph: Graph, options: Any) -> tuple[list[dict[str, np.ndarray]], str]:
    """The samples the plan measures on and where they come from: the inputs verification uses
    (``--inputs``, else seeded random inputs) and up to :data:`PLAN_CALIB` calibration samples."""
    from compiler.input_spec import check_inputs, load_inputs, random_graph_inputs

    types = graph.input_types()
    inputs = getattr(options, "inputs", None)
    if inputs is not None:
        samples, source = [check_inputs(load_inputs(inputs), types, str(inputs))], "inputs"
    elif all(t.is_static for t in types.values()):
        seed = int(getattr(options, "seed", 0) or 0)
        samples, source = [random_graph_inputs(graph, seed)], f"seed {seed}"
    else:
        samples, source = [], "no samples (dynamic input shapes and no --inputs)"
    q = getattr(options, "quant", None)
    calib = getattr(q, "calib", None)
    if q is not None and calib is not None:
        from compiler.calibration.dataset import open_calibration

        count = min(PLAN_CALIB, q.calib_count or PLAN_CALIB)
        taken = list(
            itertools.islice(open_calibration(calib, types, count=count, preprocess=q.preprocess), count)
        )
        samples += [dict(s) for s in taken]
        source += f" + {len(taken)} calibration samples"
    return samples, source


def _entry(layer: PlanLayer, alone: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"node": node_label(layer.node)}
    if alone is not None:
        out["cosine_alone"] = round(float(alone), 8)
    return out


def plan_weight_only(
    graph: Graph,
    layers: Sequence[PlanLayer],
    bits: int,
    floor: float,
    samples: Sequence[Mapping[str, np.ndarray]],
    source: str,
) -> WeightOnlyPlan:
    """The plan of the module docstring for ``layers`` of ``graph`` (the float graph) at ``bits``."""
    plan = WeightOnlyPlan()
    if floor <= 0.0 or not layers:
        return plan
    if not samples:
        plan.record = {"min_cosine": floor, "samples": source, "skipped": f"nothing to measure on: {source}"}
        log.warning("weight-only floor not measured: %s", source)
        return plan
    goal = goal_of(floor)
    slots = [(la.node, la.port, TensorType.of(la.weight)) for la in layers]
    trials = WeightTrials(graph, slots, samples, f"the weight-only floor (--weight-min-cosine {floor:g})")
    float_w = [la.weight for la in layers]
    try:
        trials.reference = trials.run(float_w)
    except Exception as exc:  # onnxruntime's own errors: the float model does not run on these samples
        why = f"the float model does not run in onnxruntime on {source}: {str(exc).splitlines()[0]}"
        log.warning("weight-only floor not measured: %s", why)
        plan.record = {"min_cosine": floor, "samples": source, "skipped": why}
        return plan
    low = [la.decoded(bits) for la in layers]
    cos_all = trials.cosine(low)
    plan.record = {
        "min_cosine": floor,
        "goal": round(goal, 8),
        "samples": source,
        "cosine_all_quantized": round(float(cos_all), 8),
        "cosine": round(float(cos_all), 8),
        "int8": [],
        "float": [],
    }
    if cos_all >= goal:
        plan.record["trials"] = trials.runs
        return plan
    tiers = [low, [la.decoded(8) for la in layers], float_w] if bits == 4 else [low, float_w]
    found = tiered_fallback(trials, tiers, goal, cos_all)
    plan.record["cosine"] = round(float(found.cosine), 8)
    plan.record["trials"] = trials.runs
    names = ["int4", "int8", "float"] if bits == 4 else ["int8", "float"]
    why = (
        f"every layer at int{bits} gives output cosine {cos_all:.6f} < {goal:.6f} (the floor {floor:g} "
        f"+ {goal - floor:.2g} margin) on {source}"
    )
    for t, ids in enumerate(found.raised, start=1):
        tier, below = names[t], names[t - 1]
        for i in ids:
            la = layers[i]
            alone = found.alone.get(i)
            plan.bits[la.node.id] = 8 if tier == "int8" else None
            scored = (
                ""
                if alone is None
                else f"; this layer alone at {below} (the others {tier}) gives {alone:.6f}"
            )
            plan.reasons[la.node.id] = f"{tier} fallback for the output floor: {why}{scored}"
            plan.record[tier].append(_entry(la, alone))
    plan.record["reason"] = (
        f"{why}; the most sensitive layers (each scored alone) keep finer weights until the floor holds"
    )
    log.info(
        "weight-only int%d: %d of %d layers keep int8, %d float (cosine %.6f -> %.6f, floor %.4f)",
        bits,
        len(plan.record["int8"]),
        len(layers),
        len(plan.record["float"]),
        cos_all,
        found.cosine,
        floor,
    )
    return plan


def fallback_summary(record: Mapping[str, Any] | None) -> str | None:
    """One line for the compile's output naming the fallback layers (None when none fell back)."""
    if not record or not (record.get("int8") or record.get("float")):
        return None
    parts = [
        f"{len(record[tier])} {tier} ({', '.join(e['node'] for e in record[tier])})"
        for tier in ("int8", "float")
        if record.get(tier)
    ]
    return (
        f"weight-only fallback: {'; '.join(parts)} for the output cosine floor {record['min_cosine']:g} "
        f"(every layer quantized: {record['cosine_all_quantized']:.6f}, as planned: {record['cosine']:.6f})"
    )
