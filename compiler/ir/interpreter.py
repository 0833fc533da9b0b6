"""Run any Graph with the op registry's numpy references, node by node.

With ``float64=True`` every floating-point value (inputs, constants, results) is widened to
float64 and each reference computes in float64: the exact oracle the verification judges float32
artifacts by. Normalization statistics are then kept in float64 too (``stash_type`` ignored).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node
from compiler.ir.types import DType

__all__ = ["run_graph", "InterpreterError"]


class InterpreterError(RuntimeError):
    """A node failed to run; the message names it."""


def run_graph(
    graph: Graph,
    feeds: Mapping[str, np.ndarray],
    *,
    keep_all: bool = False,
    observer: Callable[[Node, list[np.ndarray]], None] | None = None,
    float64: bool = False,
) -> dict[str, np.ndarray]:
    """Evaluate the graph; returns outputs by name (every value with ``keep_all``).

    ``observer(node, outputs)`` is called after each node, e.g. for calibration. ``float64``
    evaluates every float value in float64 (bfloat16 values are refused: InterpreterError).
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
            env[(node.id, 0)] = arr.astype(_want(node.output_types[0].dtype, float64, node), copy=False)
            continue
        ins = graph.inputs_of(node)
        args = [None if v is None else env[(v.node, v.port)] for v in ins]
        if node.op == CONSTANT_OP and not node.domain:
            outs = [node.attrs.value]
        else:
            attrs: Any = node.attrs
            if float64 and hasattr(attrs, "stash_type"):
                attrs = dataclasses.replace(attrs, stash_type=0)  # statistics in the input's float64
            try:
                if node.subgraphs:  # If/Loop/Scan: their bodies run through this interpreter
                    outs = _run_control_flow(node, args, float64)
                else:
                    outs = get_op(node.op, node.domain).reference(args, attrs, node.num_outputs)
            except Exception as exc:  # noqa: BLE001 - re-raised with the node named
                raise InterpreterError(f"{node.describe()} failed: {exc}") from exc
        for port, arr in enumerate(outs):
            want_t = node.output_types[port].dtype
            arr = np.asarray(arr)
            if want_t.name != "BFLOAT16" or float64:
                want = _want(want_t, float64, node)
                arr = arr if arr.dtype == want else arr.astype(want)
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


def _want(dtype: DType, float64: bool, node: Node) -> np.dtype:
    """The numpy dtype a value of IR type ``dtype`` is held in (float64 for every float in float64 mode)."""
    if not float64 or not dtype.is_float:
        return dtype.numpy
    if dtype is DType.BFLOAT16:
        raise InterpreterError(f"{node.describe()}: bfloat16 values have no float64 evaluation here")
    return np.dtype(np.float64)


def _run_control_flow(node: Node, args: list[np.ndarray | None], float64: bool) -> list[np.ndarray]:
    """One If, Loop or Scan node, each body run by :func:`run_graph` in the same float mode."""
    from compiler.ops.control_flow import evaluate

    return evaluate(node, args, node.attrs, node.num_outputs, lambda g, f: run_graph(g, f, float64=float64))
