"""ONNX Expand in the MNN writer: MNN's ``BroadcastTo`` to the static output shape.

MNN 3.6.1's runtime runs ``BroadcastTo(x, shape)`` (OpType 120, no parameter table, ``shape`` an
int32 constant), so Expand is native rather than decomposed. Broadcasting copies values, so the
file must match onnxruntime exactly, for float and integer tensors, for a target of the input's
rank and for one that adds leading axes. A dtype MNN has no tensor for is refused by the table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from backends.mnn.lower.table import TABLE
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.ir.graph import Graph
from compiler.ir.types import DType, TensorType
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from tests.helpers.mnn_convert import mnn_op_types
from tests.helpers.onnx_text import text_model

EXPAND = """
ex (float[1, 3, 1, 6] x, float[4, 1] z) => (float[2, 3, 5, 6] a, float[3, 4, 7] b, float[2, 3, 5, 6] c) {
    a = Expand (x, s4)
    r = Relu (z)
    b = Expand (r, s3)
    i = Cast <to = 6> (x)
    e = Expand (i, s4)
    c = Cast <to = 1> (e)
}
"""


def test_expand_is_broadcast_to_and_exact(tmp_path: Path) -> None:
    model = text_model(
        EXPAND, opset=18, s4=np.array([2, 1, 5, 1], np.int64), s3=np.array([3, 1, 7], np.int64)
    )
    onnx.save(model, tmp_path / "m.onnx")
    graph = load_model(tmp_path / "m.onnx")
    PassManager(pipeline("default")).run(graph)
    rng = np.random.default_rng(0)
    feeds = {
        "x": (rng.standard_normal((1, 3, 1, 6)) * 4).astype(np.float32),
        "z": rng.standard_normal((4, 1)).astype(np.float32),
    }
    path = write_mnn(graph, tmp_path / "m.mnn", MnnOptions())[-1]
    assert mnn_op_types(path).count("BroadcastTo") == 3
    got, ref = run_mnn(path, feeds), run_onnxruntime(tmp_path / "m.onnx", feeds)
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert np.array_equal(got[k], ref[k]), k


def test_expand_of_a_dtype_without_mnn_tensor_is_refused() -> None:
    g = Graph("u32")
    x = g.add_input("x", TensorType(DType.UINT32, (1, 3)))
    node = g.add_node("Expand", [x, g.add_constant(np.array([2, 3], np.int64), "s")], name="e")
    g.set_outputs([g.value(node)])
    assert TABLE.reason(g, node) == "dtype uint32 has no MNN tensor"
