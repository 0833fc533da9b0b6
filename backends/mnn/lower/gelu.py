"""Gelu (erf form) in MNN files: MNN's UnaryOp GELU or, exact, a sigmoid of a rational function.

    Gelu(x) = x * Phi(x),   Phi(x) = 1/2 * (1 + erf(x / sqrt(2)))

Phi = sigmoid(g) with g = logit(Phi) odd, so g(x) = x * h(x^2), and h is approximated by a
[2/2] rational function of s = x^2 with real negative zeros and poles, written in partial fractions:

    h(s) = C (s + r1)(s + r2) / ((s + d1)(s + d2)) = C + A/(s + d1) + B/(s + d2)
    Gelu(x) ~ x * sigmoid(x * h(x^2))

(fitted minimax on the Gelu error; C = 6.35207, r = 13.5141, 7.16535, d = 58.1909, 6.62363). The
sigmoid is written through MNN's EXP, with the signs folded into the constants:

    s = x*x, i1 = -A/(s + d1), i2 = -B/(s + d2), v = x * ((i1 + i2) - C),  y = x / (exp(v) + 1)

In float32 (MNN 3.6.1's own kernels, observed) the result is within 1.74e-6 of the exact Gelu for
every x in [-20, 20] in steps of 1e-4 (relative 1.5e-6 of max(1, |y|)); h stays in [1.5958, 6.36]
and s + d > 0, so nothing divides by zero, and for |x| > 1.8e19, s = inf gives h = C. MNN's EXP
stops at about 6.1e37 rather than inf (observed), so for x < -20, y = x * 1.64e-38 instead of -0
(-1.6e-18 at x = -1e20, -4.9 at x = -3e38, the float32 limit; the same as MNN's SIGMOID, which
stops at 1.6e-38). The ops (BinaryOp with scalar constants, one UnaryOp EXP) follow the layout of x;
where x is a fully connected layer's output they run on its packed [P, N, 1, 1] NC4HW4 form
(``LowerContext.rows_view``), which becomes the packed form of y for the next fully connected
layer, so no layout copy is made on either side.

MNN 3.6.1's elementwise kernels, ns per element on one thread of the 2-vCPU AVX2 host (observed,
a [197, 768] NC4HW4 tensor, vit_tiny's FFN; [1, 32, 512] runs about 30 % faster per element):

    BinaryOp with a scalar (ADD, MUL) 0.20, tensor x tensor MUL or scalar / tensor REALDIV 0.30,
    UnaryOp EXP 0.66, GELU 0.71, SIGMOID 1.05, SILU 1.1, TANH 1.1, RECIPROCAL 0.42,
    Scale (per-channel a x + b) 1.3, BinaryOp MUL_SILU (a * b * sigmoid(b)) 1.7.

So this chain costs about 3.2 ns per element (x * sigmoid(u) was 3.4: EXP + ADD + REALDIV is
cheaper than SIGMOID + MUL, and as exact) against 0.71 for MNN's UnaryOp GELU, and every erf-GELU
model spends that difference (vit_tiny: 12 GELUs of 151k elements, about 4.5 ms of 50 ms), which
no other op wins back (per-op profiles, ``benchmarks/mnn_op_profile.py``: Kiln's convolutions,
attention loops, softmax and LayerNorm cost what the converter's do, its layout copies 10-30 %
less): with the UnaryOp GELU in Kiln's file (``MnnOptions(gelu="mnn")``, which the default
``auto`` picks where the compile inputs show it safe, :mod:`backends.mnn.gelu_choice`, since the
exact chain alone kept every erf-GELU file 5-8 % slower than the converter's; verified as
``fp32-approx``: max rel 1e-3) its latency is the converter's (0.985-0.997x of the converter's
file on bert, distilbert, whisper, vit_tiny and hf_vit, 30 interleaved rounds, 1 thread, quiet
AVX-512 host; the exact chain 1.05-1.08x there) and its output error too (vit_tiny 1.04e-4 from
onnxruntime, as the converter's file). This exact chain is ``--mnn-gelu exact``, verified as
``fp32`` (max rel 1e-4).
Splitting the tensor into row blocks (Slice, a chain per block, Concat) so that each block's chain
stays in cache made it slower (observed: 490 -> 505-525 us at [197, 768]): the kernels are not
memory bound. MUL_SILU broadcasts a scalar operand wrongly (garbage, observed), and is slower than
SIGMOID anyway.

MNN 3.6.1's own options are inexact or slow: UnaryOp GELU (what MNN's converter writes) is the tanh
formula, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), which is up to 4.7e-4 from the erf Gelu
(at |x| = 2.70, observed in MNN over [-20, 20]), and its clipped Pade tanh also loses 1 + tanh(v)
for x in about [-5, -3] (x = -3.792 gives -4.5e-7 against onnxruntime's -1.82e-4); UnaryOp ERF and
ERFC call a scalar erf (2.5-15 ns per element, depending on |x|) and GELU_STANDARD evaluates it in
double (3.4 ns per element). Gelu(x; tanh) is left to the ``gelu-tanh`` decomposition.
Fewer ops cost accuracy (minimax fits on the GELU error): h = C + A/(s + d) (8 ops, C = 8.53294,
A = -648.047, d = 93.4039) is 3.26e-5 from GELU in MNN (7x better than UnaryOp GELU per element,
but vit_tiny's output came out 1.35e-4 from onnxruntime against the converter file's 1.04e-4, so it
is not the default), C + E s + A/(s + d) 2.9e-5, and polynomial h of degree 2 or 3 turn negative
for large s.
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
    fast = ctx.options.gelu == "mnn" and node.name not in ctx.options.gelu_exact_nodes
    if fast:  # "auto" unresolved (write_mnn alone): the exact chain
        _lower_mnn_gelu(ctx, node, x, rows, fmt)
        return
    c, a, b = gelu_partial_fractions()
    d1, d2 = GELU_POLES

    def k(v: float, tag: str) -> int:
        return ctx.const_tensor(np.array(v, np.float32), f"{name}__{tag}")

    def bin_(kind: int, lhs: int, rhs: int, tag: str) -> int:
        out = ctx.temp(f"{name}__{tag}")
        ctx.emit("BinaryOp", f"{name}__{tag}", [lhs, rhs], [out], binary_table(kind))
        return out

    mul, add, div = fb.BinaryOpOperation.MUL, fb.BinaryOpOperation.ADD, fb.BinaryOpOperation.REALDIV
    # v = -x h(x^2) with the signs folded into the constants, y = x / (1 + exp(v))
    s = bin_(mul, x, x, "sq")
    i1 = bin_(div, k(-a, "a"), bin_(add, s, k(d1, "d1"), "t1"), "i1")
    i2 = bin_(div, k(-b, "b"), bin_(add, s, k(d2, "d2"), "t2"), "i2")
    h = bin_(add, bin_(add, i1, i2, "i12"), k(-c, "c"), "h")
    v = bin_(mul, x, h, "v")
    e = ctx.temp(f"{name}__exp")
    param = Table(
        "UnaryOp",
        {"opType": fb.UnaryOpOperation.EXP, "T": fb.DataType.DT_FLOAT},
        force=frozenset({"opType"}),
    )
    ctx.emit("UnaryOp", f"{name}__exp", [v], [e], param)
    den = bin_(add, e, k(1.0, "one"), "den")
    if rows is None:
        ctx.emit("BinaryOp", name, [x, den], [ctx.define(value, fmt)], binary_table(div))
        return
    ctx.define_rows(value, bin_(div, x, den, "rows"), name)


def _lower_mnn_gelu(ctx: LowerContext, node: Node, x: int, rows: int | None, fmt: Format) -> None:
    """``MnnOptions.gelu == "mnn"``: MNN's own UnaryOp GELU (the tanh form, up to 4.7e-4 off)."""
    name = ctx.op_name(node)
    value = ctx.graph.value(node)
    fields = {"opType": fb.UnaryOpOperation.GELU, "T": fb.DataType.DT_FLOAT}
    param = Table("UnaryOp", fields, force=frozenset({"opType"}))
    if rows is None:
        ctx.emit("UnaryOp", name, [x], [ctx.define(value, fmt)], param)
        return
    out = ctx.temp(f"{name}__rows")
    ctx.emit("UnaryOp", f"{name}__rows", [x], [out], param)
    ctx.define_rows(value, out, name)


LOWERINGS: dict[str, Lowering] = {"Gelu": Lowering(_lower, _check)}
