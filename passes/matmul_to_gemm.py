"""matmul-to-gemm: a MatMul by a constant weight over the rows of an N-D input as one Gemm.

For A of shape [d1, ..., dr-1, K] (r >= 3), a constant 2-D W [K, N] and an optional constant
bias b of N values (broadcast along the last axis only), with P = d1 * ... * dr-1:

    MatMul(A, W) + b = Reshape(Gemm(Reshape(A, [P, K]), W, b), [d1, ..., dr-1, N])

exactly (the same dot products, and the bias added once per output). A backend whose fully
connected layer carries its bias then needs no separate broadcast Add (canonicalize does the
same for 2-D A). With ``image=1`` the rows go through MNN's image form of a fully connected
layer, Reshape(A, [P, K, 1, 1]) -> Reshape(.., [P, K]): MNN's Gemm lowering then reads the
[P, K, 1, 1] tensor directly as its 1x1 convolution's input, and every MatMul of the same A
(attention's query, key and value projections) shares those two Reshapes, so A is packed for
MNN's convolution once instead of once per MatMul.

The bias rule runs first, so a MatMul is rewritten without its bias only when no Add takes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Value
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["MatMulToGemm", "MatMulRows", "matmul_reason", "bias_reason"]


def matmul_reason(graph: Graph, m: Match) -> str | None:
    """None when the bound MatMul(x, w) multiplies an N-D float x (N >= 3) by a constant 2-D w."""
    x, w = m.value("x"), m.value("w").const
    if not x.type.dtype.is_float:
        return "MatMul is not float"
    if w is None:
        return "W is not constant"
    if w.ndim != 2:
        return f"W is {w.ndim}-D, not 2-D"
    if not x.type.is_static or len(x.type.static_shape) < 3:
        return "input is not a static N-D tensor (N >= 3; 2-D is canonicalize's Gemm)"
    return None


def bias_reason(m: Match) -> str | None:
    """None when the bound constant b adds N values along the last axis of the MatMul's output."""
    b = m.value("b").const
    if b is None:
        return "b is not constant"
    shape = m.node("matmul").output_types[0].static_shape
    n = shape[-1]
    if b.ndim > len(shape) or any(d != 1 for d in b.shape[:-1]):
        return f"b of shape {list(b.shape)} does not broadcast along the last axis only"
    if b.ndim and b.shape[-1] not in (1, n):
        return f"b of shape {list(b.shape)} does not broadcast to [{n}]"
    same = m.root.output_types[0] == m.node("matmul").output_types[0]
    return None if same else "b broadcasts the output"


class MatMulRows(Rule):
    """MatMul(A, W) (+ b) = Reshape(Gemm(Reshape(A, [P, K]), W, b), [..., N])."""

    def __init__(self, with_bias: bool, image: bool) -> None:
        matmul = Op("MatMul", (Any_("x"), Any_("w")), name="matmul")
        self.pattern = Op("Add", (matmul, Any_("b")), commutative=True) if with_bias else matmul
        self.name = "matmul-bias-to-gemm" if with_bias else "matmul-to-gemm"
        self.with_bias = with_bias
        self.image = image

    def check(self, graph: Graph, m: Match) -> str | None:
        return matmul_reason(graph, m) or (bias_reason(m) if self.with_bias else None)

    def _rows(self, rw: Rewriter, x: Value) -> Value:
        """Reshape(x, [P, K]) (through [P, K, 1, 1] with ``image``), shared by x's MatMuls."""
        shape = x.type.static_shape
        rows = (int(np.prod(shape[:-1], dtype=np.int64)), shape[-1])
        chain = [(*rows, 1, 1), rows] if self.image else [rows]
        v = x
        for want in chain:
            v = _reshaped(rw, v, want)
        return v

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        x, w = m.value("x"), m.value("w")
        a = self._rows(rw, x)
        inputs = [a, w]
        if self.with_bias:
            b = m.value("b").const
            assert b is not None
            n = int(np.asarray(w.const).shape[1])
            inputs.append(
                rw.const(np.ascontiguousarray(np.broadcast_to(b.reshape(-1), (n,))), m.value("b").name)
            )
        name = m.root.name or m.root.output_names[0]
        gemm = rw.op("Gemm", inputs, name=f"{name}__gemm")
        out_shape = np.asarray(m.root.output_types[0].static_shape, np.int64)
        out = rw.op("Reshape", [gemm, rw.const(out_shape, f"{name}__shape")], like=m.root)
        rw.replace(rw.graph.value(m.root), out, take_name=True)


def _reshaped(rw: Rewriter, v: Value, shape: tuple[int, ...]) -> Value:
    """An existing Reshape of ``v`` to the static ``shape``, else a new one."""
    g = rw.graph
    for user, port in g.users(v):
        if (
            user.op == "Reshape"
            and not user.domain
            and port == 0
            and user.output_types[0].static_shape == shape
        ):
            return g.value(user)
    target = rw.const(np.asarray(shape, np.int64), f"{v.name}__rows{len(shape)}d")
    return rw.op("Reshape", [v, target], name=f"{v.name}__rows{len(shape)}d")


@register_pass
@dataclass(frozen=True)
class MatMulToGemm(Pass):
    """Rewrite MatMul by a constant 2-D weight over N-D rows (and its bias Add) into Gemm.

    Attributes:
        image: route the rows through [P, K, 1, 1] (MNN's fully connected input form).
    """

    name = "matmul-to-gemm"
    image: bool = False

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        result = apply_rules(graph, [MatMulRows(True, self.image)], near_misses=ctx.near_misses)
        result.merge(apply_rules(graph, [MatMulRows(False, self.image)], near_misses=ctx.near_misses))
        return result
