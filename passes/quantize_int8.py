"""quantize-int8: put the calibrated int8 regions of the graph in QDQ form.

With (s, z) from ``calibrate`` and weights quantized per output channel,
x -> DequantizeLinear(QuantizeLinear(x; s_x, z_x)) at every planned activation,
W -> DequantizeLinear(W_q; s_w) with W_q = round(W / s_w), b -> DequantizeLinear(b_q; s_x s_w).
Before the edit, on clones: bias correction (b' = b - E[y~ - y]) and the sensitivity analysis;
the SQNR floor (``--min-sqnr``, default 25 dB) is measured on the calibration samples and on the
``--inputs`` samples, and layers go back to float until every output's SQNR holds (``--strict``:
the pass fails instead). The outcome (plan, scores, report) is left in ``ctx.state["quantize-int8"]``
for the driver's reports and manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult, Rewriter
from passes.calibrate import quant_options

__all__ = ["QuantizeInt8"]


@register_pass
@dataclass(frozen=True)
class QuantizeInt8(Pass):
    """QDQ form of the plan that ``calibrate`` left in the context (calibrates first if it has not run)."""

    name = "quantize-int8"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        from compiler.quant.quantize import apply_int8, calibrate_int8

        q = quant_options(ctx, self.name)
        progress = bool(getattr(ctx.options, "progress", False))
        cal = ctx.state.get("calibrate") or calibrate_int8(graph, q, progress=progress)
        holdout = _inputs_samples(graph, ctx)
        with Rewriter(graph) as rw:
            outcome = apply_int8(graph, cal, q, progress=progress, holdout=holdout)
        smooth = ctx.state.get("smooth-quant")  # what smooth-quant folded before calibration
        if smooth is not None:
            outcome.smoothquant = smooth.as_json()
            outcome.report["smoothquant"] = outcome.smoothquant
        ctx.state[self.name] = outcome
        return rw.result


def _inputs_samples(graph: Graph, ctx: PassContext) -> list[dict[str, np.ndarray]]:
    """The ``--inputs`` samples of the compile (none without them: random inputs judge nothing)."""
    from compiler.input_spec import check_inputs, load_inputs

    path = getattr(ctx.options, "inputs", None)
    if path is None:
        return []
    return [check_inputs(load_inputs(path), graph.input_types(), str(path))]
