"""Decompositions of Compress into a Gather of the kept positions.

With x' = x and a = axis (axis None: x' = Reshape(x, [-1]) and a = 0), d = x'.shape[a] and c' = c[:d]
(ONNX discards condition entries past the axis; entries missing from a short c are false):

* compress-constant-gather: a constant c gives the kept positions i = nonzero(c') as a constant,
  Compress(x, c) = Gather(x', i, a). Exact: Gather reads x' at i_0 < i_1 < ... along a, which is
  what Compress keeps. The output length is static (no true entry: an empty Gather). The axis
  length must be static, else a kept position could lie past it.
* compress-nonzero: a run-time c gives them at run time,
  Compress(x, c) = Gather(x', Reshape(NonZero(c'), [-1]), a), the output length the number of
  true entries of c' (a data-decided dim). c' is c itself when its static length is <= d; a
  static d cuts c with a constant Slice; otherwise the cut reads d at run time,
  c' = Slice(c, [0], Slice(Shape(x'), [a], [a + 1])). Only a backend writing NonZero gets it.

compress-nonzero is tried first and refuses a constant c, so ``kiln ops`` names it for a backend
with NonZero (TVM) and compress-constant-gather for the others (MNN, CANN), whose run-time
conditions stay refused, naming Compress and the missing NonZero.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.shapes import normalize_axis
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, ints, replace_outputs

__all__ = ["COMPRESS_CONSTANT_GATHER", "COMPRESS_NONZERO"]


def _operands(graph: Graph, node: Node) -> tuple[Value, Value]:
    x, c = graph.inputs_of(node)
    assert x is not None and c is not None
    return x, c


def _rank_reason(graph: Graph, node: Node) -> str | None:
    x, c = _operands(graph, node)
    if c.type.shape is None or len(c.type.shape) != 1:
        return "the condition is not a 1-D tensor of known shape"
    if node.attrs.axis is not None and x.type.shape is None:
        return "x has an unknown rank"
    return None


def _flat(rw: Rewriter, graph: Graph, node: Node) -> tuple[Value, int]:
    """(x', a): x itself and the normalized axis, or the flattened x and 0 for axis None."""
    x, _ = _operands(graph, node)
    if node.attrs.axis is None:
        b = base_name(node)
        return rw.op("Reshape", [x, ints(rw, [-1], f"{b}_flat_shape")], name=f"{b}_flat"), 0
    assert x.type.rank is not None
    return x, normalize_axis(node.attrs.axis, x.type.rank)


def _axis_length(graph: Graph, node: Node) -> int | None:
    """d when it is static (numel for axis None), else None."""
    x, _ = _operands(graph, node)
    if node.attrs.axis is None:
        return int(np.prod(x.type.static_shape)) if x.type.is_static else None
    assert x.type.shape is not None
    d = x.type.shape[normalize_axis(node.attrs.axis, len(x.type.shape))]
    return d if isinstance(d, int) else None


# -------------------------------------------------------------- run-time condition
def _nonzero_check(graph: Graph, node: Node) -> str | None:
    if _operands(graph, node)[1].const is not None:
        return "the condition is a constant (compress-constant-gather)"
    return _rank_reason(graph, node)


def _cut(rw: Rewriter, graph: Graph, node: Node, flat: Value, axis: int) -> Value:
    """c' = c[:d]: c itself when it cannot be longer than d."""
    _, c = _operands(graph, node)
    b = base_name(node)
    assert c.type.shape is not None
    n_c, d = c.type.shape[0], _axis_length(graph, node)
    if isinstance(n_c, int) and d is not None and n_c <= d:
        return c
    zero = ints(rw, [0], f"{b}_cut_start")
    if d is not None:
        end = ints(rw, [d], f"{b}_cut_end")
    else:
        shape = rw.op("Shape", [flat], name=f"{b}_shape")
        end = rw.op(
            "Slice",
            [shape, ints(rw, [axis], f"{b}_dim_start"), ints(rw, [axis + 1], f"{b}_dim_end")],
            name=f"{b}_dim",
        )
    return rw.op("Slice", [c, zero, end], name=f"{b}_cut")


def _nonzero_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    b = base_name(node)
    flat, axis = _flat(rw, graph, node)
    cond = _cut(rw, graph, node, flat, axis)
    where = rw.op("NonZero", [cond], name=f"{b}_nonzero")
    kept = rw.op("Reshape", [where, ints(rw, [-1], f"{b}_kept_shape")], name=f"{b}_kept")
    out = rw.op("Gather", [flat, kept], {"axis": axis}, name=b)
    replace_outputs(rw, node, [out])


COMPRESS_NONZERO = register_decomposition(
    Decomposition(
        "compress-nonzero",
        "Compress",
        ("Shape", "Slice", "NonZero", "Reshape", "Gather"),
        _nonzero_check,
        _nonzero_rewrite,
        "Compress(x, c) = Gather(x, Reshape(NonZero(c[:d]), [-1]), axis)",
        native=("NonZero",),
    )
)


# -------------------------------------------------------------- constant condition
def _constant_check(graph: Graph, node: Node) -> str | None:
    _, c = _operands(graph, node)
    if c.const is None:
        return "the condition is not a constant"
    why = _rank_reason(graph, node)
    if why is not None:
        return why
    if _axis_length(graph, node) is None:
        return "the axis length is not static (a kept position might lie past it)"
    return None


def _constant_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    _, c = _operands(graph, node)
    assert c.const is not None
    d = _axis_length(graph, node)
    assert d is not None
    kept = np.flatnonzero(np.asarray(c.const).astype(bool)[:d]).astype(np.int64)
    flat, axis = _flat(rw, graph, node)
    b = base_name(node)
    out = rw.op("Gather", [flat, rw.const(kept, f"{b}_kept")], {"axis": axis}, name=b)
    replace_outputs(rw, node, [out])


COMPRESS_CONSTANT_GATHER = register_decomposition(
    Decomposition(
        "compress-constant-gather",
        "Compress",
        ("Reshape", "Gather"),
        _constant_check,
        _constant_rewrite,
        "Compress(x, c) = Gather(x, nonzero(c[:d]), axis) with the positions a constant",
    )
)
