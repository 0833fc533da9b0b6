"""Ops the MNN writer hands to MNN's own kernels: LSTM / RNN, ScatterND, LayerNorm, plus the Gelu
and LogSoftmax decompositions, int32 reductions, each against onnxruntime in MNN 3.6.1's runtime.

MNN's per-op callback (``tests.helpers.mnn_callback``) shows what the runtime executes: a
LayerNorm or a UnaryOp runs as itself; an LSTM / RNN / ScatterNd runs as the ``While`` loops
and ``Raster`` copies MNN's geometry stage makes of it (no Kiln-side decomposition in the file).
The refusals give their reason (the cases where MNN's kernel computes something else).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

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

FP32_MAX_REL = 1e-5  # worst output's max|mnn - ort| / max|ort|


def _graph(model: onnx.ModelProto, tmp_path: Path, legalize: bool = False) -> tuple[Graph, Path]:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    PassManager(pipeline("default")).run(graph)
    if legalize:
        PassManager(BACKEND.legalization("mnn", None)).run(graph)
    return graph, path


def _compile_and_run(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    tmp_path: Path,
    legalize: bool = False,
    options: MnnOptions | None = None,
) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    graph, path = _graph(model, tmp_path, legalize)
    mnn = write_mnn(graph, tmp_path / "m.mnn", options or MnnOptions())[-1]
    return mnn, run_mnn(mnn, feeds), run_onnxruntime(path, feeds)


def _worst(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    assert sorted(got) == sorted(ref)
    return max(agreement(got[k], ref[k]).max_rel for k in ref)


def _ran(path: Path, feeds: dict[str, np.ndarray]) -> set[str]:
    return {kind for kind, _ in executed_ops(path, feeds)}


def _model(
    nodes: list[onnx.NodeProto],
    ins: list[onnx.ValueInfoProto],
    outs: list[str],
    inits: list[onnx.TensorProto],
    opset: int = 18,
    out_type: int = T.FLOAT,
) -> onnx.ModelProto:
    outputs = [oh.make_tensor_value_info(o, out_type, None) for o in outs]
    graph = oh.make_graph(nodes, "g", ins, outputs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def _f32(name: str, a: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(a), name)


# ---------------------------------------------------------------- LSTM / RNN
def _recurrent(
    op: str, direction: str, init: bool, **attrs: object
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    seq, batch, inp, hid, g = 5, 2, 3, 4, {"LSTM": 4, "RNN": 1}[op]
    nd = 2 if direction == "bidirectional" else 1
    inits = [
        _f32("W", rng.standard_normal((nd, g * hid, inp)).astype(np.float32)),
        _f32("R", rng.standard_normal((nd, g * hid, hid)).astype(np.float32)),
        _f32("B", rng.standard_normal((nd, 2 * g * hid)).astype(np.float32)),
    ]
    names = ["x", "W", "R", "B", ""]
    ins = [oh.make_tensor_value_info("x", T.FLOAT, [seq, batch, inp])]
    feeds = {"x": rng.standard_normal((seq, batch, inp)).astype(np.float32)}
    if init:
        for s in ["h0", "c0"][: 2 if op == "LSTM" else 1]:
            names.append(s)
            ins.append(oh.make_tensor_value_info(s, T.FLOAT, [nd, batch, hid]))
            feeds[s] = rng.standard_normal((nd, batch, hid)).astype(np.float32)
    outs = ["y", "yh", "yc"][: 3 if op == "LSTM" else 2]
    node = oh.make_node(op, names, outs)
    node.attribute.extend(
        oh.make_attribute(k, v) for k, v in {"hidden_size": hid, "direction": direction, **attrs}.items()
    )
    return _model([node], ins, outs, inits, opset=14), feeds


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("init", [True, False])
def test_recurrent_is_native_and_matches(op: str, direction: str, init: bool, tmp_path: Path) -> None:
    model, feeds = _recurrent(op, direction, init)
    mnn, got, ref = _compile_and_run(model, feeds, tmp_path)
    assert mnn_op_types(mnn).count(op) == 1
    assert {"While", "Raster"} <= _ran(mnn, feeds)  # MNN's geometry loops of its LSTM op
    assert _worst(got, ref) <= FP32_MAX_REL


@pytest.mark.parametrize(
    ("weights", "asymmetric", "floor"),
    [("int8", False, 0.9999), ("int4", True, 0.99), ("fp16", False, 0.999999)],
)
def test_recurrent_int_weights(weights: str, asymmetric: bool, floor: float, tmp_path: Path) -> None:
    """W and R as int8 levels + per-row scales; MNN folds the dequantization at load."""
    model, feeds = _recurrent("LSTM", "bidirectional", True)
    graph, path = _graph(model, tmp_path)
    opts = MnnOptions(weights=weights, asymmetric=asymmetric, min_cosine=0.0 if weights != "fp16" else None)
    mnn = write_mnn(graph, tmp_path / "m.mnn", opts)[-1]
    types = mnn_op_types(mnn)
    casts = 0 if weights == "fp16" else 2  # fp16 storage keeps W, R fp32 (MNN has no half constants)
    assert types.count("Cast") == casts and types.count("LSTM") == 1
    assert "Cast" not in _ran(mnn, feeds) and "BinaryOp" not in _ran(mnn, feeds)  # folded at load
    got, ref = run_mnn(mnn, feeds), run_onnxruntime(path, feeds)
    assert min(agreement(got[k], ref[k]).cosine for k in ref) >= floor
    if weights == "fp16":
        assert _worst(got, ref) <= FP32_MAX_REL


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"direction": "reverse"}, "direction reverse (MNN runs a single direction forward)"),
        ({"clip": 2.0}, "clip"),
        ({"input_forget": 1}, "input_forget"),
        (
            {"activations": ["Relu", "Tanh", "Tanh"]},
            "activations ['Relu', 'Tanh', 'Tanh'] (MNN's kernel has the defaults only)",
        ),
    ],
)
def test_recurrent_refusals(attrs: dict[str, object], reason: str, tmp_path: Path) -> None:
    direction = str(attrs.pop("direction", "forward"))
    model, _ = _recurrent("LSTM", direction, False, **attrs)
    graph, _ = _graph(model, tmp_path)
    (node,) = [n for n in graph.ops() if n.op == "LSTM"]
    assert TABLE.reason(graph, node) == reason


# ------------------------------------------------------------------ LogSoftmax
def test_log_softmax_decomposes_stably(tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 50)).astype(np.float32) * 30
    model = _model(
        [oh.make_node("LogSoftmax", ["x"], ["y"], axis=1)],
        [oh.make_tensor_value_info("x", T.FLOAT, x.shape)],
        ["y"],
        [],
    )
    mnn, got, ref = _compile_and_run(model, {"x": x}, tmp_path, legalize=True)
    assert "Softmax" not in mnn_op_types(mnn)
    assert np.isfinite(got["y"]).all()  # log(softmax) would give -inf here
    assert _worst(got, ref) <= FP32_MAX_REL


# ------------------------------------------------------------------- ScatterND
_SCATTER_IDX = np.array([[[0, 1], [-1, 2]], [[1, -3], [2, 0]]], np.int64)


@pytest.mark.parametrize(
    ("reduction", "dtype"),
    [("none", np.float32), ("none", np.int64), ("add", np.float32), ("mul", np.float32)],
)
@pytest.mark.parametrize("const_indices", [True, False])
def test_scatter_nd_is_native_and_exact(
    reduction: str, dtype: type, const_indices: bool, tmp_path: Path
) -> None:
    rng = np.random.default_rng(2)
    tt = T.FLOAT if dtype == np.float32 else T.INT64
    idx = _SCATTER_IDX.copy()
    if reduction != "none":
        idx[1, 1] = idx[0, 0]  # a repeated index: the reduction must accumulate
    ins = [oh.make_tensor_value_info("x", tt, [3, 4, 5]), oh.make_tensor_value_info("u", tt, [2, 2, 5])]
    feeds: dict[str, np.ndarray] = {
        "x": (rng.standard_normal((3, 4, 5)) * 5).astype(dtype),
        "u": (rng.standard_normal((2, 2, 5)) * 5).astype(dtype),
    }
    inits = [_f32("idx", idx)] if const_indices else []
    if not const_indices:
        ins.append(oh.make_tensor_value_info("idx", T.INT64, list(idx.shape)))
        feeds["idx"] = idx
    extra = {} if reduction == "none" else {"reduction": reduction}
    model = _model(
        [oh.make_node("ScatterND", ["x", "idx", "u"], ["y"], **extra)], ins, ["y"], inits, out_type=tt
    )
    mnn, got, ref = _compile_and_run(model, feeds, tmp_path)
    assert mnn_op_types(mnn).count("ScatterNd") == 1
    assert np.array_equal(got["y"], ref["y"])


@pytest.mark.parametrize(
    ("reduction", "tt", "reason"),
    [
        ("max", T.FLOAT, "reduction max (MNN 3.6.1's kernel leaves data unchanged)"),
        ("min", T.FLOAT, "reduction min (MNN 3.6.1's kernel leaves data unchanged)"),
        ("add", T.INT64, "reduction add of integer tensors (wrong in MNN 3.6.1)"),
    ],
)
def test_scatter_nd_refusals(reduction: str, tt: int, reason: str, tmp_path: Path) -> None:
    ins = [oh.make_tensor_value_info("x", tt, [3, 4, 5]), oh.make_tensor_value_info("u", tt, [2, 2, 5])]
    node = oh.make_node("ScatterND", ["x", "idx", "u"], ["y"], reduction=reduction)
    graph, _ = _graph(_model([node], ins, ["y"], [_f32("idx", _SCATTER_IDX)], out_type=tt), tmp_path)
    (n,) = [n for n in graph.ops() if n.op == "ScatterND"]
    assert TABLE.reason(graph, n) == reason


# ------------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize(
    ("shape", "axis", "bias"), [((2, 7, 64), -1, True), ((1, 5, 6, 8), -2, True), ((3, 33), 1, False)]
)
def test_layer_norm_is_native_and_matches(
    shape: tuple[int, ...], axis: int, bias: bool, tmp_path: Path
) -> None:
    rng = np.random.default_rng(3)
    inner = shape[axis:]
    inits = [_f32("s", rng.standard_normal(inner).astype(np.float32))]
    if bias:
        inits.append(_f32("b", rng.standard_normal(inner).astype(np.float32)))
    node = oh.make_node(
        "LayerNormalization", ["x", "s", "b"] if bias else ["x", "s"], ["y"], axis=axis, epsilon=1e-5
    )
    model = _model([node], [oh.make_tensor_value_info("x", T.FLOAT, list(shape))], ["y"], inits, opset=17)
    feeds = {"x": (rng.standard_normal(shape) * 3 + 1).astype(np.float32)}
    mnn, got, ref = _compile_and_run(model, feeds, tmp_path, legalize=True)
    assert mnn_op_types(mnn) == ["Input", "LayerNorm"]
    assert _ran(mnn, feeds) == {"LayerNorm"}
    assert _worst(got, ref) <= FP32_MAX_REL


def test_layer_norm_with_used_mean_is_decomposed(tmp_path: Path) -> None:
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    node = oh.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], axis=-1)
    model = _model(
        [node],
        [oh.make_tensor_value_info("x", T.FLOAT, [2, 8])],
        ["y", "mean"],
        [_f32("s", np.ones(8, np.float32))],
        opset=17,
    )
    graph, _ = _graph(model, tmp_path)
    (n,) = [n for n in graph.ops() if n.op == "LayerNormalization"]
    assert TABLE.reason(graph, n) == "the Mean / InvStdDev outputs"
    mnn, got, ref = _compile_and_run(model, {"x": x}, tmp_path, legalize=True)
    assert "LayerNorm" not in mnn_op_types(mnn)
    assert _worst(got, ref) <= FP32_MAX_REL


# ------------------------------------------------------------------------ Gelu
_GELU_X = np.linspace(-12, 12, 24001, dtype=np.float32).reshape(1, -1)


def test_gelu_erf_is_lowered_as_an_exp_chain_and_matches(tmp_path: Path) -> None:
    """--mnn-gelu exact: MNN's ERF and GELU_STANDARD are scalar and slow, so Kiln writes
    x / (1 + exp(-x * h(x^2))) (one UnaryOp EXP, ten BinaryOps), within 2e-6 of onnxruntime's exact
    Gelu (backends/mnn/lower/gelu.py)."""
    model = _model(
        [oh.make_node("Gelu", ["x"], ["y"])],
        [oh.make_tensor_value_info("x", T.FLOAT, list(_GELU_X.shape))],
        ["y"],
        [],
        opset=20,
    )
    graph, _ = _graph(model, tmp_path)
    (n,) = [n for n in graph.ops() if n.op == "Gelu"]
    assert TABLE.reason(graph, n) is None
    exact = MnnOptions(gelu="exact")
    mnn, got, ref = _compile_and_run(model, {"x": _GELU_X}, tmp_path, legalize=True, options=exact)
    types = mnn_op_types(mnn)
    assert sorted(set(types)) == ["BinaryOp", "Const", "Input", "UnaryOp"]
    assert (types.count("UnaryOp"), types.count("BinaryOp")) == (1, 10)
    assert np.abs(got["y"] - ref["y"]).max() <= 2e-6


def test_gelu_tanh_is_decomposed_and_accurate(tmp_path: Path) -> None:
    """MNN's UnaryOp GELU (Padé tanh) is off by 1.8e-4 at x = -3.79; the decomposition is not."""
    model = _model(
        [oh.make_node("Gelu", ["x"], ["y"], approximate="tanh")],
        [oh.make_tensor_value_info("x", T.FLOAT, list(_GELU_X.shape))],
        ["y"],
        [],
        opset=20,
    )
    graph, _ = _graph(model, tmp_path)
    (n,) = [n for n in graph.ops() if n.op == "Gelu"]
    assert TABLE.reason(graph, n) is not None
    mnn, got, ref = _compile_and_run(model, {"x": _GELU_X}, tmp_path, legalize=True)
    assert "Gelu" not in mnn_op_types(mnn)
    assert np.abs(got["y"] - ref["y"]).max() <= 1e-5


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"])
def test_int32_reductions_run_as_mnn_int_reductions(op: str, tmp_path: Path) -> None:
    """An int32 reduction (an attention mask's row count) is MNN's Reduction with dType int32:
    exact against onnxruntime, integer mean truncating toward zero as both do."""
    x = np.random.default_rng(3).integers(-7, 8, (2, 5, 3)).astype(np.int32)
    x[0, :2, 0] = -1  # a mean of -0.4 truncates to 0
    node = oh.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    graph = oh.make_graph(
        [node],
        "g",
        [oh.make_tensor_value_info("x", T.INT32, [2, 5, 3])],
        [oh.make_tensor_value_info("y", T.INT32, None)],
        [onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    mnn, got, ref = _compile_and_run(model, {"x": x}, tmp_path)
    np.testing.assert_array_equal(got["y"].reshape(ref["y"].shape), ref["y"])
    assert [t for t, _ in executed_ops(mnn, {"x": x})] == ["Reduction"]
