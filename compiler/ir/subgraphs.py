"""Moving subgraphs into their enclosing graph: inlining a body, refreshing the types after it.

``inline_graph(outer, sub, args)`` copies every node of ``sub`` into ``outer`` with ``sub``'s
inputs bound to ``args`` and returns the values of ``sub``'s outputs: the graph of
``y = sub(args)`` spliced in place. Nested subgraphs are deep-copied, so each copy owns its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, GraphError, Value, clone_attrs

__all__ = ["inline_graph", "refresh_types"]


def inline_graph(
    outer: Graph, sub: Graph, args: Sequence[Value], *, suffix: str = "", scope: str = ""
) -> list[Value]:
    """Copy ``sub``'s nodes into ``outer`` with its inputs bound to ``args``; its outputs' values.

    Value names keep ``sub``'s names plus ``suffix`` (made unique in ``outer``); node names get
    the ``scope`` prefix (e.g. ``"loop/iter3/"``). Output types are inferred again from the
    actual inputs, so they may be more specific than the subgraph's.
    """
    if len(args) != len(sub.inputs):
        raise GraphError(f"inlining {sub.name!r}: {len(args)} values for {len(sub.inputs)} inputs")
    env: dict[tuple[int, int], Value] = {(v.node, v.port): a for v, a in zip(sub.inputs, args, strict=True)}
    for node in sub.nodes():
        if node.op == INPUT_OP and not node.domain:
            continue
        if node.op == CONSTANT_OP and not node.domain:
            env[(node.id, 0)] = outer.add_constant(node.attrs.value, node.output_names[0] + suffix)
            continue
        ins = [None if v is None else env[(v.node, v.port)] for v in sub.inputs_of(node)]
        new = outer.add_node(
            node.op,
            ins,
            clone_attrs(node.attrs),
            domain=node.domain,
            name=scope + node.name if node.name else "",
            output_names=[nm + suffix for nm in node.output_names],
        )
        for port in range(node.num_outputs):
            env[(node.id, port)] = outer.value(new, port)
    return [env[(v.node, v.port)] for v in sub.outputs]


def refresh_types(graph: Graph, changed: Iterable[Value]) -> int:
    """Re-infer, in topological order, every node downstream of values whose types changed.

    Every downstream node is re-inferred, not only those whose input types changed: an inlined
    branch can turn values into constants, and value-dependent inference (Range, Reshape, ...)
    then gives other types with the same input types. Returns the number of nodes whose recorded
    types changed.
    """
    dirty = {user.id for v in changed for user, _ in graph.users(v)}
    count = 0
    for node in graph.nodes():
        if node.id not in dirty:
            continue
        before = list(node.output_types)
        graph.reinfer(node)
        count += node.output_types != before
        dirty.update(u.id for v in graph.outputs_of(node) for u, _ in graph.users(v))
    return count
