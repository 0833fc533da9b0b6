"""The MNN reader lifts the native ops Kiln's writer emits (issue 18): a round trip per op.

Each small model is compiled the way ``kiln compile --emit mnn`` does (default pipeline, MNN's
legalization, the writer), the ``.mnn`` is checked to hold the native op (LayerNorm, LSTM, RNN,
ScatterNd, UnaryOp SILU, BatchMatMul, ...), read back by :func:`frontends.mnn.loader.load_mnn`,
and the lifted graph (exported to ONNX, run in onnxruntime) must match onnxruntime on the source
model and MNN's runtime on the file within fp32 max rel 1e-5. The zoo models (a transformer,
two RNNs) go through the CLI and are read back the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from backends.mnn.backend import BACKEND
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.cli import main
from compiler.ir.graph import Graph
from compiler.metrics import agreement
from compiler.onnx_export import export_onnx, model_bytes
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from frontends.mnn.loader import load_mnn
from schemas.mnn.schema import fb
from tests.helpers.mnn_convert import mnn_op_types
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

MAX_REL = 1e-5
Feeds = dict[str, np.ndarray]
Case = Callable[[], tuple[onnx.ModelProto, Feeds]]
RNG = np.random.default_rng(7)


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(
    nodes: list[onnx.NodeProto], ins: dict[str, np.ndarray], outs: list[str], **inits: np.ndarray
) -> onnx.ModelProto:
    types = {np.dtype(np.float32): T.FLOAT, np.dtype(np.int64): T.INT64}
    vi = [oh.make_tensor_value_info(k, types[v.dtype], list(v.shape)) for k, v in ins.items()]
    out_vi = [oh.make_tensor_value_info(o, T.FLOAT, None) for o in outs]
    tensors = [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()]
    return oh.make_model(
        oh.make_graph(nodes, "g", vi, out_vi, tensors), opset_imports=[oh.make_opsetid("", 18)]
    )


def _layer_norm() -> tuple[onnx.ModelProto, Feeds]:
    x = _f(2, 5, 6, 8, scale=3.0)
    node = oh.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-2, epsilon=1e-5)
    return _model([node], {"x": x}, ["y"], s=_f(6, 8), b=_f(6, 8)), {"x": x}


def _recurrent(op: str, direction: str, states: bool) -> Case:
    def build() -> tuple[onnx.ModelProto, Feeds]:
        seq, batch, inp, hid, g = 5, 2, 3, 4, {"LSTM": 4, "RNN": 1}[op]
        nd = 2 if direction == "bidirectional" else 1
        feeds = {"x": _f(seq, batch, inp)}
        names = ["x", "W", "R", "B", ""]
        if states:
            for s in ["h0", "c0"][: 2 if op == "LSTM" else 1]:
                feeds[s] = _f(nd, batch, hid)
                names.append(s)
        outs = ["y", "yh", "yc"][: 3 if op == "LSTM" else 2]
        node = oh.make_node(op, names, outs, hidden_size=hid, direction=direction)
        inits = {"W": _f(nd, g * hid, inp), "R": _f(nd, g * hid, hid), "B": _f(nd, 2 * g * hid)}
        return _model([node], feeds, outs, **inits), feeds

    return build


def _scatter_nd(reduction: str, const_indices: bool) -> Case:
    def build() -> tuple[onnx.ModelProto, Feeds]:
        idx = np.array([[[0, 1], [-1, 2]], [[1, -3], [0, 1]]], np.int64)
        feeds = {"x": _f(3, 4, 5, scale=5.0), "u": _f(2, 2, 5, scale=5.0)}
        inits = {"idx": idx} if const_indices else {}
        if not const_indices:
            feeds["idx"] = idx
        extra = {} if reduction == "none" else {"reduction": reduction}
        node = oh.make_node("ScatterND", ["x", "idx", "u"], ["y"], **extra)
        return _model([node], feeds, ["y"], **inits), feeds

    return build


def _silu_and_friends() -> tuple[onnx.ModelProto, Feeds]:
    """SiLU (UnaryOp SILU), batched MatMul, ReduceMean, Pad, Elu, Expand and casts through bool."""
    x = _f(2, 3, 4, 4)
    nodes = [
        oh.make_node("Sigmoid", ["x"], ["sg"]),
        oh.make_node("Mul", ["x", "sg"], ["silu"]),
        oh.make_node("MatMul", ["silu", "x"], ["mm"]),
        oh.make_node("ReduceMean", ["mm", "ax"], ["rm"], keepdims=1),
        oh.make_node("Pad", ["rm", "pads"], ["pd"], mode="edge"),
        oh.make_node("Elu", ["pd"], ["el"], alpha=0.7),
        oh.make_node("Expand", ["el", "shape"], ["ex"]),
        oh.make_node("Cast", ["ex"], ["bl"], to=T.BOOL),  # x != 0 (MNN's Cast to DT_BOOL)
        oh.make_node("Cast", ["bl"], ["blf"], to=T.FLOAT),
        oh.make_node("Add", ["ex", "blf"], ["y"]),
    ]
    inits = {
        "ax": np.array([1], np.int64),
        "pads": np.array([0, 0, 1, 0, 0, 0, 0, 2], np.int64),
        "shape": np.array([2, 2, 5, 6], np.int64),
    }
    return _model(nodes, {"x": x}, ["y"], **inits), {"x": x}


CASES: dict[str, tuple[Case, str]] = {
    "layer_norm": (_layer_norm, "LayerNorm"),
    "lstm_forward": (_recurrent("LSTM", "forward", False), "LSTM"),
    "lstm_bidirectional_states": (_recurrent("LSTM", "bidirectional", True), "LSTM"),
    "rnn_bidirectional": (_recurrent("RNN", "bidirectional", False), "RNN"),
    "rnn_forward_states": (_recurrent("RNN", "forward", True), "RNN"),
    "scatter_nd_const": (_scatter_nd("none", True), "ScatterNd"),
    "scatter_nd_add_variable": (_scatter_nd("add", False), "ScatterNd"),
    "silu_matmul_reduce_pad_elu_expand_cast": (_silu_and_friends, "BatchMatMul"),
}


def _unary_kinds(path: Path) -> list[int]:
    net = fb.Net.GetRootAs(path.read_bytes(), 0)
    kinds = []
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.MainType() == fb.OpParameter.UnaryOp:
            u = fb.UnaryOp()
            u.Init(op.Main().Bytes, op.Main().Pos)
            kinds.append(u.OpType())
    return kinds


def _worst(got: Feeds, ref: Feeds) -> float:
    assert sorted(got) == sorted(ref)
    return max(agreement(got[k].reshape(ref[k].shape), ref[k]).max_rel for k in ref)


def _run_lifted(graph: Graph, feeds: Feeds) -> Feeds:
    ins = {v.name: v.type.dtype.numpy for v in graph.inputs}
    return run_onnxruntime(model_bytes(export_onnx(graph)), {k: feeds[k].astype(ins[k]) for k in ins})


@pytest.mark.parametrize("case", list(CASES))
def test_native_op_round_trips(case: str, tmp_path: Path) -> None:
    build, native = CASES[case]
    model, feeds = build()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    graph = load_model(src)
    PassManager(pipeline("default") + BACKEND.legalization("mnn", None)).run(graph)
    path = write_mnn(graph, tmp_path / "m.mnn", MnnOptions())[-1]
    types = mnn_op_types(path)
    assert native in types, types
    if case.startswith("silu"):
        assert {"Padding", "Reduction", "ELU", "BroadcastTo", "Cast"} <= set(types), types
        assert _unary_kinds(path) == [fb.UnaryOpOperation.SILU]  # x * sigmoid(x), fused
    lifted = load_mnn(path)
    got = _run_lifted(lifted, feeds)
    ref = run_onnxruntime(src, feeds)
    assert _worst(got, ref) <= MAX_REL
    assert _worst(got, run_mnn(path, feeds)) <= MAX_REL


@pytest.mark.parametrize("name", ["bert", "crnn", "lstm_text"])
def test_zoo_mnn_reads_back(name: str, zoo: ZooCache, tmp_path: Path) -> None:  # noqa: F811
    m = zoo.get(name)
    out = tmp_path / "out"
    assert main(["compile", str(m.model), "-o", str(out), "--emit", "mnn", "--no-verify"]) == 0
    with np.load(m.inputs) as z:
        feeds = {k: z[k] for k in z.files}
    lifted = load_mnn(out / "model.mnn")
    ops = {n.op for n in lifted.ops()}
    want = {"bert": {"LayerNormalization", "MatMul", "FusedConv"}, "crnn": {"LSTM"}, "lstm_text": {"LSTM"}}[name]
    assert want <= ops, ops
    assert _worst(_run_lifted(lifted, feeds), run_onnxruntime(m.model, feeds)) <= MAX_REL


def test_int8_lstm_reads_back_dequantized(tmp_path: Path) -> None:
    """int8 W, R (levels, Cast, per-row scales) come back as the float weights MNN decodes."""
    model, feeds = _recurrent("LSTM", "bidirectional", True)()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    graph = load_model(src)
    PassManager(pipeline("default")).run(graph)
    path = write_mnn(graph, tmp_path / "m.mnn", MnnOptions(weights="int8", min_cosine=0.0))[-1]
    assert "Cast" in mnn_op_types(path)
    lifted = load_mnn(path)
    assert {n.op for n in lifted.ops()} == {"LSTM"}  # the dequantization folds to constants
    assert _worst(_run_lifted(lifted, feeds), run_mnn(path, feeds)) <= MAX_REL
