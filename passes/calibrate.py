"""calibrate: plan the int8 regions and measure activation ranges; the graph is not edited.

For every activation a the plan observes, over the calibration samples X:
range(a) = method({a(x) : x in X}) (minmax, percentile, entropy or mse), then
(s_a, z_a) = grid(range(a)) for the activation dtype (or both read from ``--scales``).
The result (a :class:`~compiler.quant.quantize.Calibration`) is left in ``ctx.state["calibrate"]``
for ``quantize-int8``. Options come from ``ctx.options.quant`` (``--quantize int8 --calib ...``).
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.errors import OptionError
from compiler.ir.graph import Graph
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.quant.options import QuantOptions
from compiler.rewriter import PassResult

__all__ = ["Calibrate", "quant_options"]


def quant_options(ctx: PassContext, pass_name: str) -> QuantOptions:
    """The int8 options the compile carries, or an OptionError naming the pass."""
    q = getattr(ctx.options, "quant", None)
    if not isinstance(q, QuantOptions) or q.mode != "int8":
        raise OptionError(f"pass {pass_name!r} needs --quantize int8 options")
    return q


@register_pass
@dataclass(frozen=True)
class Calibrate(Pass):
    """Calibrate activation ranges into ``ctx.state["calibrate"]`` (no graph edits)."""

    name = "calibrate"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        from compiler.quant.quantize import calibrate_int8

        q = quant_options(ctx, self.name)
        progress = bool(getattr(ctx.options, "progress", False))
        ctx.state[self.name] = calibrate_int8(graph, q, progress=progress)
        return PassResult()
