"""mnn-gptq-weights: GPTQ rounding of MNN's weight-only int8/int4 levels, as a legalization pass.

With ``--emit mnn --mnn-weights int8|int4 --calib DATA`` (no ``--quantize``), each weight layer's
integer levels on MNN's own grid are chosen by GPTQ, min ||(W - W_hat) X||_F over the layer's
calibration inputs X, instead of nearest rounding (the math is in :mod:`backends.mnn.gptq_weights`);
the fp16 fallback plan is then measured on those levels. The graph is not edited: the weight plan
(per-node storage and what it measured) is left in ``ctx.state["mnn-gptq-weights"]`` for the writer
(node ids are the legalized graph's, the graph the writer gets). Without ``--calib``, and during
the preflight, it does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir.graph import Graph
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult

__all__ = ["MnnGptqWeights"]


@register_pass
@dataclass(frozen=True)
class MnnGptqWeights(Pass):
    """The GPTQ weight plan of MNN int8/int4 weights into ``ctx.state["mnn-gptq-weights"]`` (no edits)."""

    name = "mnn-gptq-weights"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        from backends.mnn.emit import mnn_options_of, plan_feeds
        from backends.mnn.gptq_weights import gptq_plan

        options = ctx.options
        if ctx.preflight or options is None:
            return PassResult()
        mnn = mnn_options_of(options)
        if mnn.calib is None or options.quant is not None:  # (--quantize with it: refused by the emitter)
            return PassResult()
        plan = gptq_plan(graph, mnn, plan_feeds(graph, options, mnn), options.model.name)
        ctx.state[self.name] = plan
        return PassResult()
