"""A stable, diffable text form of a Graph.

One line per node in deterministic topological order::

    %y = Conv(%x, %w, %b) {pads=[1,1,1,1]} : f32[1,16,8,8]  # conv1

A node's subgraphs (If's branches, a Loop's body) follow its line, indented, each as
``then_branch(%a: f32[2]) { ... return %r }``. Constants print their type and a short
content digest (small ones inline).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node, array_digest, subgraph_attrs

__all__ = ["print_graph", "format_node", "format_attr"]

_INLINE_CONST = 8


def format_attr(value: Any) -> str:
    """Print one attribute value compactly and deterministically."""
    if isinstance(value, np.ndarray):
        return f"<{value.dtype}{list(value.shape)} {array_digest(value)[:10]}>"
    if isinstance(value, tuple | list):
        return "[" + ",".join(format_attr(v) for v in value) + "]"
    if isinstance(value, float):
        return str(np.float32(value)) if np.isfinite(value) else str(value)
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _const_text(arr: np.ndarray) -> str:
    if arr.size <= _INLINE_CONST and arr.dtype != object:
        flat = ",".join(format_attr(v.item()) for v in arr.reshape(-1))
        return f"[{flat}]"
    return f"<{array_digest(arr)[:10]}>"


def format_node(graph: Graph, node: Node) -> str:
    """One node as a line of text."""
    from compiler.ops.registry import get_op

    outs = ", ".join(f"%{n}" for n in node.output_names)
    types = ", ".join(str(t) for t in node.output_types)
    if node.op == CONSTANT_OP and not node.domain:
        return f"{outs} = Constant {_const_text(node.attrs.value)} : {types}"
    args = ", ".join("%" + v.name if v is not None else "_" for v in graph.inputs_of(node))
    non_default = get_op(node.op, node.domain).non_default_attrs(node.attrs)
    attrs = {k: v for k, v in non_default.items() if not isinstance(v, Graph)}  # subgraphs print below
    attr_txt = " {" + ", ".join(f"{k}={format_attr(v)}" for k, v in attrs.items()) + "}" if attrs else ""
    src = f"  # {node.name}" if node.name and node.name not in node.output_names else ""
    return f"{outs} = {node.qualified_op}({args}){attr_txt} : {types}{src}"


def print_graph(graph: Graph, *, constants: bool = True) -> str:
    """The whole graph as text; ``constants=False`` hides Constant lines."""
    lines = [f"graph {graph.name}("]
    for v in graph.inputs:
        lines.append(f"  %{v.name}: {v.type},")
    lines.append(") {")
    lines += _body(graph, "  ", constants)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _body(graph: Graph, pad: str, constants: bool) -> list[str]:
    lines = []
    for node in graph.nodes():
        if node.op == INPUT_OP and not node.domain:
            continue
        if not constants and node.op == CONSTANT_OP and not node.domain:
            continue
        lines.append(pad + format_node(graph, node))
        for attr, sub in subgraph_attrs(node.attrs):
            args = ", ".join(f"%{v.name}: {v.type}" for v in sub.inputs)
            lines.append(f"{pad}  {attr}({args}) {{")
            lines += _body(sub, pad + "    ", constants)
            lines.append(f"{pad}  }}")
    rets = [
        f"%{v.name}" if v.name == public else f"%{v.name} as {public!r}"
        for v, public in zip(graph.outputs, graph.output_names, strict=True)
    ]
    lines.append(pad + "return " + ", ".join(rets))
    return lines
