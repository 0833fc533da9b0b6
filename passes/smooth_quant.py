"""smooth-quant: migrate activation outliers into weights before int8 (``--smoothquant off|auto|ALPHA``).

For an activation X read only by MatMul/Gemm layers with constant weights,
X W = (X diag(s)^-1)(diag(s) W) with s_j = max|X_j|^α / max|W_j|^(1-α): diag(s)^-1 is folded into
X's producer (LayerNorm γ and β, a per-channel Mul/Add, a linear layer's output columns, also
through reshapes, transposes and attention's probabilities x V: V's projection for out_proj) and
diag(s) into the readers' weight rows, so no op is added and the float model is unchanged up to
float32 rounding. α is fixed, or searched per group on the calibration samples by the readers'
int8 output error with q_x on the ``--calib-method`` range (:mod:`compiler.quant.smoothquant`).
Off (the default), the pass changes nothing.
What it did is left in ``ctx.state["smooth-quant"]`` (a :class:`SmoothReport`) for the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir.graph import Graph
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult, Rewriter
from passes.calibrate import quant_options

__all__ = ["SmoothQuant"]


@register_pass
@dataclass(frozen=True)
class SmoothQuant(Pass):
    """Fold SmoothQuant scales into producers and readers (a no-op unless --smoothquant is on)."""

    name = "smooth-quant"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        from compiler.calibration.methods import parse_calib_method
        from compiler.quant.quantize import load_samples
        from compiler.quant.smoothquant import smooth_quant

        q = quant_options(ctx, self.name)
        if q.smoothquant == "off":
            return PassResult()
        with Rewriter(graph) as rw:
            ctx.state[self.name] = smooth_quant(
                graph,
                q.smooth_alpha,
                load_samples(graph, q),
                act_dtype=q.act_dtype,
                symmetric=q.symmetric_activations,
                per_channel=q.per_channel,
                method=parse_calib_method(q.calib_method),
            )
        return rw.result
