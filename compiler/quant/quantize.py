"""The int8 quantization step of the driver: plan, calibrate, choose scales, insert QDQ.

plan    = make_plan(graph, keep_float)            # registry policies decide
ranges  = calibrate(graph, plan.observe, samples)  # or read --scales FILE
params  = activation_params(ranges)                # (s, z) per activation
insert_qdq(graph, plan, params)                    # int8 weights, int32 bias, QDQ pairs
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import KilnError, OptionError
from compiler.ir.graph import Graph
from compiler.quant.options import QuantOptions
from compiler.quant.params import QParams
from compiler.quant.plan import QuantPlan, make_plan
from compiler.quant.qdq import MissingScaleError, QdqResult, activation_params, insert_qdq

__all__ = ["QuantOutcome", "quantize_int8", "load_samples"]

log = logging.getLogger(__name__)


@dataclass
class QuantOutcome:
    """Everything the int8 step produced, for artifacts, reports and the manifest."""

    float_graph: Graph
    plan: QuantPlan
    ranges: dict[str, tuple[float, float]]
    params: dict[str, QParams]
    result: QdqResult
    samples: list[dict[str, np.ndarray]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)


def load_samples(graph: Graph, q: QuantOptions) -> list[dict[str, np.ndarray]]:
    """The calibration samples named by the options."""
    from compiler.calibration.dataset import load_calibration

    if q.calib is None:
        return []
    return load_calibration(q.calib, graph.input_types(), count=q.calib_count, preprocess=q.preprocess)


def quantize_int8(graph: Graph, q: QuantOptions, *, progress: bool = True) -> QuantOutcome:
    """Quantize ``graph`` in place (QDQ) and return what was decided."""
    from compiler.calibration.methods import parse_calib_method
    from compiler.quant.calibrate import calibrate
    from compiler.quant.scales_file import read_scales

    if q.calib is None and q.scales is None:
        raise OptionError(
            "--quantize int8 needs calibration data (--calib DATA) or a scales file (--scales FILE)"
        )
    float_graph = graph.clone()
    plan = make_plan(graph, q.keep_float)
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
    try:
        result = insert_qdq(graph, plan, params, per_channel=q.per_channel)
    except MissingScaleError as exc:
        raise KilnError(f"{q.scales or 'calibration'}: {exc.args[0]}") from None
    from compiler.pass_manager import PassManager

    PassManager(["eliminate-dead-nodes"]).run(graph)  # the float weights that were replaced
    outcome = QuantOutcome(float_graph, plan, ranges, params, result, samples)
    outcome.report = summary(outcome, q)
    return outcome


def summary(outcome: QuantOutcome, q: QuantOptions) -> dict[str, Any]:
    """The manifest's view of the quantization."""
    return {
        "options": q.manifest_view(),
        "quantized_nodes": len(outcome.result.quantized_nodes),
        "float_nodes": dict(sorted(outcome.plan.skipped.items())),
        "calibration_samples": len(outcome.samples),
    }


def activation_table(params: Mapping[str, QParams]) -> dict[str, dict[str, object]]:
    """Activation parameters as JSON."""
    return {k: p.as_json() for k, p in params.items()}
