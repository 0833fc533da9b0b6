"""benchmarks/mnn_op_profile.py: per-op-type times of .mnn files in MNN's runtime (a tiny erf-GELU net)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto as T
from onnx import helper as oh

from backends.mnn.backend import BACKEND
from backends.mnn.options import MnnOptions
from backends.mnn.writer import write_mnn
from benchmarks.mnn_op_profile import profile
from compiler.api import PassManager, load_model
from compiler.pipelines import pipeline


def _gelu_file(tmp_path: Path, options: MnnOptions, name: str) -> Path:
    import onnx

    graph = oh.make_graph(
        [oh.make_node("Gelu", ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", T.FLOAT, [1, 4096])],
        [oh.make_tensor_value_info("y", T.FLOAT, [1, 4096])],
    )
    path = tmp_path / f"{name}.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)]), path)
    g = load_model(path)
    PassManager(pipeline("default")).run(g)
    PassManager(BACKEND.legalization("mnn", None)).run(g)
    return write_mnn(g, tmp_path / f"{name}.mnn", options)[-1]


def test_profile_counts_each_files_ops(tmp_path: Path) -> None:
    exact = _gelu_file(tmp_path, MnnOptions(gelu="exact"), "exact")
    fast = _gelu_file(tmp_path, MnnOptions(gelu="mnn"), "mnn")
    x = np.linspace(-4, 4, 4096, dtype=np.float32).reshape(1, 4096)
    totals, per_type = profile([exact, fast], {"x": x}, rounds=3)
    assert len(totals) == 2 and all(t > 0 for t in totals)
    assert per_type[0]["BinaryOp"][1] == 10 and per_type[0]["UnaryOp"][1] == 1
    assert "BinaryOp" not in per_type[1] and per_type[1]["UnaryOp"][1] == 1
    assert all(us > 0 for t in per_type for us, _ in t.values())
