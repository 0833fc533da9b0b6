"""Decomposition of CastLike into Cast.

cast-like: CastLike(x, t) = Cast(x; to = dtype(t), saturate): the same conversion, its target
read from t's (static) element type; t's values are not used.
"""

from __future__ import annotations

from compiler.ir.graph import Graph, Node
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, replace_outputs

__all__ = ["CAST_LIKE"]


def _check(graph: Graph, node: Node) -> str | None:
    return None


def _rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, t = graph.inputs_of(node)
    assert x is not None and t is not None
    attrs = {"to": int(t.type.dtype), "saturate": node.attrs.saturate}
    replace_outputs(rw, node, [rw.op("Cast", [x], attrs, name=base_name(node))])


CAST_LIKE = register_decomposition(
    Decomposition(
        "cast-like", "CastLike", ("Cast",), _check, _rewrite, "CastLike(x, t) = Cast(x, to=dtype(t))"
    )
)
