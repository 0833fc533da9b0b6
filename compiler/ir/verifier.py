"""Structural and type checks of a Graph.

Checks: every op is registered, arity fits, every required input port is
connected exactly once, the graph is acyclic, names are unique, outputs exist,
and each node's recorded types equal what the registry infers from its inputs.
The subgraphs a node owns are verified the same way, recursively (their interface
against the node's inputs and outputs is part of the op's inference).
Errors name the node and show the IR around it.
"""

from __future__ import annotations

from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, GraphError, Node, subgraph_attrs
from compiler.ir.printer import format_node

__all__ = ["verify", "VerificationError"]


class VerificationError(GraphError):
    """The graph is malformed; the message names the node."""


def _context(graph: Graph, node: Node, order: list[Node]) -> str:
    idx = next((i for i, n in enumerate(order) if n.id == node.id), 0)
    lines = []
    for i in range(max(0, idx - 2), min(len(order), idx + 3)):
        mark = ">>" if i == idx else "  "
        lines.append(f"{mark} {format_node(graph, order[i])}")
    return "\n".join(lines)


def verify(graph: Graph, *, check_types: bool = True) -> None:
    """Raise :class:`VerificationError` on the first problem found."""
    from compiler.ops.registry import ShapeError, UnknownOpError, get_op, infer_node_types

    if not graph._g.is_directed() or not _is_dag(graph):
        raise VerificationError(f"graph {graph.name!r} has a cycle")
    order = graph.nodes()
    seen: set[str] = set()

    def fail(node: Node, msg: str) -> VerificationError:
        return VerificationError(f"{node.describe()}: {msg}\n{_context(graph, node, order)}")

    for node in order:
        for nm in node.output_names:
            if nm in seen:
                raise fail(node, f"value name {nm!r} is not unique")
            seen.add(nm)
        try:
            opdef = get_op(node.op, node.domain)
        except UnknownOpError:
            raise fail(node, f"op {node.qualified_op} is not registered") from None
        if not isinstance(node.attrs, opdef.attrs):
            raise fail(node, f"attrs are {type(node.attrs).__name__}, expected {opdef.attrs.__name__}")
        if len(node.output_types) != node.num_outputs:
            raise fail(node, "output types and names differ in count")
        ports = [d["dst_port"] for _, _, d in graph._g.in_edges(node.id, data=True)]
        if len(ports) != len(set(ports)):
            raise fail(node, "an input port is connected twice")
        if any(not 0 <= p < node.num_inputs for p in ports):
            raise fail(node, "an edge targets a port outside the node's inputs")
        if node.op in (INPUT_OP, CONSTANT_OP) and not node.domain:
            continue
        for attr, sub in subgraph_attrs(node.attrs):
            try:
                verify(sub, check_types=check_types)
            except VerificationError as exc:
                raise fail(node, f"subgraph {attr}: {exc}") from None
        ins = graph.inputs_of(node)
        if not opdef.accepts_inputs(len(ins)) or not opdef.accepts_outputs(node.num_outputs):
            raise fail(node, f"arity {len(ins)} -> {node.num_outputs} does not fit {opdef.qualified}")
        if ins and ins[0] is None and opdef.inputs[0] > 0:
            raise fail(node, "required input 0 is not connected")
        if check_types:
            try:
                expect = infer_node_types(opdef, node.attrs, ins, node.num_outputs, node.name or node.op)
            except (ShapeError, ValueError) as exc:
                raise fail(node, f"type inference failed: {exc}") from None
            if expect != node.output_types:
                got = ", ".join(map(str, node.output_types))
                raise fail(node, f"recorded types {got} != inferred {', '.join(map(str, expect))}")
    for v in graph.outputs:
        if not graph.has_node(v.node):
            raise VerificationError(f"graph output #{v.node}:{v.port} refers to a removed node")


def _is_dag(graph: Graph) -> bool:
    import networkx as nx

    return bool(nx.is_directed_acyclic_graph(graph._g))
