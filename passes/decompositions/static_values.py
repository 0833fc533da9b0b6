"""Decompositions of ops whose result depends only on a static input shape: Shape, Size, EyeLike.

* shape-static / size-static / eyelike-static: y = the op's registry reference evaluated on a
  zero tensor of x's static shape and dtype, written as a constant (Shape: the dims in
  [start, end); Size: their product; EyeLike: ones on diagonal k). The reference reads only
  x's shape and dtype, so the constant equals the op's output for every x of that shape.
* constant-of-shape-expand: ConstantOfShape(s; value) = Expand(value, s) (value is a one-element
  tensor; Expand broadcasts it to the shape s), for any s, constant or not.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph, Node
from compiler.ops.registry import get_op
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, first_input, replace_outputs

__all__ = ["SHAPE_STATIC", "SIZE_STATIC", "EYELIKE_STATIC", "CONSTANT_OF_SHAPE_EXPAND"]


def _static_check(graph: Graph, node: Node) -> str | None:
    return (
        None
        if first_input(graph, node).type.is_static
        else "shape of x is not static (fix it with --input-shape)"
    )


def _static_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x = first_input(graph, node)
    zeros = np.zeros(x.type.static_shape, x.type.dtype.numpy)
    (y,) = get_op(node.op, node.domain).reference([zeros], node.attrs, 1)
    replace_outputs(rw, node, [rw.const(np.asarray(y), base_name(node))])


def _rule(op: str, doc: str) -> Decomposition:
    return register_decomposition(
        Decomposition(f"{op.lower()}-static", op, (), _static_check, _static_rewrite, doc)
    )


SHAPE_STATIC = _rule("Shape", "Shape(x) = the constant dims of x in [start, end)")
SIZE_STATIC = _rule("Size", "Size(x) = the constant product of x's dims")
EYELIKE_STATIC = _rule("EyeLike", "EyeLike(x) = the constant identity of x's shape, shifted by k")


def _cos_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    value = np.asarray(node.attrs.value).reshape(())
    b = base_name(node)
    v = rw.const(value, f"{b}_value")
    replace_outputs(rw, node, [rw.op("Expand", [v, first_input(graph, node)], name=b)])


CONSTANT_OF_SHAPE_EXPAND = register_decomposition(
    Decomposition(
        "constant-of-shape-expand",
        "ConstantOfShape",
        ("Expand",),
        lambda g, n: None,
        _cos_rewrite,
        "ConstantOfShape(s; value) = Expand(value, s)",
    )
)
