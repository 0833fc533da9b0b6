"""dequantize-moves: dq(M(x_q, ...)) = M(dq(x_q), ...) for a per-tensor dq and a data-movement M.

Exact (dq is elementwise on one grid), so every check is bit-equality with onnxruntime. The cases
are what onnxruntime's quantizer writes: a quantized embedding table read by Gather (MNN's
legalization moves it onto the constant, which then folds to a float table) and a QOperator
attention's uint8 Q/K/V reshaped, transposed and split before their dequantizers (CANN's, with
``activations=1``). Must not fire: a per-channel dq, a dq after a computing op, and an activation
chain without ``activations=1``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.mnn.backend import BACKEND
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager
from compiler.cli import main
from compiler.pipelines import pipeline
from frontends.onnx.loader import load_onnx
from tests.helpers.pass_check import op_counts, ort, ort_graph, run_passes

RNG = np.random.default_rng(11)
IDS = {"ids": np.array([[1, 2, 9], [0, 5, 5]], np.int64)}


def _model(
    nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], inits: dict[str, np.ndarray]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _embedding(dtype: type, per_channel: bool = False) -> onnx.ModelProto:
    """y = dq(Gather(table_q, ids)) on one grid (per-channel: one scale per embedding column)."""
    info = np.iinfo(dtype)
    table: np.ndarray = RNG.integers(info.min, info.max + 1, (10, 8)).astype(dtype)
    scale = np.full(8, 0.05, np.float32) if per_channel else np.array(0.05, np.float32)
    zero: np.ndarray = np.full(8, 3, dtype) if per_channel else np.array(3, dtype)
    dq = helper.make_node("DequantizeLinear", ["g", "s", "z"], ["y"], axis=-1)
    return _model(
        [helper.make_node("Gather", ["table", "ids"], ["g"]), dq],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        {"table": table, "s": scale, "z": zero},
    )


def _attention_qkv() -> onnx.ModelProto:
    """q(x) -> Reshape -> Transpose -> Split in three -> dq each -> MatMul(q, kᵀ) + v."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("Reshape", ["xq", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1, 3]),
        helper.make_node("Split", ["t"], ["q", "k", "v"], axis=0, num_outputs=3),
        *[helper.make_node("DequantizeLinear", [n, "s", "z"], [f"{n}f"]) for n in "qkv"],
        helper.make_node("Transpose", ["kf"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qf", "kt"], ["a"]),
        helper.make_node("MatMul", ["a", "vf"], ["y"]),
    ]
    inits: dict[str, np.ndarray] = {
        "s": np.array(0.04, np.float32),
        "z": np.array(128, np.uint8),
        "shape": np.array([2, 4, 3, 6], np.int64),
    }
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 18])], inits)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_gathered_quantized_table_becomes_a_float_table(dtype: type) -> None:
    model = _embedding(dtype)
    graph = load_onnx(model)
    result = run_passes(
        graph, ["dequantize-moves", "fold-constants{only_dequantize=1}", "eliminate-dead-nodes"]
    )
    assert result.applied["dequantize-move"] == 1
    assert op_counts(graph) == Counter({"Gather": 1})
    np.testing.assert_array_equal(ort_graph(graph, IDS)["y"], ort(model, IDS)["y"])


def test_gathered_table_runs_in_mnn(tmp_path: Path) -> None:
    """Before the move MNN aliased the gathered int8 table as float: cosine 0.04 (bert QOperator: 0.34)."""
    model = _embedding(np.uint8)
    graph = load_onnx(model)
    PassManager(pipeline("default")).run(graph)
    PassManager(BACKEND.legalization("mnn", None)).run(graph)
    path = write_mnn(graph, tmp_path / "m.mnn", MnnOptions())[-1]
    np.testing.assert_array_equal(run_mnn(path, IDS)["y"].reshape(2, 3, 8), ort(model, IDS)["y"])


def test_must_not_fire_on_per_channel_or_computing_ops_or_activations_by_default() -> None:
    graph = load_onnx(_embedding(np.int8, per_channel=True))
    assert not run_passes(graph, ["dequantize-moves"]).changed
    graph = load_onnx(_attention_qkv())
    assert not run_passes(graph, ["dequantize-moves"]).changed  # activations=0: only constants move
    computed = _model(
        [
            helper.make_node("Add", ["a", "b"], ["c"]),
            helper.make_node("DequantizeLinear", ["c", "s"], ["y"]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.INT8, [4]) for n in "ab"],
        {"s": np.array(0.1, np.float32)},
    )
    assert not run_passes(load_onnx(computed), ["dequantize-moves"]).changed


def test_activation_moves_leave_the_quantized_tensor_read_by_dequantizers_only() -> None:
    model = _attention_qkv()
    graph = load_onnx(model)
    result = run_passes(graph, ["dequantize-moves{activations=1}", "eliminate-dead-nodes"])
    assert result.applied["dequantize-move"] == 3  # Split, then Transpose, then Reshape
    (q,) = [n for n in graph.ops() if n.op == "QuantizeLinear"]
    assert [u.op for u, _ in graph.users(graph.value(q))] == ["DequantizeLinear"]
    assert op_counts(graph)["DequantizeLinear"] == 1
    feeds = {"x": RNG.normal(0, 1, (2, 4, 18)).astype(np.float32)}
    np.testing.assert_array_equal(ort_graph(graph, feeds)["y"], ort(model, feeds)["y"])


def test_quantized_attention_compiles_for_cann(tmp_path: Path) -> None:
    """Was refused: 'its uint8 output (int8 on Ascend) is read by an op other than DequantizeLinear'."""
    src = tmp_path / "qkv.onnx"
    onnx.save(_attention_qkv(), src)
    out = tmp_path / "o"
    assert main(["compile", str(src), "-o", str(out), "--emit", "cann"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verification"]["passed"]
