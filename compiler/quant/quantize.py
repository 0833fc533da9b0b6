"""The int8 quantization step of the driver: plan, calibrate, choose scales, analyse, insert QDQ.

plan    = make_plan(graph, keep_float)             # registry policies decide
ranges  = calibrate(graph, plan.observe, samples)  # or read --scales FILE
ranges  = check_clipped_ranges(...)                # entropy: a KL clip stays where no output loses
params  = activation_params(ranges)                # (s, z) per activation
biases  = estimate_bias_corrections(...)           # --bias-correction: b' = b - E[ỹ - y]
admit   = admit_by_measurement(...)                # rule-float ops whose int8 costs nothing measurable
forms   = choose_forms(...)                        # per RNN node: int8-input or weight-only, measured
report  = compute_sensitivity(...)                 # each layer alone; the full int8 model
floats  = choose_fallback(report, floor)           # layers back to float until the floor holds
insert_qdq(graph, plan - floats, params)           # int8 weights, int32 bias, QDQ pairs

The SQNR floor (``--min-sqnr DB``, default 25 dB, ``off`` to disable) is measured on the worst
output, on the evaluation (calibration) samples and, on its own, on the ``--inputs`` samples
(``holdout``). Missed at full int8, layers go back to float until it holds; with ``--strict`` the
compile fails instead (:class:`SqnrFloorMissed`, exit 1). ``outcome.floor`` says which happened.

The analysis runs on clones of the float graph; ``graph`` itself is rewritten once, at the
end, with the final plan, so it equals a fresh clone of the float graph put in QDQ form.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import KilnError, OptionError, VerificationFailed
from compiler.ir.graph import Graph
from compiler.quant.forms import FormChoice, choose_forms
from compiler.quant.mixed_precision import FallbackResult
from compiler.quant.options import QuantOptions
from compiler.quant.params import QParams
from compiler.quant.plan import QuantPlan, make_plan, node_label
from compiler.quant.qdq import MissingScaleError, QdqResult, activation_params, insert_qdq
from compiler.quant.sensitivity import SQNR_CAP, Score, SensitivityReport

__all__ = [
    "QuantOutcome",
    "Calibration",
    "calibrate_int8",
    "apply_int8",
    "quantize_int8",
    "load_samples",
    "summary",
    "SqnrFloorMissed",
]

log = logging.getLogger(__name__)
Sample = Mapping[str, np.ndarray]


class SqnrFloorMissed(VerificationFailed):
    """``--strict``: the int8 model misses the worst-output SQNR floor (exit 1)."""


@dataclass
class QuantOutcome:
    """Everything the int8 step produced, for artifacts, reports and the manifest.

    ``plan`` is the final plan (layers sent back to float by ``--min-sqnr`` are in
    ``plan.skipped``); ``sensitivity`` covers every layer of the original plan.
    """

    float_graph: Graph
    plan: QuantPlan
    ranges: dict[str, tuple[float, float]]
    params: dict[str, QParams]
    result: QdqResult
    samples: Sequence[dict[str, np.ndarray]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    sensitivity: SensitivityReport | None = None
    fallback: FallbackResult | None = None
    biases: dict[int, np.ndarray] = field(default_factory=dict)
    bias_summary: dict[str, float] = field(default_factory=dict)
    floor: dict[str, Any] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)
    forms: list[FormChoice] = field(default_factory=list)
    smoothquant: dict[str, Any] = field(default_factory=dict)

    @property
    def final_scores(self) -> dict[str, Score]:
        """Per-output scores of the emitted model (after any fallback)."""
        if self.fallback is not None:
            return self.fallback.after
        return self.sensitivity.full_model if self.sensitivity is not None else {}


def load_samples(graph: Graph, q: QuantOptions) -> Sequence[dict[str, np.ndarray]]:
    """The calibration samples named by the options, read from disk lazily (one at a time)."""
    from compiler.calibration.dataset import open_calibration

    if q.calib is None:
        return []
    return open_calibration(q.calib, graph.input_types(), count=q.calib_count, preprocess=q.preprocess)


def _check(q: QuantOptions) -> None:
    if q.calib is None and q.scales is None:
        raise OptionError(
            "--quantize int8 needs calibration data (--calib DATA) or a scales file (--scales FILE)"
        )
    if q.min_sqnr is not None or q.strict:
        floor = q.floor_db
        assert floor is not None
        if not math.isfinite(floor) or floor >= SQNR_CAP:
            raise OptionError(f"--min-sqnr {floor}: must be a finite number of dB below {SQNR_CAP:g}")
        flag = "--min-sqnr" if q.min_sqnr is not None else "--strict"
        if not q.sensitivity:
            raise OptionError(f"{flag} needs the sensitivity analysis; drop --no-sensitivity")
        if q.calib is None:
            raise OptionError(f"{flag} measures SQNR on calibration samples: give --calib DATA")
    if q.bias_correction and q.calib is None:
        raise OptionError(
            "--bias-correction estimates the bias shift on calibration samples: give --calib DATA"
        )


@dataclass
class Calibration:
    """What calibration decided, before any graph edit: the plan, the samples, ranges and (s, z)."""

    float_graph: Graph
    plan: QuantPlan
    samples: Sequence[dict[str, np.ndarray]]
    ranges: dict[str, tuple[float, float]]
    params: dict[str, QParams]
    stats: dict[str, Any] = field(default_factory=dict)


def calibrate_int8(graph: Graph, q: QuantOptions, *, progress: bool = True) -> Calibration:
    """Plan the int8 regions and calibrate their activations (or read ``--scales``); no graph edits."""
    from compiler.calibration.methods import parse_calib_method
    from compiler.quant.calibrate import calibrate_stream
    from compiler.quant.scales_file import read_scales

    _check(q)
    float_graph = graph.clone()
    plan = make_plan(graph, q.keep_float, float_tail=True, policy_rules=q.policy_rules)
    samples = load_samples(graph, q)
    ranges: dict[str, tuple[float, float]] = {}
    stats: dict[str, Any] = {}
    if q.scales is not None:
        params = read_scales(q.scales)
    else:
        method = parse_calib_method(q.calib_method)
        result = calibrate_stream(
            graph,
            plan.observe,
            samples,
            method,
            symmetric=q.symmetric_activations,
            runtime=q.calib_runtime,
            progress=progress,
        )
        ranges = result.ranges
        # whole MiB, rounded up: the manifest stays byte-identical across runs
        stats = {"method": method.spec(), "peak_memory_mib": -(-result.peak_bytes // (1 << 20))}
        if result.choices:
            stats["auto_choices"] = result.choice_counts()
        if result.full_ranges:  # entropy: each KL clip is kept only where no output pays for it
            from compiler.quant.clip_check import check_clipped_ranges

            check = check_clipped_ranges(
                float_graph,
                plan,
                ranges,
                result.full_ranges,
                samples,
                dtype=q.act_dtype,
                symmetric=q.symmetric_activations,
                per_channel=q.per_channel,
            )
            ranges = check.ranges
            stats["entropy_check"] = check.as_json()
        params = activation_params(graph, ranges, q.act_dtype, symmetric=q.symmetric_activations)
    return Calibration(float_graph, plan, samples, ranges, params, stats)


def apply_int8(
    graph: Graph,
    cal: Calibration,
    q: QuantOptions,
    *,
    progress: bool = True,
    holdout: list[dict[str, np.ndarray]] | None = None,
) -> QuantOutcome:
    """Analyse on clones (bias correction, sensitivity, the SQNR floor), then put ``graph`` in QDQ form.

    ``holdout``: samples (``--inputs``) on which the floor is measured too, apart from calibration's.
    """
    outcome = QuantOutcome(cal.float_graph, cal.plan, cal.ranges, cal.params, QdqResult(), cal.samples)
    outcome.calibration = dict(cal.stats)
    try:
        final = _analyse(outcome, q, progress, holdout or [])
        _apply_biases(graph, outcome.biases, final.nodes)
        outcome.result = insert_qdq(graph, final, cal.params, per_channel=q.per_channel)
    except MissingScaleError as exc:
        raise KilnError(f"{q.scales or 'calibration'}: {exc.args[0]}") from None
    outcome.plan = final
    outcome.report = summary(outcome, q)
    return outcome


def quantize_int8(
    graph: Graph,
    q: QuantOptions,
    *,
    progress: bool = True,
    holdout: list[dict[str, np.ndarray]] | None = None,
) -> QuantOutcome:
    """Quantize ``graph`` in place (QDQ) and return what was decided (calibrate, then apply)."""
    cal = calibrate_int8(graph, q, progress=progress)
    outcome = apply_int8(graph, cal, q, progress=progress, holdout=holdout)
    from compiler.pass_manager import PassManager

    PassManager(["eliminate-dead-nodes"]).run(graph)  # the float weights that were replaced
    return outcome


def _apply_biases(graph: Graph, biases: Mapping[int, np.ndarray], nodes: list[int]) -> None:
    if biases:
        from compiler.quant.bias_correction import apply_bias_corrections

        apply_bias_corrections(graph, biases, nodes)


def _analyse(outcome: QuantOutcome, q: QuantOptions, progress: bool, holdout: Sequence[Sample]) -> QuantPlan:
    """Bias correction, admission, sensitivity and the SQNR floor on clones; returns the final plan."""
    from compiler.quant.sensitivity import compute_sensitivity, evaluation_samples, quantized_graph

    fg, params = outcome.float_graph, outcome.params
    if q.bias_correction:
        from compiler.quant.bias_correction import correction_summary, estimate_bias_corrections

        outcome.biases = estimate_bias_corrections(
            fg, outcome.plan, params, outcome.samples, per_channel=q.per_channel
        )
        outcome.bias_summary = correction_summary(fg, outcome.biases)
    ev: list[Sample] = evaluation_samples(outcome.samples) if outcome.samples else []
    floor = q.floor_db
    outcome.floor = {"min_sqnr_db": floor, "default": q.floor and q.min_sqnr is None, "strict": q.strict}
    if not q.sensitivity or not (ev or holdout):
        why = "--no-sensitivity" if not q.sensitivity else "no calibration samples or --inputs"
        outcome.floor["action"] = "off" if floor is None else f"not measured ({why})"
        if floor is not None:
            log.warning("int8 SQNR floor %g dB not measured: %s", floor, why)
        outcome.plan, outcome.forms = choose_forms(fg, outcome.plan, params, [], floor)
        return outcome.plan
    base, held = (ev, holdout) if ev else (list(holdout), [])
    outcome.floor["measured_on"] = {"calibration_samples": len(ev), "inputs_samples": len(holdout)}
    if outcome.plan.by_rule:
        from compiler.quant.admission import admit_by_measurement

        outcome.plan, outcome.admitted = admit_by_measurement(
            fg, outcome.plan, params, base, floor, per_channel=q.per_channel, biases=outcome.biases
        )
    outcome.plan, outcome.forms = choose_forms(
        fg, outcome.plan, params, base, floor, per_channel=q.per_channel, biases=outcome.biases
    )
    plan = outcome.plan
    full = quantized_graph(fg, plan, plan.nodes, params, q.per_channel, outcome.biases)
    outcome.sensitivity = compute_sensitivity(
        fg,
        plan,
        params,
        base,
        per_channel=q.per_channel,
        quantized=full,
        biases=outcome.biases,
        progress=progress,
    )
    if floor is None:
        outcome.floor["action"] = "off"
        return plan
    from compiler.quant.mixed_precision import choose_fallback

    fb = choose_fallback(
        fg,
        plan,
        params,
        base,
        outcome.sensitivity,
        floor,
        per_channel=q.per_channel,
        biases=outcome.biases,
        holdout=held,
        search=not q.strict,
    )
    outcome.floor["all_int8_worst_db"] = round(fb.worst_before_db, 4)
    if q.strict and fb.worst_before_db < floor:
        outcome.floor["action"] = "failed (--strict)"
        raise SqnrFloorMissed(_missed(fb.before, fb.holdout_before, floor))
    outcome.fallback = fb
    outcome.floor["worst_db"] = round(fb.worst_db, 4)
    outcome.floor["action"] = (
        "met" if not fb.float_layers else f"fell back: {len(fb.float_layers)} layer(s) to float"
    )
    gone = set(fb.float_nodes)
    skipped = dict(plan.skipped)
    for nid in fb.float_nodes:
        skipped[node_label(fg.node(nid))] = f"sent back to float by the SQNR floor {floor:g} dB"
    return dataclasses.replace(plan, nodes=[n for n in plan.nodes if n not in gone], skipped=skipped)


def _missed(calib: Mapping[str, Score], inputs: Mapping[str, Score], floor: float) -> str:
    """The --strict failure: each sample set's worst output and its SQNR."""
    parts = []
    for what, scores in (("calibration samples", calib), ("--inputs", inputs)):
        if scores:
            name, s = min(scores.items(), key=lambda kv: kv[1].sqnr_db)
            parts.append(f"output {name!r} {s.sqnr_db:.2f} dB on the {what}")
    return (
        f"int8 misses the SQNR floor of {floor:g} dB ({'; '.join(parts)}); --strict refuses to fall "
        "back to float (drop --strict to send layers back to float, or --min-sqnr off)"
    )


