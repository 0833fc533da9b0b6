"""The cone of a node: the part of a graph its result reaches, cut out as a graph of its own.

When only node L of a graph changes (say, L is put in QDQ form), every value outside
cone(L) = {L} ∪ {nodes that depend on L} keeps its float value. So the changed model is
evaluated on the cone alone, with the values that enter the cone from outside fed as
graph inputs (cached from one float run): same numbers, less work per layer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.registry import get_op

__all__ = ["float_outputs", "downstream", "extract"]


def float_outputs(graph: Graph) -> list[tuple[Value, str]]:
    """The float graph outputs with their public names."""
    return [(v, n) for v, n in zip(graph.outputs, graph.output_names, strict=True) if v.type.dtype.is_float]


def downstream(graph: Graph, roots: Iterable[int]) -> set[int]:
    """The ids of ``roots`` and of every node that depends on one of them."""
    cone = set(roots)
    stack = sorted(cone)
    while stack:
        for v in graph.outputs_of(graph.node(stack.pop())):
            for user, _ in graph.users(v):
                if user.id not in cone:
                    cone.add(user.id)
                    stack.append(user.id)
    return cone


def extract(
    graph: Graph, order: Sequence[Node], cone: set[int], keep: int | Collection[int]
) -> tuple[Graph, dict[int, int], list[str], int]:
    """A new graph of the ``cone`` nodes (``order``: ``graph.nodes()``) with the float outputs they produce.

    Values entering the cone become graph inputs of the same name (constants stay constants),
    so value names, and with them the activation parameters, carry over. An entering value
    that ``graph`` also reads outside the cone (or outputs) is appended to the outputs, so
    that QDQ insertion sees it as shared there too (it shares grids only with sole readers).
    Kiln-domain nodes other than ``keep`` (one id, or several) are expanded into standard ops as
    they are copied (what the exporter would do later, at a cost that grows with the graph).

    Returns:
        The graph; old -> new node ids; the names of the inputs that are not inputs of
        ``graph`` (fed from cached float values); how many leading outputs are the cone's.
    """
    sub = Graph(graph.name)
    vals: dict[tuple[int, int], Value] = {}
    ids: dict[int, int] = {}
    graph_inputs = {v.node for v in graph.inputs}
    unexpanded = {keep} if isinstance(keep, int) else set(keep)
    fed: list[str] = []
    entering: list[Value] = []
    for node in order:
        if node.id not in cone:
            continue
        ins: list[Value | None] = []
        for v in graph.inputs_of(node):
            if v is not None and (v.node, v.port) not in vals:
                c = v.const
                if c is not None:
                    vals[(v.node, v.port)] = sub.add_constant(c, v.name)
                else:
                    vals[(v.node, v.port)] = sub.add_input(v.name, v.type)
                    entering.append(v)
                    if v.node not in graph_inputs:
                        fed.append(v.name)
            ins.append(None if v is None else vals[(v.node, v.port)])
        new = sub.add_node(
            node.op,
            ins,
            node.attrs,
            domain=node.domain,
            name=node.name,
            output_names=node.output_names,
            output_types=node.output_types,
        )
        ids[node.id] = new.id
        outs = sub.outputs_of(new)
        expand = get_op(node.op, node.domain).expand if node.domain and node.id not in unexpanded else None
        if expand is not None:
            outs = expand(sub, new)
            sub.remove(new)
        for p, v in enumerate(outs):
            vals[(node.id, p)] = v
    kept = [(vals[(v.node, v.port)], pub) for v, pub in float_outputs(graph) if v.node in cone]
    shared = [v for v in entering if graph.is_output(v) or any(u.id not in cone for u, _ in graph.users(v))]
    sub.set_outputs(
        [v for v, _ in kept] + [vals[(v.node, v.port)] for v in shared],
        names=[pub for _, pub in kept] + [f"{v.name}__shared" for v in shared],
    )
    return sub, ids, fed, len(kept)
