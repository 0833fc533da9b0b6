"""Gelu (erf form) as vectorized MNN kernels: a sigmoid of a rational function.

    Gelu(x) = x * Phi(x),   Phi(x) = 1/2 * (1 + erf(x / sqrt(2)))

Phi = sigmoid(g) with g = logit(Phi) odd, so g(x) = x * h(x^2), and h is approximated by a
[2/2] rational function of s = x^2 with real negative zeros and poles, written in partial fractions:

    h(s) = C (s + r1)(s + r2) / ((s + d1)(s + d2)) = C + A/(s + d1) + B/(s + d2)
    Gelu(x) ~ x * sigmoid(x * h(x^2))

(fitted minimax on the Gelu error; C = 6.35207, r = 13.5141, 7.16535, d = 58.1909, 6.62363). In
float32 the result is within 1.7e-6 of the exact Gelu for every x (relative 1.5e-6 of max(1, |y|),
measured over [-20, 20] in steps of 2e-5; |x| > 20 saturates the sigmoid), h stays in [1.5958, 6.36]
and s + d > 0, so no value overflows or divides by zero: for |x| > 1.8e19, s = inf gives
h = C. MNN's SIGMOID stops at 1.6e-38 rather than 0 (observed), so for x < -20, y = x * 1.6e-38
instead of -0 (-1.6e-18 at x = -1e20, -4.9 at x = -3e38, the float32 limit). The ops (BinaryOp
with scalar constants, one UnaryOp SIGMOID) follow the layout of x; where x is a fully connected
layer's output they run on its packed [P, N, 1, 1] NC4HW4 form (``LowerContext.rows_view``),
which becomes the packed form of y for the next fully connected layer, so no layout copy is made
on either side:

    s = x*x, i1 = A/(s + d1), i2 = B/(s + d2), u = x * ((i1 + i2) + C), y = x * sigmoid(u)

MNN 3.6.1's own options are slower or inexact: UnaryOp ERF and ERFC call a scalar erf (2.5-15
ns per element, depending on |x|; observed, 1 thread), GELU_STANDARD evaluates it in double (3.4
ns per element), and UnaryOp GELU (what MNN's converter writes) replaces tanh by a clipped Pade
fraction whose 1 + tanh(v) loses all precision for x in about [-5, -3] (observed: x = -3.792
gives -4.5e-7 against onnxruntime's -1.82e-4). The chain here costs 9 BinaryOps and a SIGMOID
(about 0.5 ns per element for the sigmoid; a [1, 32, 512] tensor: 22 us against 52 us for the erf
chain, bert's FFN, observed). Gelu(x; tanh) is left to the ``gelu-tanh`` decomposition.
Fewer ops cost accuracy (minimax fits on the GELU error): h = C + A/(s + d) (6 BinaryOps) is
3.2e-5 from GELU, C + E s + A/(s + d) 2.9e-5, and polynomial h of degree 2 or 3 turn negative for
large s. Any form this exact needs the SIGMOID, which alone (13 us on [1, 32, 512], 1 thread,
observed) costs more than MNN's inexact UnaryOp GELU (10 us), so the converter's file stays faster
on erf-GELU models (bert, vit).
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.elementwise import binary_table
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "GELU_C", "GELU_ZEROS", "GELU_POLES", "gelu_partial_fractions"]

GELU_C = 6.352067384322709
GELU_ZEROS = (13.51408991, 7.16535473)
GELU_POLES = (58.19091200492282, 6.623629960572501)


def gelu_partial_fractions() -> tuple[float, float, float]:
    """(C, A, B) of h(s) = C + A/(s + d1) + B/(s + d2): A = C (r1 - d1)(r2 - d1) / (d2 - d1), B likewise."""
    (r1, r2), (d1, d2) = GELU_ZEROS, GELU_POLES
    a = GELU_C * (r1 - d1) * (r2 - d1) / (d2 - d1)
    b = GELU_C * (r1 - d2) * (r2 - d2) / (d1 - d2)
    return GELU_C, a, b


def _check(graph: Graph, node: Node) -> str | None:
    if not node.output_types[0].dtype.is_float:
        return "float tensors only"
    if node.attrs.approximate != "none":
        return f"approximate={node.attrs.approximate!r} (the gelu-tanh decomposition writes it)"
    return None


def _lower(ctx: LowerContext, node: Node) -> None:
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    value = ctx.graph.value(node)
    rows = ctx.rows_view(x_value)
    fmt = Format.NC4HW4 if rows is not None else ctx.format_of(x_value)
    x = rows if rows is not None else ctx.tensor(x_value, fmt)
    name = ctx.op_name(node)
    c, a, b = gelu_partial_fractions()
    d1, d2 = GELU_POLES

    def k(v: float, tag: str) -> int:
        return ctx.const_tensor(np.array(v, np.float32), f"{name}__{tag}")

    def bin_(kind: int, lhs: int, rhs: int, tag: str) -> int:
        out = ctx.temp(f"{name}__{tag}")
        ctx.emit("BinaryOp", f"{name}__{tag}", [lhs, rhs], [out], binary_table(kind))
        return out

    mul, add, div = fb.BinaryOpOperation.MUL, fb.BinaryOpOperation.ADD, fb.BinaryOpOperation.REALDIV
    s = bin_(mul, x, x, "sq")
    i1 = bin_(div, k(a, "a"), bin_(add, s, k(d1, "d1"), "t1"), "i1")
    i2 = bin_(div, k(b, "b"), bin_(add, s, k(d2, "d2"), "t2"), "i2")
    h = bin_(add, bin_(add, i1, i2, "i12"), k(c, "c"), "h")
    u = bin_(mul, x, h, "u")
    sig = ctx.temp(f"{name}__sigmoid")
    param = Table(
        "UnaryOp",
        {"opType": fb.UnaryOpOperation.SIGMOID, "T": fb.DataType.DT_FLOAT},
        force=frozenset({"opType"}),
    )
    ctx.emit("UnaryOp", f"{name}__sigmoid", [u], [sig], param)
    if rows is None:
        ctx.emit("BinaryOp", name, [x, sig], [ctx.define(value, fmt)], binary_table(mul))
        return
    ctx.define_rows(value, bin_(mul, x, sig, "rows"), name)


LOWERINGS: dict[str, Lowering] = {"Gelu": Lowering(_lower, _check)}
