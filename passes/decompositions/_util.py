"""Helpers shared by the decomposition families: checks and small graph builders."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.rewriter import Rewriter

__all__ = [
    "static_reason",
    "used",
    "ints",
    "base_name",
    "replace_outputs",
    "first_input",
    "scalar_const",
    "float_input_reason",
]


def static_reason(graph: Graph, node: Node) -> str | None:
    """None if every input and output of ``node`` has a static shape, else the reason."""
    types = [v.type for v in graph.inputs_of(node) if v is not None] + list(node.output_types)
    return None if all(t.is_static for t in types) else "dynamic shape (fix it with --input-shape)"


def used(graph: Graph, node: Node, port: int) -> bool:
    """True if output ``port`` of ``node`` is consumed or is a graph output."""
    v = graph.value(node, port)
    return bool(graph.users(v)) or graph.is_output(v)


def ints(rw: Rewriter, values: Sequence[int], name: str) -> Value:
    """A 1-D int64 constant (axes, starts, ends...)."""
    return rw.const(np.asarray(list(values), np.int64), name)


def base_name(node: Node) -> str:
    """The prefix of the names of the nodes a rewrite adds: the node's first output name."""
    return node.output_names[0] if node.output_names else node.op.lower()


def replace_outputs(rw: Rewriter, node: Node, new: Sequence[Value | None]) -> None:
    """Replace each output of ``node`` by the matching value of ``new`` (None: the output is
    unused and has no replacement), delete ``node`` and give the new values the old names."""
    g = rw.graph
    olds = g.outputs_of(node)
    names = [v.name for v in olds]
    for old, nv in zip(olds, new, strict=True):
        if nv is not None:
            g.replace_all_uses(old, nv)
        elif g.users(old) or g.is_output(old):
            raise ValueError(f"{node.describe()}: output {old.name!r} is used but has no replacement")
    rw.erase_dead(node)
    for nm, nv in zip(names, new, strict=True):
        if nv is not None and nv.name != nm and not g.has_name(nm) and nv.producer.op != "Input":
            g.rename(nv, nm)


def first_input(graph: Graph, node: Node) -> Value:
    """The node's first input (x), which every rule of a unary op reads."""
    x = graph.inputs_of(node)[0]
    assert x is not None
    return x


def scalar_const(rw: Rewriter, like: Value, v: float, name: str) -> Value:
    """A scalar constant ``v`` in ``like``'s dtype."""
    return rw.const(np.array(v, like.type.dtype.numpy), name)


def float_input_reason(graph: Graph, node: Node) -> str | None:
    """None if the node's first input is float, else the reason."""
    return None if first_input(graph, node).type.dtype.is_float else "x is not float"
