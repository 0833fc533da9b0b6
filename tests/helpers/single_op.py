"""Run one ONNX op in onnxruntime, and the same op through Kiln's registry.

``run_ort`` builds a one-node model with ``onnx.helper`` (every input a graph
input, so value-dependent shapes are computed at run time) and runs it on the
CPU provider with graph optimizations off. ``kiln_node`` builds a one-node
Kiln ``Graph`` (chosen inputs as constants) and returns the node, whose
``output_types`` come from the registry's inference.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import TensorType

__all__ = ["run_ort", "kiln_node", "onnx_attrs"]


def onnx_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attrs for ``helper.make_node``: numpy arrays become TensorProtos, None values are dropped."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        out[k] = numpy_helper.from_array(np.asarray(v), k) if isinstance(v, np.ndarray) else v
    return out


def run_ort(
    op: str,
    inputs: Sequence[np.ndarray | None],
    attrs: Mapping[str, Any] | None = None,
    num_outputs: int = 1,
    opset: int = 21,
) -> list[np.ndarray]:
    """Outputs of ``op`` applied to ``inputs`` (None = omitted optional input) in onnxruntime."""
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    while names and names[-1] == "":
        names.pop()
    outs = [f"out{i}" for i in range(num_outputs)]
    node = helper.make_node(op, names, outs, **onnx_attrs(attrs or {}))
    g_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in zip(names, inputs, strict=False)
        if x is not None
    ]
    g_outputs = [helper.make_empty_tensor_value_info(o) for o in outs]
    graph = helper.make_graph([node], "single_op", g_inputs, g_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {n: x for n, x in zip(names, inputs, strict=False) if x is not None}
    return [np.asarray(r) for r in sess.run(outs, feeds)]


def kiln_node(
    op: str,
    inputs: Sequence[np.ndarray | TensorType | None],
    attrs: Mapping[str, Any] | None = None,
    num_outputs: int | None = None,
    consts: Collection[int] = (),
) -> Node:
    """A Kiln node for ``op``; arrays at ``consts`` become constants, TensorTypes become typed inputs."""
    g = Graph("single_op")
    values: list[Value | None] = []
    for i, x in enumerate(inputs):
        if x is None:
            values.append(None)
        elif isinstance(x, TensorType):
            values.append(g.add_input(f"in{i}", x))
        elif i in consts:
            values.append(g.add_constant(np.asarray(x), f"c{i}"))
        else:
            values.append(g.add_input(f"in{i}", TensorType.of(np.asarray(x))))
    return g.add_node(op, values, dict(attrs or {}), num_outputs=num_outputs)
