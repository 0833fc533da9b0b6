"""Run any Graph with the op registry's numpy references, node by node."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node

__all__ = ["run_graph", "InterpreterError"]


class InterpreterError(RuntimeError):
    """A node failed to run; the message names it."""


def run_graph(
    graph: Graph,
    feeds: Mapping[str, np.ndarray],
    *,
    keep_all: bool = False,
    observer: Callable[[Node, list[np.ndarray]], None] | None = None,
) -> dict[str, np.ndarray]:
    """Evaluate the graph; returns outputs by name (every value with ``keep_all``).

    ``observer(node, outputs)`` is called after each node, e.g. for calibration.
    """
    from compiler.ops.registry import get_op

    env: dict[tuple[int, int], np.ndarray] = {}
    remaining: dict[tuple[int, int], int] = {}
    for node in graph.nodes():
        for v in graph.outputs_of(node):
            remaining[(v.node, v.port)] = len(graph.users(v))
    keep = {(v.node, v.port) for v in graph.outputs}
    for v in graph.inputs:
        if v.name not in feeds:
            raise InterpreterError(f"missing input {v.name!r}")
    for node in graph.nodes():
        if node.op == INPUT_OP and not node.domain:
            arr = np.asarray(feeds[node.output_names[0]])
            want = node.output_types[0].dtype.numpy
            env[(node.id, 0)] = arr.astype(want, copy=False)
            continue
        ins = graph.inputs_of(node)
        args = [None if v is None else env[(v.node, v.port)] for v in ins]
        if node.op == CONSTANT_OP and not node.domain:
            outs = [node.attrs.value]
        else:
            try:
                outs = get_op(node.op, node.domain).reference(args, node.attrs, node.num_outputs)
            except Exception as exc:  # noqa: BLE001 - re-raised with the node named
                raise InterpreterError(f"{node.describe()} failed: {exc}") from exc
        for port, arr in enumerate(outs):
            want_t = node.output_types[port].dtype
            arr = np.asarray(arr)
            if want_t.numpy != arr.dtype and want_t.name != "BFLOAT16":
                arr = arr.astype(want_t.numpy)
            env[(node.id, port)] = arr
        if observer is not None:
            observer(node, [env[(node.id, p)] for p in range(node.num_outputs)])
        if not keep_all:
            for src in ins:
                if src is None:
                    continue
                key = (src.node, src.port)
                remaining[key] -= 1
                if remaining[key] == 0 and key not in keep:
                    env.pop(key, None)
    if keep_all:
        return {graph.node(n).output_names[p]: a for (n, p), a in env.items()}
    return {v.name: env[(v.node, v.port)] for v in graph.outputs}
