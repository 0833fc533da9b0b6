"""normalize-gemm: one canonical Gemm, so that backends need no Gemm variants of their own.

Gemm(A, B, C; transA, transB, alpha, beta) = alpha * A' @ B' + beta * C, with A' = A^T if transA
and B' = B^T if transB. The canonical form is

    Gemm(A'', B'', C''; transA=0, transB=t, alpha=1, beta=1),   t = ``trans_b`` (default 1),

with A'' = A' (a transposed constant, or Transpose(A, [1, 0])), B'' = alpha * B' stored as
[N, K] when t = 1 (PyTorch Linear's layout, what MNN's FullyConnected rows and TVM's dense
kernel read) or [K, N] when t = 0 (a transposed constant or a Transpose node, alpha folded
into a constant or applied by Mul), and C'' = beta * C (folded into a constant or a Mul;
dropped when beta = 0).

Exact in real arithmetic; transposes are bit-exact, and folding alpha or beta is bit-exact
when they are powers of two (else one rounding per weight, computed in float64).

A B that is a dequantized int8 weight (DequantizeLinear of a constant: the QDQ form the
backends' integer kernels read) keeps its layout (transB as given) and refuses alpha != 1, so
the weight stays one DequantizeLinear of a constant. Backends accept any Gemm with
:func:`canonical_gemm_reason` None: transA = 0, alpha = 1, beta = 1, transB either way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Match, Op, OpMismatch, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["NormalizeGemm", "GemmToCanonical", "canonical_gemm_reason"]


def _transposed(rw: Rewriter, v: Value, name: str) -> Value:
    """v^T: a transposed constant, or a Transpose node."""
    if v.const is not None:
        return rw.const(np.ascontiguousarray(v.const.T), name)
    return rw.op("Transpose", [v], {"perm": (1, 0)}, name=name)


def _scaled(rw: Rewriter, v: Value, k: float, name: str) -> Value:
    """k * v: a scaled constant (float64, cast back), or a Mul by a scalar constant."""
    dt = v.type.dtype.numpy
    if v.const is not None:
        return rw.const((v.const.astype(np.float64) * k).astype(dt), name)
    return rw.op("Mul", [v, rw.const(np.array(k, dt), f"{name}_k")], name=name)


def canonical_gemm_reason(node: Node) -> str | None:
    """None for a Gemm in the form every backend reads (transA = 0, alpha = beta = 1), else why not."""
    a = node.attrs
    if a.transA or a.alpha != 1.0 or a.beta != 1.0:
        return "Gemm with transA, alpha or beta (normalize-gemm rewrites it, unless B is dequantized)"
    return None


def _dequantized(v: Value) -> bool:
    return v.const is None and v.producer.op == "DequantizeLinear" and not v.producer.domain


class GemmToCanonical(Rule):
    """Gemm(A, B, C; tA, tB, alpha, beta) = Gemm(A', alpha * B' (as [N,K] or [K,N]), beta * C)."""

    name = "normalize-gemm"
    pattern = Op("Gemm", (Any_("a"), Any_("b"), Any_("c", optional=True)))

    def __init__(self, trans_b: int = 1) -> None:
        self.trans_b = trans_b

    def check(self, graph: Graph, m: Match) -> str | None:
        a = m.root.attrs
        c = m.values.get("c")
        if not m.value("a").type.dtype.is_float:
            return "Gemm is not float"
        flip = bool(a.transB) != bool(self.trans_b) and not _dequantized(m.value("b"))
        if _dequantized(m.value("b")) and a.alpha != 1.0:
            return "B is a dequantized weight: alpha would not stay in its grid"
        if not (a.transA or flip or a.alpha != 1.0 or (c is not None and a.beta != 1.0)):
            return OpMismatch("already canonical")
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        node, a = m.root, m.root.attrs
        base = node.output_names[0]
        x, w, c = m.value("a"), m.value("b"), m.values.get("c")
        if a.transA:
            x = _transposed(rw, x, f"{base}_a")
        trans_b = int(a.transB) if _dequantized(w) else self.trans_b
        if bool(a.transB) != bool(trans_b):
            w = _transposed(rw, w, f"{base}_b")
        if a.alpha != 1.0:
            w = _scaled(rw, w, float(a.alpha), f"{base}_b_alpha")
        if c is not None and a.beta == 0.0:
            c = None
        elif c is not None and a.beta != 1.0:
            c = _scaled(rw, c, float(a.beta), f"{base}_c_beta")
        attrs = dataclasses.replace(a, transA=0, transB=trans_b, alpha=1.0, beta=1.0)
        ins = [x, w] if c is None else [x, w, c]
        rw.replace(rw.graph.value(node), rw.op("Gemm", ins, attrs, like=node), take_name=True)


@register_pass
@dataclass(frozen=True)
class NormalizeGemm(Pass):
    """Rewrite every float Gemm to transA=0, transB=trans_b, alpha=1, beta=1."""

    name = "normalize-gemm"
    trans_b: int = 1

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if self.trans_b not in (0, 1):
            raise ValueError(f"normalize-gemm: trans_b must be 0 or 1, got {self.trans_b}")
        return apply_rules(graph, [GemmToCanonical(self.trans_b)], near_misses=ctx.near_misses)
