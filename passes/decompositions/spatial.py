"""Decompositions of 1-D convolutions and pools into their 2-D forms with H = 1.

For x of shape [N, C, L], u(x) = Unsqueeze(x, [2]) has shape [N, C, 1, L], and

* conv-1d / conv-transpose-1d: conv1d(x, W; k, s, d, (p_b, p_e)) =
  Squeeze(conv2d(u(x), u(W); (1, k), (1, s), (1, d), (0, p_b, 0, p_e)), [2]);
  ConvTranspose also maps output_padding a -> (0, a) and output_shape o -> (1, o).
* maxpool-1d / averagepool-1d: the same window mapping (ceil_mode, count_include_pad and
  storage_order kept; MaxPool's Indices are equal since the flat index of (h=0, w) is w).
* globalaveragepool-1d / globalmaxpool-1d: Squeeze(GlobalPool(u(x)), [2]).

Exact: along H the window is 1 wide with stride 1 and no padding, so each 2-D window reads the
1-D window's elements and nothing else (auto_pad SAME along H adds no padding either).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, ints, replace_outputs, used

__all__ = ["SPATIAL_1D", "attrs_2d"]


def _two_d(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
    """(v,) -> (fill, v); () stays () (the default)."""
    return (fill, *values) if values else ()


def _pads_2d(pads: tuple[int, ...]) -> tuple[int, ...]:
    return (0, pads[0], 0, pads[1]) if pads else ()


def attrs_2d(attrs: Any) -> Any:
    """The 2-D attrs of a 1-D window op (Conv, ConvTranspose, MaxPool, AveragePool)."""
    changes: dict[str, tuple[int, ...]] = {"pads": _pads_2d(tuple(attrs.pads))}
    for f in ("kernel_shape", "strides", "dilations", "output_padding"):
        if hasattr(attrs, f):
            changes[f] = _two_d(tuple(getattr(attrs, f)), 0 if f == "output_padding" else 1)
    if getattr(attrs, "output_shape", ()):
        changes["output_shape"] = (1, tuple(attrs.output_shape)[-1])
    return dataclasses.replace(attrs, **changes)


def _check(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if x.type.rank != 3:
        return f"x is {'of unknown rank' if x.type.rank is None else f'{x.type.rank - 2}-D'}, not 1-D"
    return None


def _unsqueeze(rw: Rewriter, v: Value, axes: Value, name: str) -> Value:
    if v.const is not None:
        return rw.const(np.expand_dims(v.const, 2), name)
    return rw.op("Unsqueeze", [v, axes], name=name)


def _rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    ins, b = graph.inputs_of(node), base_name(node)
    axes = ints(rw, [2], f"{b}_h")
    x = ins[0]
    assert x is not None
    new_ins: list[Value | None] = [_unsqueeze(rw, x, axes, f"{b}_x2d")]
    if node.op in ("Conv", "ConvTranspose"):
        w = ins[1]
        assert w is not None
        new_ins += [_unsqueeze(rw, w, axes, f"{b}_w2d"), *ins[2:]]
    is_global = node.op.startswith("Global")
    attrs = node.attrs if is_global else attrs_2d(node.attrs)
    n_out = 2 if node.op == "MaxPool" and node.num_outputs > 1 and used(graph, node, 1) else 1
    y2d = rw.graph.add_node(node.op, new_ins, attrs, name=f"{b}_2d", num_outputs=n_out)
    new: list[Value | None] = []
    for port in range(node.num_outputs):
        ok = port < n_out and used(graph, node, port)
        sq = rw.op("Squeeze", [rw.graph.value(y2d, port), axes], name=node.output_names[port]) if ok else None
        new.append(sq)
    replace_outputs(rw, node, new)


def _rule(op: str) -> Decomposition:
    return register_decomposition(
        Decomposition(
            f"{op.lower()}-1d",
            op,
            ("Unsqueeze", op, "Squeeze"),
            _check,
            _rewrite,
            f"{op}1d(x) = Squeeze({op}2d(Unsqueeze(x, [2])), [2]) with the window (1, k)",
        )
    )


SPATIAL_1D = [
    _rule(op)
    for op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")
]
