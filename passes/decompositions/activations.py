"""Decompositions of activations and elementwise math.

* gelu-erf: Gelu(x; none) = (x * 1/2) * (erf(x * 1/sqrt(2)) + 1)   (onnxruntime's order).
* gelu-tanh: Gelu(x; tanh) = (x * 1/2) * (tanh(sqrt(2/pi) * (x + 0.044715 * x*x*x)) + 1).
* pow-int: Pow(x, 2) = x * x and Pow(x, 3) = (x * x) * x for a constant scalar exponent
  (what onnxruntime computes for these exponents).
* clip-minmax: Clip(x, lo, hi) = Min(Max(x, lo), hi) (either bound may be absent and need not
  be constant); equal for every non-NaN x, lo > hi included (both give hi).
"""

from __future__ import annotations

import math

from compiler.ir.graph import Graph, Node
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, first_input, replace_outputs, scalar_const

__all__ = ["GELU_ERF", "GELU_TANH", "POW_INT", "CLIP_MINMAX"]


def _gelu_check(graph: Graph, node: Node, mode: str) -> str | None:
    if not first_input(graph, node).type.dtype.is_float:
        return "x is not float"
    a = node.attrs.approximate
    return None if a == mode else f"approximate={a!r}, not {mode!r}"


def _gelu_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    if node.attrs.approximate == "tanh":
        cube = rw.op("Mul", [rw.op("Mul", [x, x], name=f"{b}_sq"), x], name=f"{b}_cube")
        inner = rw.op(
            "Add", [x, rw.op("Mul", [cube, scalar_const(rw, x, 0.044715, f"{b}_k")], name=f"{b}_kx3")]
        )
        arg = rw.op(
            "Mul", [inner, scalar_const(rw, x, math.sqrt(2.0 / math.pi), f"{b}_s2pi")], name=f"{b}_arg"
        )
        t = rw.op("Tanh", [arg], name=f"{b}_tanh")
    else:
        arg = rw.op("Mul", [x, scalar_const(rw, x, math.sqrt(0.5), f"{b}_rsqrt2")], name=f"{b}_arg")
        t = rw.op("Erf", [arg], name=f"{b}_erf")
    half = rw.op("Mul", [x, scalar_const(rw, x, 0.5, f"{b}_half")], name=f"{b}_halfx")
    one_plus = rw.op("Add", [t, scalar_const(rw, x, 1.0, f"{b}_one")], name=f"{b}_1p")
    replace_outputs(rw, node, [rw.op("Mul", [half, one_plus], name=b)])


GELU_ERF = register_decomposition(
    Decomposition(
        "gelu-erf",
        "Gelu",
        ("Mul", "Erf", "Add"),
        lambda g, n: _gelu_check(g, n, "none"),
        _gelu_rewrite,
        "Gelu(x) = x/2 * (1 + erf(x/sqrt(2)))",
    )
)
GELU_TANH = register_decomposition(
    Decomposition(
        "gelu-tanh",
        "Gelu",
        ("Mul", "Add", "Tanh"),
        lambda g, n: _gelu_check(g, n, "tanh"),
        _gelu_rewrite,
        "Gelu(x; tanh) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))",
    )
)


def _exponent(graph: Graph, node: Node) -> float | None:
    e = graph.inputs_of(node)[1]
    c = None if e is None else e.const
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _pow_check(graph: Graph, node: Node) -> str | None:
    x = first_input(graph, node)
    if not x.type.dtype.is_float:
        return "x is not float"
    e = _exponent(graph, node)
    if e is None:
        return "exponent is not a constant scalar"
    if e not in (2.0, 3.0):
        return f"exponent {e:g} is not 2 or 3"
    return None if node.output_types[0] == x.type else "the exponent broadcasts x"


def _pow_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    y = rw.op("Mul", [x, x], name=f"{b}_sq" if _exponent(graph, node) == 3.0 else b)
    if _exponent(graph, node) == 3.0:
        y = rw.op("Mul", [y, x], name=b)
    replace_outputs(rw, node, [y])


POW_INT = register_decomposition(
    Decomposition("pow-int", "Pow", ("Mul",), _pow_check, _pow_rewrite, "x^2 = x*x; x^3 = (x*x)*x")
)


def _clip_check(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if all(v is None for v in ins[1:]):
        return "Clip has neither min nor max"
    return None if first_input(graph, node).type.dtype.is_float else "x is not float"


def _clip_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    ins = graph.inputs_of(node)
    x, b = first_input(graph, node), base_name(node)
    lo, hi = (ins[i] if len(ins) > i else None for i in (1, 2))
    y = x if lo is None else rw.op("Max", [x, lo], name=f"{b}_lo" if hi is not None else b)
    if hi is not None:
        y = rw.op("Min", [y, hi], name=b)
    replace_outputs(rw, node, [y])


CLIP_MINMAX = register_decomposition(
    Decomposition(
        "clip-minmax",
        "Clip",
        ("Max", "Min"),
        _clip_check,
        _clip_rewrite,
        "Clip(x, lo, hi) = Min(Max(x, lo), hi) for non-NaN x",
    )
)
