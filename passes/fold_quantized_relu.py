"""fold-quantized-relu: a Relu between two quantizers of one grid is an integer clamp.

With dq(q) = (q - z) s and Q(x) = saturate(round(x / s) + z) on the same (s, z), s > 0, for an
8-bit q:

    Q(Relu(dq(q))) = max(q, z)

since Relu((q - z) s) = (max(q, z) - z) s, and fl(fl(k s) / s) rounds back to the integer k for
|k| < 2^22 (each step errs by at most 2^-24 relative, far less than 1/2). Where z is the type's
lowest value (uint8 with z = 0, the usual grid of a ReLU's input) the clamp does nothing and the
quantizer's output is q itself. Such a chain is what a residual block's int8 Add leaves behind
(Add -> Q -> DQ -> Relu -> Q): its quantize-dequantize-Relu-quantize tail costs a divide and a
round per element for nothing. The Relu and the dequantizer stay where something else reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Const, Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["FoldQuantizedRelu", "QuantizedRelu"]

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))


def _zero(z: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    return np.zeros((), dtype) if z is None else np.asarray(z).reshape(())


class QuantizedRelu(Rule):
    """Q(Relu(dq(q; s, z)); s, z) = max(q, z), = q where z is the type's minimum."""

    name = "quantized-relu"
    pattern = Op(
        "QuantizeLinear",
        (
            Op(
                "Relu",
                (Op("DequantizeLinear", (Any_("q"), Const("s"), Const("z", optional=True)), shared=True),),
                shared=True,
            ),
            Const("s2"),
            Const("z2", optional=True),
        ),
    )

    def check(self, graph: Graph, m: Match) -> str | None:
        q = m.value("q")
        dtype = q.type.dtype.numpy
        if dtype not in _INT8:
            return f"the quantized input is {dtype}, not 8-bit"
        if m.root.output_types[0].dtype.numpy != dtype:
            return "the quantizers' types differ"
        s, s2 = np.asarray(m.const("s")), np.asarray(m.const("s2"))
        if s.size != 1 or s2.size != 1:
            return "per-channel scales"
        if (
            s.astype(np.float32).reshape(()) != s2.astype(np.float32).reshape(())
            or not float(s.reshape(())) > 0
        ):
            return "the two grids' scales differ (or are not positive)"
        z, z2 = _zero(m.const("z"), dtype), _zero(m.const("z2"), dtype)
        if z.size != 1 or z2.size != 1 or int(z) != int(z2):
            return "the two grids' zero points differ"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        q = m.value("q")
        dtype = q.type.dtype.numpy
        z = _zero(m.const("z"), dtype).astype(dtype)
        out = rw.graph.value(m.root)
        if int(z) == int(np.iinfo(dtype).min):
            rw.replace(out, q)
            return
        rw.replace(out, rw.op("Max", [q, rw.const(z, "relu_zero_point")], like=m.root), take_name=True)


@register_pass
@dataclass(frozen=True)
class FoldQuantizedRelu(Pass):
    """Fold Q(Relu(dq(q))) on one grid into max(q, z) (or q)."""

    name = "fold-quantized-relu"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return apply_rules(graph, [QuantizedRelu()], near_misses=ctx.near_misses)
