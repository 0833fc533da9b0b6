"""The int8 quantization step of the driver: plan, calibrate, choose scales, analyse, insert QDQ.

plan    = make_plan(graph, keep_float)             # registry policies decide
ranges  = calibrate(graph, plan.observe, samples)  # or read --scales FILE
params  = activation_params(ranges)                # (s, z) per activation
biases  = estimate_bias_corrections(...)           # --bias-correction: b' = b - E[ỹ - y]
report  = compute_sensitivity(...)                 # each layer alone; the full int8 model
floats  = choose_fallback(report, --min-sqnr)      # layers back to float until the target holds
insert_qdq(graph, plan - floats, params)           # int8 weights, int32 bias, QDQ pairs

The analysis runs on clones of the float graph; ``graph`` itself is rewritten once, at the
end, with the final plan, so it equals a fresh clone of the float graph put in QDQ form.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import KilnError, OptionError
from compiler.ir.graph import Graph
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
]

log = logging.getLogger(__name__)


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
    samples: list[dict[str, np.ndarray]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    sensitivity: SensitivityReport | None = None
    fallback: FallbackResult | None = None
    biases: dict[int, np.ndarray] = field(default_factory=dict)
    bias_summary: dict[str, float] = field(default_factory=dict)

    @property
    def final_scores(self) -> dict[str, Score]:
        """Per-output scores of the emitted model (after any fallback)."""
        if self.fallback is not None:
            return self.fallback.after
        return self.sensitivity.full_model if self.sensitivity is not None else {}


def load_samples(graph: Graph, q: QuantOptions) -> list[dict[str, np.ndarray]]:
    """The calibration samples named by the options."""
    from compiler.calibration.dataset import load_calibration

    if q.calib is None:
        return []
    return load_calibration(q.calib, graph.input_types(), count=q.calib_count, preprocess=q.preprocess)


def _check(q: QuantOptions) -> None:
    if q.calib is None and q.scales is None:
        raise OptionError(
            "--quantize int8 needs calibration data (--calib DATA) or a scales file (--scales FILE)"
        )
    if q.min_sqnr is not None:
        if not math.isfinite(q.min_sqnr) or q.min_sqnr >= SQNR_CAP:
            raise OptionError(f"--min-sqnr {q.min_sqnr}: must be a finite number of dB below {SQNR_CAP:g}")
        if not q.sensitivity:
            raise OptionError("--min-sqnr needs the sensitivity analysis; drop --no-sensitivity")
        if q.calib is None:
            raise OptionError("--min-sqnr measures SQNR on calibration samples: give --calib DATA")
    if q.bias_correction and q.calib is None:
        raise OptionError(
            "--bias-correction estimates the bias shift on calibration samples: give --calib DATA"
        )


@dataclass
class Calibration:
    """What calibration decided, before any graph edit: the plan, the samples, ranges and (s, z)."""

    float_graph: Graph
    plan: QuantPlan
    samples: list[dict[str, np.ndarray]]
    ranges: dict[str, tuple[float, float]]
    params: dict[str, QParams]


def calibrate_int8(graph: Graph, q: QuantOptions, *, progress: bool = True) -> Calibration:
    """Plan the int8 regions and calibrate their activations (or read ``--scales``); no graph edits."""
    from compiler.calibration.methods import parse_calib_method
    from compiler.quant.calibrate import calibrate
    from compiler.quant.scales_file import read_scales

    _check(q)
    float_graph = graph.clone()
    plan = make_plan(graph, q.keep_float, float_tail=True)
    samples = load_samples(graph, q)
    ranges: dict[str, tuple[float, float]] = {}
    if q.scales is not None:
        params = read_scales(q.scales)
    else:
        method = parse_calib_method(q.calib_method)
        ranges = calibrate(
            graph,
            plan.observe,
            samples,
            method,
            symmetric=q.symmetric_activations,
            runtime=q.calib_runtime,
            progress=progress,
        )
        params = activation_params(graph, ranges, q.act_dtype, symmetric=q.symmetric_activations)
    return Calibration(float_graph, plan, samples, ranges, params)


def apply_int8(graph: Graph, cal: Calibration, q: QuantOptions, *, progress: bool = True) -> QuantOutcome:
    """Analyse on clones (bias correction, sensitivity, --min-sqnr), then put ``graph`` in QDQ form."""
    outcome = QuantOutcome(cal.float_graph, cal.plan, cal.ranges, cal.params, QdqResult(), cal.samples)
    try:
        final = _analyse(outcome, q, progress)
        _apply_biases(graph, outcome.biases, final.nodes)
        outcome.result = insert_qdq(graph, final, cal.params, per_channel=q.per_channel)
    except MissingScaleError as exc:
        raise KilnError(f"{q.scales or 'calibration'}: {exc.args[0]}") from None
    outcome.plan = final
    outcome.report = summary(outcome, q)
    return outcome


def quantize_int8(graph: Graph, q: QuantOptions, *, progress: bool = True) -> QuantOutcome:
    """Quantize ``graph`` in place (QDQ) and return what was decided (calibrate, then apply)."""
    outcome = apply_int8(graph, calibrate_int8(graph, q, progress=progress), q, progress=progress)
    from compiler.pass_manager import PassManager

    PassManager(["eliminate-dead-nodes"]).run(graph)  # the float weights that were replaced
    return outcome


def _apply_biases(graph: Graph, biases: Mapping[int, np.ndarray], nodes: list[int]) -> None:
    if biases:
        from compiler.quant.bias_correction import apply_bias_corrections

        apply_bias_corrections(graph, biases, nodes)


def _analyse(outcome: QuantOutcome, q: QuantOptions, progress: bool) -> QuantPlan:
    """Bias correction, sensitivity and mixed precision on clones; returns the final plan."""
    from compiler.quant.sensitivity import compute_sensitivity, evaluation_samples, quantized_graph

    fg, plan, params = outcome.float_graph, outcome.plan, outcome.params
    if q.bias_correction:
        from compiler.quant.bias_correction import correction_summary, estimate_bias_corrections

        outcome.biases = estimate_bias_corrections(
            fg, plan, params, outcome.samples, per_channel=q.per_channel
        )
        outcome.bias_summary = correction_summary(fg, outcome.biases)
    ev = evaluation_samples(outcome.samples)
    if not (q.sensitivity or q.min_sqnr is not None) or not ev:
        if q.sensitivity:
            log.info("no calibration samples (--scales only): sensitivity analysis skipped")
        return plan
    full = quantized_graph(fg, plan, plan.nodes, params, q.per_channel, outcome.biases)
    outcome.sensitivity = compute_sensitivity(
        fg,
        plan,
        params,
        ev,
        per_channel=q.per_channel,
        quantized=full,
        biases=outcome.biases,
        progress=progress,
    )
    if q.min_sqnr is None:
        return plan
    from compiler.quant.mixed_precision import choose_fallback

    outcome.fallback = choose_fallback(
        fg,
        plan,
        params,
        ev,
        outcome.sensitivity,
        q.min_sqnr,
        per_channel=q.per_channel,
        biases=outcome.biases,
    )
    gone = set(outcome.fallback.float_nodes)
    skipped = dict(plan.skipped)
    for nid in outcome.fallback.float_nodes:
        skipped[node_label(fg.node(nid))] = f"sent back to float by --min-sqnr {q.min_sqnr:g}"
    return dataclasses.replace(plan, nodes=[n for n in plan.nodes if n not in gone], skipped=skipped)


def summary(outcome: QuantOutcome, q: QuantOptions) -> dict[str, Any]:
    """The manifest's view of the quantization (numbers rounded, so the text is deterministic)."""
    doc: dict[str, Any] = {
        "options": q.manifest_view(),
        "quantized_nodes": len(outcome.result.quantized_nodes),
        "float_nodes": dict(sorted(outcome.plan.skipped.items())),
        "calibration_samples": len(outcome.samples),
    }
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
    return doc


def activation_table(params: Mapping[str, QParams]) -> dict[str, dict[str, object]]:
    """Activation parameters as JSON."""
    return {k: p.as_json() for k, p in params.items()}
