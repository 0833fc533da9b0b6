"""Decompositions of Trilu with a constant k into a select or a product with a constant mask.

For x [..., M, N] (M, N static) let mask[i, j] = (j - i >= k) for upper=1, (j - i <= k) for upper=0.

* trilu-where: Trilu(x) = Where(mask, x, 0): exact for every x (needs a native Where: x is
  not constant, which where-affine needs).
* trilu-mask-mul: Trilu(x) = x * float(mask): exact for finite x; where x is +-inf or NaN
  outside the kept band it gives NaN (inf * 0) instead of 0, so it comes after trilu-where and
  serves backends without Where.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph, Node
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, first_input, replace_outputs

__all__ = ["TRILU_WHERE", "TRILU_MASK_MUL"]


def _k(graph: Graph, node: Node) -> int | None:
    ins = graph.inputs_of(node)
    k = ins[1] if len(ins) > 1 else None
    if k is None:
        return 0
    return int(k.const.reshape(-1)[0]) if k.const is not None and k.const.size == 1 else None


def _check(graph: Graph, node: Node, need_float: bool) -> str | None:
    x = first_input(graph, node)
    if need_float and not x.type.dtype.is_float:
        return "x is not float (the mask product needs a float x)"
    if x.type.shape is None or len(x.type.shape) < 2:
        return "x is not at least 2-D"
    if not all(isinstance(d, int) for d in x.type.shape[-2:]):
        return "the last two dims are not static"
    return None if _k(graph, node) is not None else "k is not a constant scalar"


def _mask(graph: Graph, node: Node) -> np.ndarray:
    shape = first_input(graph, node).type.shape
    k = _k(graph, node)
    assert shape is not None and k is not None
    m, n = int(shape[-2]), int(shape[-1])
    diff = np.arange(n)[None, :] - np.arange(m)[:, None]
    return diff >= k if node.attrs.upper else diff <= k


def _where_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    keep = rw.const(_mask(graph, node), f"{b}_mask")
    zero = rw.const(np.zeros((), x.type.dtype.numpy), f"{b}_zero")
    replace_outputs(rw, node, [rw.op("Where", [keep, x, zero], name=b)])


def _mul_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    keep = rw.const(_mask(graph, node).astype(x.type.dtype.numpy), f"{b}_mask")
    replace_outputs(rw, node, [rw.op("Mul", [x, keep], name=b)])


TRILU_WHERE = register_decomposition(
    Decomposition(
        "trilu-where",
        "Trilu",
        ("Where",),
        lambda g, n: _check(g, n, need_float=False),
        _where_rewrite,
        "Trilu(x) = Where(mask, x, 0), mask[i, j] = j - i >= k (upper) or <= k (lower)",
        native=("Where",),
    )
)
TRILU_MASK_MUL = register_decomposition(
    Decomposition(
        "trilu-mask-mul",
        "Trilu",
        ("Mul",),
        lambda g, n: _check(g, n, need_float=True),
        _mul_rewrite,
        "Trilu(x) = x * mask for finite x (inf/NaN outside the band gives NaN, not 0)",
    )
)
