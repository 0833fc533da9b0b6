"""Decompositions of data-movement ops.

split-slice: Split(x; axis, sizes s_0..s_{n-1}) -> y_i = Slice(x, [o_i], [o_i + s_i], [axis]) with
o_i = s_0 + ... + s_{i-1}; the sizes come from the ``split`` input or from ``num_outputs``
(equal parts, the last one the rest), i.e. from the inferred output shapes, which must be
static along ``axis``. Unused outputs get no Slice.
"""

from __future__ import annotations

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.shapes import normalize_axis
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import ints, replace_outputs, used

__all__ = ["SPLIT_SLICE"]


def _axis(graph: Graph, node: Node) -> int:
    x = graph.inputs_of(node)[0]
    assert x is not None and x.type.rank is not None
    return normalize_axis(node.attrs.axis, x.type.rank)


def _check(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if x.type.shape is None:
        return "rank of x is unknown"
    axis = _axis(graph, node)
    if not all(t.shape is not None and isinstance(t.shape[axis], int) for t in node.output_types):
        return "split sizes are not static"
    return None


def _rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    axis, offset = _axis(graph, node), 0
    axes = ints(rw, [axis], f"{node.output_names[0]}_axis")
    new: list[Value | None] = []
    for port, t in enumerate(node.output_types):
        assert t.shape is not None
        size = int(t.shape[axis])
        name = node.output_names[port]
        if used(graph, node, port):
            starts, ends = ints(rw, [offset], f"{name}_start"), ints(rw, [offset + size], f"{name}_end")
            new.append(rw.op("Slice", [x, starts, ends, axes], name=name))
        else:
            new.append(None)
        offset += size
    replace_outputs(rw, node, new)


SPLIT_SLICE = register_decomposition(
    Decomposition(
        "split-slice",
        "Split",
        ("Slice",),
        _check,
        _rewrite,
        "y_i = x[o_i : o_i + s_i] along axis, o_i the sum of the earlier sizes",
    )
)
