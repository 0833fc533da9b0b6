"""Decompositions of selections and comparisons.

* where-affine: Where(c, x, y) = y + f(c) * (x - y), f(c) = Cast(c, float) in {0, 1}, for
  constant float x and y. Exact when, elementwise, D = fl(x - y) is finite and fl(y + D) = x
  (then c = 1 gives y + D = x and c = 0 gives y + 0 = y) and neither holds -0 (the sums give +0).
  This is the attention-mask form left after the default pipeline in bert, distilbert,
  albert, mobilebert, gpt2 and t5: Where(mask, 0, -FLT_MAX), with D = FLT_MAX.
* and-mul: And(a, b) = Cast(Mul(Cast(a, int32), Cast(b, int32)), bool) for bool a, b (in {0, 1}
  the product is the conjunction, exactly); the attention masks of bert-style encoders combine a
  constant causal/padding mask with the input mask this way.
* equal-compare: Equal(a, b) = Not(Or(Less(a, b), Greater(a, b))) for integer a, b (a total
  order; for floats NaN would compare neither less nor greater, so they are refused).
* isinf-equal: IsInf(x) = Equal(|x|, inf); with only detect_positive Equal(x, inf), with only
  detect_negative Equal(x, -inf) (float x; NaN equals nothing, as IsInf(NaN) = false).
* xor-or-and: Xor(a, b) = And(Or(a, b), Not(And(a, b))) for bool a, b (true where exactly one
  is); the CANN backend's form (GE's op set has no LogicalXor; ATC writes Cast -> BitwiseXor ->
  Cast instead).
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, replace_outputs

__all__ = ["WHERE_AFFINE", "AND_MUL", "EQUAL_COMPARE", "ISINF_EQUAL", "XOR_OR_AND", "where_affine_reason"]


def where_affine_reason(x: np.ndarray | None, y: np.ndarray | None) -> str | None:
    """None if y + c * (x - y) equals Where(c, x, y) exactly for every c in {0, 1}, else why not."""
    if x is None or y is None:
        return "x or y is not constant (c * (x - y) is exact only for finite constants)"
    if x.dtype != y.dtype or x.dtype.kind != "f":
        return "x and y are not float constants of one dtype"
    with np.errstate(all="ignore"):
        d = (x - y).astype(x.dtype)
        back = (y + d).astype(x.dtype)
    if not np.all(np.isfinite(d)):
        return "x - y is not finite"
    if not np.array_equal(np.broadcast_to(back, d.shape), np.broadcast_to(x, d.shape)):
        return "y + (x - y) does not round back to x"
    if np.any((y == 0) & np.signbit(y)) or np.any((x == 0) & np.signbit(x)):
        return "x or y holds -0 (the sums give +0)"
    return None


def _where_check(graph: Graph, node: Node) -> str | None:
    c, x, y = graph.inputs_of(node)
    assert c is not None and x is not None and y is not None
    return where_affine_reason(x.const, y.const)


def _where_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    c, x, y = graph.inputs_of(node)
    assert c is not None and x is not None and y is not None and x.const is not None and y.const is not None
    b, dt = base_name(node), x.type.dtype
    d = rw.const((x.const - y.const).astype(dt.numpy), f"{b}_delta")
    f = rw.op("Cast", [c], {"to": int(dt)}, name=f"{b}_cond")
    y2 = rw.op("Add", [y, rw.op("Mul", [f, d], name=f"{b}_step")], name=b)
    replace_outputs(rw, node, [y2])


WHERE_AFFINE = register_decomposition(
    Decomposition(
        "where-affine",
        "Where",
        ("Cast", "Mul", "Add"),
        _where_check,
        _where_rewrite,
        "Where(c, x, y) = y + Cast(c) * (x - y) for constant float x, y that round-trip",
    )
)


def _and_check(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    kinds = {v.type.dtype for v in ins if v is not None}
    return None if kinds == {DType.BOOL} else "inputs are not bool"


def _and_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    a, c = graph.inputs_of(node)
    assert a is not None and c is not None
    b, i32 = base_name(node), int(DType.INT32)
    ia = rw.op("Cast", [a], {"to": i32}, name=f"{b}_a")
    ic = rw.op("Cast", [c], {"to": i32}, name=f"{b}_b")
    prod = rw.op("Mul", [ia, ic], name=f"{b}_mul")
    replace_outputs(rw, node, [rw.op("Cast", [prod], {"to": int(DType.BOOL)}, name=b)])


AND_MUL = register_decomposition(
    Decomposition(
        "and-mul",
        "And",
        ("Cast", "Mul"),
        _and_check,
        _and_rewrite,
        "And(a, b) = Cast(Cast(a, int32) * Cast(b, int32), bool) for bool a, b",
    )
)


def _equal_check(graph: Graph, node: Node) -> str | None:
    a = graph.inputs_of(node)[0]
    assert a is not None
    return None if a.type.dtype.is_integer else f"inputs are {a.type.dtype.short}, not integer"


def _equal_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    a, c = graph.inputs_of(node)
    assert a is not None and c is not None
    b = base_name(node)
    lt, gt = rw.op("Less", [a, c], name=f"{b}_lt"), rw.op("Greater", [a, c], name=f"{b}_gt")
    ne = rw.op("Or", [lt, gt], name=f"{b}_ne")
    replace_outputs(rw, node, [rw.op("Not", [ne], name=b)])


EQUAL_COMPARE = register_decomposition(
    Decomposition(
        "equal-compare",
        "Equal",
        ("Less", "Greater", "Or", "Not"),
        _equal_check,
        _equal_rewrite,
        "Equal(a, b) = Not(Less(a, b) or Greater(a, b)) for integers",
    )
)


def _isinf_check(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if not x.type.dtype.is_float:
        return "x is not float"
    a = node.attrs
    return None if a.detect_positive or a.detect_negative else "detects neither infinity (a constant false)"


def _isinf_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    b, a = base_name(node), node.attrs
    both = a.detect_positive and a.detect_negative
    v = rw.op("Abs", [x], name=f"{b}_abs") if both else x
    inf = rw.const(np.array(np.inf if a.detect_positive else -np.inf, x.type.dtype.numpy), f"{b}_inf")
    replace_outputs(rw, node, [rw.op("Equal", [v, inf], name=b)])


ISINF_EQUAL = register_decomposition(
    Decomposition(
        "isinf-equal",
        "IsInf",
        ("Abs", "Equal"),
        _isinf_check,
        _isinf_rewrite,
        "IsInf(x) = Equal(|x|, inf) (or Equal(x, +-inf) for one sign)",
    )
)


def _xor_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    a, c = graph.inputs_of(node)
    assert a is not None and c is not None
    b = base_name(node)
    either = rw.op("Or", [a, c], name=f"{b}_or")
    not_both = rw.op("Not", [rw.op("And", [a, c], name=f"{b}_and")], name=f"{b}_nand")
    replace_outputs(rw, node, [rw.op("And", [either, not_both], name=b)])


XOR_OR_AND = register_decomposition(
    Decomposition(
        "xor-or-and",
        "Xor",
        ("Or", "And", "Not"),
        _and_check,
        _xor_rewrite,
        "Xor(a, b) = (a or b) and not (a and b) for bool a, b",
    )
)
