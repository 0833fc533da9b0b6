"""quantize-int8: put the calibrated int8 regions of the graph in QDQ form.

With (s, z) from ``calibrate`` and weights quantized per output channel,
x -> DequantizeLinear(QuantizeLinear(x; s_x, z_x)) at every planned activation,
W -> DequantizeLinear(W_q; s_w) with W_q = round(W / s_w), b -> DequantizeLinear(b_q; s_x s_w).
Before the edit, on clones: bias correction (b' = b - E[y~ - y]) and the sensitivity analysis;
``--min-sqnr`` sends layers back to float until every output's SQNR holds. The outcome (plan,
scores, report) is left in ``ctx.state["quantize-int8"]`` for the driver's reports and manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        with Rewriter(graph) as rw:
            ctx.state[self.name] = apply_int8(graph, cal, q, progress=progress)
        return rw.result