def summary(outcome: QuantOutcome, q: QuantOptions) -> dict[str, Any]:
    """The manifest's view of the quantization (numbers rounded, so the text is deterministic)."""
    doc: dict[str, Any] = {
        "options": q.manifest_view(),
        "quantized_nodes": len(outcome.result.quantized_nodes),
        "float_nodes": dict(sorted(outcome.plan.skipped.items())),
        "calibration_samples": len(outcome.samples),
    }
    if outcome.calibration:
        doc["calibration"] = dict(outcome.calibration)
    if q.bias_correction:
        doc["bias_correction"] = dict(outcome.bias_summary)
    sens = outcome.sensitivity
    if sens is not None:
        doc["evaluation_samples"] = sens.samples
        doc["sensitivity"] = sens.layers_json()
        doc["full_model"] = {k: s.as_json() for k, s in outcome.final_scores.items()}
        doc["all_int8"] = sens.full_json()
        doc["float_fallback"] = list(outcome.fallback.float_layers) if outcome.fallback else []
    if outcome.fallback is not None:
        doc["mixed_precision"] = outcome.fallback.as_json()
    doc["sqnr_floor"] = dict(outcome.floor)
    if outcome.plan.by_rule:
        rules: dict[str, int] = {}
        for name in outcome.plan.by_rule.values():
            rules[name] = rules.get(name, 0) + 1
        doc["policy"] = {"kept_float_by_rule": dict(sorted(rules.items())), "admitted": outcome.admitted}
    if outcome.forms:
        doc.setdefault("policy", {})["forms"] = {c.name: c.as_json() for c in outcome.forms}
    return doc


def activation_table(params: Mapping[str, QParams]) -> dict[str, dict[str, object]]:
    """Activation parameters as JSON."""
    return {k: p.as_json() for k, p in params.items()}
