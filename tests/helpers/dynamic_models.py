"""ONNX graphs with data-dependent dims, for the TVM symbolic-shape path (tests/test_tvm_dynamic.py).

Every case starts from the same prefix: ``x [8, 5]`` -> ``rows = NonZero(x[:, 0] > 0)`` -> ``d =
x[rows]``, a ``[n, 5]`` tensor whose ``n`` the data decides (``idx = rows`` is ``[n]`` int64), and
adds nodes reading ``d`` / ``idx`` that write the case's output ``y``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["DynCase", "dynamic_model", "nms_model", "PREFIX_INPUTS"]


@dataclass(frozen=True)
class DynCase:
    """Nodes from ``d``/``idx`` to ``y``, the constants they use, and ``y``'s element type."""

    name: str
    nodes: Sequence[onnx.NodeProto]
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    dtype: int = TensorProto.FLOAT
    shape: Sequence[int | str] | None = None  # the declared output shape (None: inferred)


def _prefix() -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    nodes = [
        helper.make_node("Gather", ["x", "c0"], ["col"], axis=1),
        helper.make_node("Greater", ["col", "fzero"], ["mask"]),
        helper.make_node("NonZero", ["mask"], ["nz"]),
        helper.make_node("Squeeze", ["nz", "a0"], ["idx"]),
        helper.make_node("Gather", ["x", "idx"], ["d"], axis=0),
    ]
    consts: dict[str, np.ndarray] = {
        "c0": np.array(0, np.int64),
        "fzero": np.array(0.0, np.float32),
        "a0": np.array([0], np.int64),
    }
    return nodes, consts


PREFIX_INPUTS = {"x": (8, 5)}


def _rename(node: onnx.NodeProto, ren: dict[str, str]) -> onnx.NodeProto:
    """A copy of ``node`` reading and writing ``ren``'s names (inside its subgraphs too)."""
    m = onnx.NodeProto()
    m.CopyFrom(node)
    m.input[:] = [ren.get(i, i) for i in m.input]
    m.output[:] = [ren.get(o, o) for o in m.output]
    for attr in m.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            subs = [_rename(n, ren) for n in attr.g.node]
            del attr.g.node[:]
            attr.g.node.extend(subs)
    return m


def dynamic_model(cases: Sequence[DynCase]) -> onnx.ModelProto:
    """One model: the prefix, then every case, its names prefixed by the case's (``y``: the name)."""
    nodes, consts = _prefix()
    outputs = []
    for case in cases:
        ren = {k: f"{case.name}__{k}" for k in case.consts}
        for n in case.nodes:
            ren.update({o: f"{case.name}__{o}" for o in n.output})
        ren["y"] = case.name
        for n in case.nodes:
            m = _rename(n, ren)
            m.name = f"{case.name}/{n.op_type}_{len(nodes)}"
            nodes.append(m)
        consts.update({ren[k]: v for k, v in case.consts.items()})
        outputs.append(helper.make_tensor_value_info(case.name, case.dtype, case.shape))
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(PREFIX_INPUTS["x"]))],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def nms_model(max_out: int, iou: float, score: float | None, center: int = 0) -> onnx.ModelProto:
    """NonMaxSuppression over ``boxes [1, 12, 4]`` / ``scores [1, 2, 12]``, then the kept boxes
    gathered (``kept [n, 4]``) and their coordinates summed (``ks [n]``)."""
    ins = ["boxes", "scores", "maxk", "iou"] + (["score"] if score is not None else [])
    nodes = [
        helper.make_node("NonMaxSuppression", ins, ["sel"], center_point_box=center),
        helper.make_node("Gather", ["sel", "two"], ["bi"], axis=1),
        helper.make_node("Squeeze", ["bi", "one"], ["b"]),
        helper.make_node("Squeeze", ["boxes", "zero"], ["bx"]),
        helper.make_node("Gather", ["bx", "b"], ["kept"], axis=0),
        helper.make_node("ReduceSum", ["kept", "one"], ["ks"], keepdims=0),
    ]
    consts: dict[str, np.ndarray] = {
        "maxk": np.array([max_out], np.int64),
        "iou": np.array([iou], np.float32),
        "two": np.array([2], np.int64),
        "one": np.array([1], np.int64),
        "zero": np.array([0], np.int64),
    }
    if score is not None:
        consts["score"] = np.array([score], np.float32)
    graph = helper.make_graph(
        nodes,
        "nms",
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 12, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2, 12]),
        ],
        [
            helper.make_tensor_value_info("sel", TensorProto.INT64, ["n", 3]),
            helper.make_tensor_value_info("kept", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("ks", TensorProto.FLOAT, ["n"]),
        ],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
