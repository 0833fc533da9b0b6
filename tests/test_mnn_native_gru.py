"""ONNX GRU as MNN's own RNNSequenceGRU, against onnxruntime in MNN 3.6.1's runtime.

Forward and bidirectional layers, with and without an initial state, with
``linear_before_reset`` 0 and 1: the file holds one RNNSequenceGRU, MNN's per-op callback shows
it running as itself, and Y and Y_h match onnxruntime within fp32 max rel 1e-5 (a bidirectional
Y_h is sliced from Y: MNN's own is wrong). The refusals give their reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper as nh

from backends.mnn.backend import BACKEND
from backends.mnn.lower.table import TABLE
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.ir.graph import Graph
from compiler.metrics import agreement
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from tests.helpers.mnn_callback import executed_ops
from tests.helpers.mnn_convert import mnn_op_types

FP32_MAX_REL = 1e-5
SEQ, BATCH, INP, HID = 6, 2, 3, 5


def _gru(nd: int, init: bool, **attrs: Any) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(nd * 2 + init)
    inits = [
        nh.from_array(rng.standard_normal((nd, 3 * HID, INP)).astype(np.float32) * 0.5, "W"),
        nh.from_array(rng.standard_normal((nd, 3 * HID, HID)).astype(np.float32) * 0.5, "R"),
        nh.from_array(rng.standard_normal((nd, 6 * HID)).astype(np.float32) * 0.5, "B"),
    ]
    names = ["x", "W", "R", "B", ""]
    ins = [oh.make_tensor_value_info("x", T.FLOAT, [SEQ, BATCH, INP])]
    feeds = {"x": rng.standard_normal((SEQ, BATCH, INP)).astype(np.float32)}
    if init:
        names.append("h0")
        ins.append(oh.make_tensor_value_info("h0", T.FLOAT, [nd, BATCH, HID]))
        feeds["h0"] = rng.standard_normal((nd, BATCH, HID)).astype(np.float32)
    direction = attrs.pop("direction", "bidirectional" if nd == 2 else "forward")
    node = oh.make_node("GRU", names, ["y", "yh"], hidden_size=HID, direction=direction, **attrs)
    outs = [oh.make_tensor_value_info(o, T.FLOAT, None) for o in ("y", "yh")]
    graph = oh.make_graph([node], "g", ins, outs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 14)]), feeds


def _graph(model: onnx.ModelProto, tmp_path: Path, legalize: bool = True) -> tuple[Graph, Path]:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    legal = BACKEND.legalization("mnn", None) if legalize else []
    PassManager([*pipeline("default"), *legal]).run(graph)
    return graph, path


@pytest.mark.parametrize("nd", [1, 2])
@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_is_native_and_matches(nd: int, init: bool, lbr: int, tmp_path: Path) -> None:
    model, feeds = _gru(nd, init, linear_before_reset=lbr)
    graph, path = _graph(model, tmp_path)
    mnn = write_mnn(graph, tmp_path / "m.mnn", MnnOptions())[-1]
    types = mnn_op_types(mnn)
    assert types.count("RNNSequenceGRU") == 1 and types.count("Concat") == (nd == 2)
    assert "RNNSequenceGRU" in {k for k, _ in executed_ops(mnn, feeds)}
    got, ref = run_mnn(mnn, feeds), run_onnxruntime(path, feeds)
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert got[k].shape == ref[k].shape, k
        assert agreement(got[k], ref[k]).max_rel <= FP32_MAX_REL, k


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"direction": "reverse"}, "direction reverse (MNN runs a single direction forward)"),
        ({"clip": 2.0}, "clip"),
        (
            {"activations": ["Relu", "Tanh"]},
            "activations ['Relu', 'Tanh'] (MNN's kernel has the defaults only)",
        ),
    ],
)
def test_gru_refusals(attrs: dict[str, Any], reason: str, tmp_path: Path) -> None:
    model, _ = _gru(1, False, **attrs)
    graph, _ = _graph(model, tmp_path, legalize=False)
    (node,) = [n for n in graph.ops() if n.op == "GRU"]
    assert TABLE.reason(graph, node) == reason
