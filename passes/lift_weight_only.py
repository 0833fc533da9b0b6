"""lift-weight-only: onnxruntime's MatMulNBits / GatherBlockQuantized become Kiln's weight-only ops.

MatMulNBits(A, B, s, zp, bias) = kiln::WeightOnlyMatMul(A, u - 2^(bits-1), s, zp - 2^(bits-1), bias)
and GatherBlockQuantized(data, i, s, zp) = kiln::WeightOnlyGather(u - 2^(bits-1), i, s, zp - 2^(bits-1)),
u the unpacked unsigned levels: the exact inverse of the Kiln ops' ``expand`` (the math is in
:mod:`passes.decompositions.ort_weight_only`). Run in the canonicalize stage so that every backend
sees one form of a weight-only layer, whether Kiln or onnxruntime quantized the model. A node whose
packed weights are not constants is left as it is (a near miss naming it).
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir.graph import Graph
from compiler.ops.matmul_nbits import ORT_DOMAIN
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter
from passes.decompositions import Decomposition
from passes.decompositions.ort_weight_only import GATHER_BLOCK_QUANTIZED_LIFT, MATMUL_NBITS_LIFT

__all__ = ["LiftWeightOnly", "LiftRule"]


class LiftRule(Rule):
    """One onnxruntime weight-only op -> its Kiln form, through its lift decomposition."""

    def __init__(self, op: str, lift: Decomposition) -> None:
        self.name = lift.name
        self.pattern = Op(op, domain=ORT_DOMAIN)
        self.lift = lift

    def check(self, graph: Graph, m: Match) -> str | None:
        if m.root.domain != ORT_DOMAIN:
            return "not onnxruntime's op"
        return self.lift.check(graph, m.root)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        self.lift.rewrite(rw, rw.graph, m.root)


@register_pass
@dataclass(frozen=True)
class LiftWeightOnly(Pass):
    """Lift MatMulNBits and GatherBlockQuantized with constant weights into kiln::WeightOnly*."""

    name = "lift-weight-only"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        rules = [
            LiftRule("MatMulNBits", MATMUL_NBITS_LIFT),
            LiftRule("GatherBlockQuantized", GATHER_BLOCK_QUANTIZED_LIFT),
        ]
        return apply_rules(graph, rules, near_misses=ctx.near_misses)
