"""Models saved by onnxruntime's graph optimizer: its fused ops import as the plain ops they fused.

onnxruntime writes FusedConv, FusedGemm, FusedMatMul, QuickGelu, SimplifiedLayerNormalization,
SkipSimplifiedLayerNormalization (and LayerNormalization before opset 17) into a model saved
with ``optimized_model_filepath``. Each op is checked on small graphs against onnxruntime
(Kiln's interpreter and Kiln's export run by onnxruntime), then zoo models are optimized by
onnxruntime here (extended level) and compiled.

Tolerances and why:

* single ops: OP_RTOL / OP_ATOL, float32 rounding of differently ordered sums (alpha folded
  into the product or applied after it, one-pass vs two-pass mean of squares);
* zoo models: ZOO_MAX_REL of the output's largest magnitude, onnxruntime's own fused kernels
  (on the optimized file) against its unfused ones (on the original), a few float32 ulps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler.api import PassManager
from compiler.errors import ConversionError
from compiler.ir import run_graph
from compiler.onnx_export import export_onnx, model_bytes
from compiler.pipelines import pipeline
from frontends.onnx import load_onnx
from tests.helpers.conformance import ort_session
from tests.helpers.numerics import assert_close
from tests.helpers.pass_check import op_counts
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

MS = "com.microsoft"
OP_RTOL, OP_ATOL = 1e-5, 1e-5
ZOO_MAX_REL = 1e-4
RNG = np.random.default_rng(7)


def _model(
    nodes: Sequence[onnx.NodeProto], feeds: Mapping[str, np.ndarray], outs: Sequence[str], opset: int = 17
) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes),
        "ort_fused",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
    )
    ops = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=ops, ir_version=8)


def _check(
    nodes: Sequence[onnx.NodeProto],
    feeds: Mapping[str, np.ndarray],
    outs: Sequence[str] = ("Y",),
    opset: int = 17,
) -> Counter[str]:
    """Kiln's interpreter and Kiln's export (run by onnxruntime) against onnxruntime; the op counts."""
    model = _model(nodes, feeds, outs, opset)
    want = ort_session(model).run(None, dict(feeds))
    graph = load_onnx(model)
    got = run_graph(graph, feeds)
    exported = export_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    ran = ort_session(model_bytes(exported)).run(None, dict(feeds))
    for i, name in enumerate(outs):
        assert_close(
            got[graph.outputs[i].name], want[i], rtol=OP_RTOL, atol=OP_ATOL, what=f"{name} (interpreter)"
        )
        assert_close(ran[i], want[i], rtol=OP_RTOL, atol=OP_ATOL, what=f"{name} (export)")
    counts = op_counts(graph)
    assert not [op for op in counts if op.startswith(MS)], counts
    return counts


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CONV_ACTIVATIONS: list[tuple[str | None, list[float], str | None]] = [
    (None, [], None),
    ("Relu", [], "Relu"),
    ("Tanh", [], "Tanh"),
    ("Sigmoid", [], "Sigmoid"),
    ("LeakyRelu", [0.2], "LeakyRelu"),
    ("HardSigmoid", [0.3, 0.4], "HardSigmoid"),
    ("Clip", [-0.5, 0.7], "Clip"),
]


@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize(("act", "params", "op"), CONV_ACTIVATIONS)
def test_fused_conv_is_conv_add_activation(
    act: str | None, params: list[float], op: str | None, with_z: bool
) -> None:
    feeds = {"X": _rand(1, 4, 7, 7), "W": _rand(6, 2, 3, 3), "B": _rand(6)}
    if with_z:
        feeds["Z"] = _rand(1, 6, 4, 4)
    attrs: dict[str, Any] = {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}
    if act is not None:
        attrs["activation"] = act
    if params:
        attrs["activation_params"] = params
    counts = _check([helper.make_node("FusedConv", list(feeds), ["Y"], domain=MS, **attrs)], feeds)
    want = Counter({"Conv": 1}) + Counter({"Add": int(with_z)}) + Counter({op: 1} if op else {})
    assert counts == want


@pytest.mark.parametrize(
    ("act", "attrs", "op"),
    [  # onnxruntime requires an activation on FusedGemm
        ("Relu", {}, "Relu"),
        ("LeakyRelu", {"activation_alpha": 0.2}, "LeakyRelu"),
        ("Elu", {"activation_alpha": 0.7}, "Elu"),
        ("Selu", {"activation_alpha": 1.5, "activation_gamma": 1.2}, "Selu"),
        ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.2}, "HardSigmoid"),
        ("ThresholdedRelu", {"activation_alpha": 0.3}, "ThresholdedRelu"),
        ("Softplus", {}, "Softplus"),
        ("Softsign", {}, "Softsign"),
    ],
)
def test_fused_gemm_is_gemm_activation(act: str, attrs: dict[str, float], op: str) -> None:
    feeds = {"A": _rand(3, 4), "B": _rand(5, 4), "C": _rand(5)}
    kw: dict[str, Any] = {"transB": 1, "alpha": 0.5, "beta": 2.0, "activation": act, **attrs}
    counts = _check([helper.make_node("FusedGemm", ["A", "B", "C"], ["Y"], domain=MS, **kw)], feeds)
    assert counts == Counter({"Gemm": 1, op: 1})


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "attrs", "transposes"),
    [
        ((2, 3, 4, 5), (3, 5, 6), {}, 0),
        ((2, 3, 5, 4), (5, 6), {"transA": 1, "alpha": 0.125}, 1),
        ((2, 3, 4, 5), (2, 3, 6, 5), {"transB": 1, "alpha": 2.0}, 1),
        ((4, 2, 3, 5), (2, 3, 5, 6), {"transBatchA": 1}, 1),
        ((4, 2, 3, 5), (2, 3, 4, 6), {"transBatchA": 1, "transA": 1}, 1),
        ((2, 3, 4, 6), (6, 2, 3, 5), {"transBatchB": 1}, 1),
        ((2, 3, 4, 5), (6, 2, 3, 5), {"transBatchB": 1, "transB": 1, "alpha": 0.5}, 1),
        ((4, 5), (6, 5), {"transB": 1}, 1),
    ],
)
def test_fused_matmul_permutes_then_multiplies(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], attrs: dict[str, Any], transposes: int
) -> None:
    feeds = {"A": _rand(*a_shape), "B": _rand(*b_shape)}
    batched = "transBatchA" in attrs or "transBatchB" in attrs
    for op_type in ("FusedMatMul",) if batched else ("FusedMatMul", "TransposeMatMul"):
        counts = _check([helper.make_node(op_type, ["A", "B"], ["Y"], domain=MS, **attrs)], feeds)
        assert counts["MatMul"] == 1 and counts["Transpose"] == transposes  # one permutation per operand
        assert counts["Mul"] == int(attrs.get("alpha", 1.0) != 1.0)


def test_fused_matmul_trans_batch_needs_one_rank_of_at_least_three() -> None:
    feeds = {"A": _rand(2, 4, 5), "B": _rand(5, 6)}
    node = helper.make_node("FusedMatMul", ["A", "B"], ["Y"], domain=MS, name="mm", transBatchA=1)
    with pytest.raises(ConversionError, match="mm.*transBatch needs both inputs of one rank >= 3"):
        load_onnx(_model([node], feeds, ["Y"]))


def test_fused_matmul_transposes_a_constant_weight_at_import() -> None:
    """alpha · A · Wᵀ with W an initializer: the transpose folds into the constant (one MatMul, one Mul)."""
    a, w = _rand(2, 4, 5), _rand(6, 5)
    node = helper.make_node("FusedMatMul", ["A", "W"], ["Y"], domain=MS, transB=1, alpha=0.25)
    model = _model([node], {"A": a}, ["Y"])
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "W"))
    graph = load_onnx(model)
    assert op_counts(graph) == Counter({"MatMul": 1, "Mul": 1})
    assert_close(
        run_graph(graph, {"A": a})[graph.outputs[0].name], 0.25 * a @ w.T, rtol=OP_RTOL, atol=OP_ATOL
    )


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_quick_gelu_is_x_times_sigmoid_alpha_x(alpha: float) -> None:
    feeds = {"X": _rand(2, 3, 8) * 3}
    counts = _check([helper.make_node("QuickGelu", ["X"], ["Y"], domain=MS, alpha=alpha)], feeds)
    assert counts == Counter({"Sigmoid": 1, "Mul": 1 + int(alpha != 1.0)})


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm_is_rms_norm_with_its_inverse_rms(axis: int) -> None:
    x = _rand(2, 3, 8)
    scale = _rand(*x.shape[axis:]) if axis == -1 else _rand(3, 8)
    feeds = {"X": x, "S": scale}
    node = helper.make_node("SimplifiedLayerNormalization", ["X", "S"], ["Y", "R"], axis=axis, epsilon=1e-3)
    counts = _check([node], feeds, outs=("Y", "R"))
    assert counts["RMSNormalization"] == 1 and counts["ReduceMean"] == 1
    y_only = helper.make_node("SimplifiedLayerNormalization", ["X", "S"], ["Y"], axis=axis, epsilon=1e-3)
    assert _check([y_only], feeds) == Counter({"RMSNormalization": 1})


@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_norm_adds_then_normalizes(with_bias: bool) -> None:
    feeds = {"X": _rand(2, 5, 8), "K": _rand(2, 5, 8), "G": _rand(8)}
    if with_bias:
        feeds["Bias"] = _rand(8)
    node = helper.make_node(
        "SkipSimplifiedLayerNormalization", list(feeds), ["Y", "", "", "S"], domain=MS, epsilon=1e-5
    )
    counts = _check([node], feeds, outs=("Y", "S"))
    assert counts == Counter({"Add": 1 + int(with_bias), "RMSNormalization": 1})


def test_skip_simplified_layer_norm_refuses_the_mean_output() -> None:
    feeds = {"X": _rand(2, 8), "K": _rand(2, 8), "G": _rand(8)}
    node = helper.make_node("SkipSimplifiedLayerNormalization", list(feeds), ["Y", "M"], domain=MS)
    with pytest.raises(ConversionError, match="output 1 \\(mean\\)"):
        load_onnx(_model([node], feeds, ["Y", "M"]))


def test_layer_norm_before_opset_17_is_onnxruntimes_op() -> None:
    feeds = {"X": _rand(2, 5, 8), "G": _rand(8), "B": _rand(8)}
    node = helper.make_node("LayerNormalization", ["X", "G", "B"], ["Y"], axis=-1, epsilon=1e-5)
    assert _check([node], feeds, opset=14) == Counter({"LayerNormalization": 1})


def test_unknown_fused_activation_is_refused_by_name() -> None:
    feeds = {"X": _rand(1, 2, 5, 5), "W": _rand(3, 2, 3, 3)}
    node = helper.make_node("FusedConv", ["X", "W"], ["Y"], domain=MS, name="c1", activation="Swoosh")
    with pytest.raises(ConversionError, match="c1.*activation 'Swoosh' is not supported"):
        load_onnx(_model([node], feeds, ["Y"]))


def test_wrong_activation_params_count_is_refused() -> None:
    feeds = {"X": _rand(1, 2, 5, 5), "W": _rand(3, 2, 3, 3)}
    node = helper.make_node(
        "FusedConv", ["X", "W"], ["Y"], domain=MS, activation="HardSigmoid", activation_params=[0.2]
    )
    with pytest.raises(ConversionError, match="HardSigmoid takes 2 activation_params, got 1"):
        load_onnx(_model([node], feeds, ["Y"]))


# ------------------------------------------------------------------------------ zoo models
ORT_FUSED = ("FusedConv", "FusedGemm", "FusedMatMul", "QuickGelu", "SimplifiedLayerNormalization")
ZOO_CASES = {
    # model: (onnxruntime's fused ops the optimized file must hold, same pipeline op counts as the original)
    "resnet18": ({"FusedConv"}, True),
    "mixnet_s": ({"FusedConv", "QuickGelu"}, True),
    "vit_tiny_patch16_224": ({"FusedMatMul"}, False),
    "clip_vision": ({"FusedMatMul", "QuickGelu"}, False),
    "t5_encoder": ({"SimplifiedLayerNormalization"}, False),
}


def _ort_optimized(src: Path, dst: Path) -> onnx.ModelProto:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 3
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return onnx.load(dst)


def _after_pipeline(model: onnx.ModelProto) -> tuple[Any, Counter[str]]:
    graph = load_onnx(model)
    PassManager(pipeline("default")).run(graph)
    return graph, op_counts(graph)


def _compiles_and_matches(
    name: str, optimized: onnx.ModelProto, original: onnx.ModelProto, inputs: Path
) -> Counter[str]:
    """``optimized`` after the default pipeline holds no com.microsoft op and, exported, is within
    ZOO_MAX_REL of onnxruntime on ``original``; its op counts."""
    feeds = dict(np.load(inputs))
    want = ort_session(original).run(None, feeds)
    graph, counts = _after_pipeline(optimized)
    assert not [op for op in counts if op.startswith(MS)], counts
    got = ort_session(model_bytes(export_onnx(graph))).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        err = float(np.max(np.abs(g - w))) / max(1.0, float(np.max(np.abs(w))))
        assert err <= ZOO_MAX_REL, f"{name}: max rel {err:.3g}"
    return counts


@pytest.mark.parametrize("name", sorted(ZOO_CASES))
def test_onnxruntime_optimized_zoo_model_compiles_and_matches(
    name: str,
    zoo: ZooCache,  # noqa: F811
    tmp_path: Path,
) -> None:
    m = zoo.get(name)
    fused_ops, same_counts = ZOO_CASES[name]
    original = onnx.load(m.model)
    optimized = _ort_optimized(m.model, tmp_path / "optimized.onnx")
    held = Counter(n.op_type for n in optimized.graph.node if n.op_type in ORT_FUSED)
    assert fused_ops <= set(held), held
    counts = _compiles_and_matches(name, optimized, original, m.inputs)
    if same_counts:
        assert counts == _after_pipeline(original)[1]
    if "FusedMatMul" in held:
        assert counts["MatMul"] + counts["Gemm"] >= held["FusedMatMul"]
    if "SimplifiedLayerNormalization" in held:
        assert counts["RMSNormalization"] == held["SimplifiedLayerNormalization"]


# ------------------------------------------------------------------ EmbedLayerNormalization
def _embed_case(
    segments: bool, mask: bool, position_ids: tuple[int, int] | None
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """EmbedLayerNormalization on B=2, S=5, H=8 with constant tables; the int32 feeds."""
    b, s, h, vocab = 2, 5, 8, 11
    feeds = {"ids": RNG.integers(0, vocab, (b, s)).astype(np.int32)}
    ins = ["ids", "seg" if segments else "", "word", "pos", "segtab" if segments else "", "gamma", "beta"]
    if segments:
        feeds["seg"] = RNG.integers(0, 2, (b, s)).astype(np.int32)
    if mask:
        feeds["mask"] = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 2]], np.int32)  # a 2 is not counted
    if position_ids is not None:
        feeds["pid"] = RNG.integers(0, 7, position_ids).astype(np.int32)
    ins += ["mask" if mask else "", "pid" if position_ids else ""]
    while not ins[-1]:
        ins.pop()
    tables = {
        "word": _rand(vocab, h),
        "pos": _rand(7, h),
        "segtab": _rand(2, h),
        "gamma": _rand(h),
        "beta": _rand(h),
    }
    node = helper.make_node("EmbedLayerNormalization", ins, ["Y", "mask_index", "E"], domain=MS, epsilon=1e-5)
    graph = helper.make_graph(
        [node],
        "embed",
        [helper.make_tensor_value_info(k, TensorProto.INT32, v.shape) for k, v in feeds.items()],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("mask_index", TensorProto.INT32, None),
            helper.make_tensor_value_info("E", TensorProto.FLOAT, None),
        ],
        [onnx.numpy_helper.from_array(v, k) for k, v in tables.items() if k in ins],
    )
    ops = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=ops, ir_version=8), feeds


@pytest.mark.parametrize(
    ("segments", "mask", "position_ids"),
    [(True, True, None), (False, False, None), (False, True, (2, 5)), (True, False, (1, 5))],
)
def test_embed_layer_norm_gathers_sums_and_normalizes(
    segments: bool, mask: bool, position_ids: tuple[int, int] | None
) -> None:
    model, feeds = _embed_case(segments, mask, position_ids)
    want = ort_session(model).run(None, feeds)
    graph = load_onnx(model)
    got = run_graph(graph, feeds)
    ran = ort_session(model_bytes(export_onnx(graph))).run(None, feeds)
    for i, out in enumerate(graph.outputs):
        tol = 0 if want[i].dtype.kind == "i" else OP_ATOL
        assert_close(
            got[out.name], want[i], rtol=OP_RTOL if tol else 0, atol=tol, what=f"{out.name} (interpreter)"
        )
        assert_close(ran[i], want[i], rtol=OP_RTOL if tol else 0, atol=tol, what=f"{out.name} (export)")
    counts = op_counts(graph)
    gathers = 1 + int(segments) + int(position_ids is not None)  # position[0..S-1] folds to a constant
    assert counts["LayerNormalization"] == 1 and counts["Gather"] == gathers
    assert counts["ReduceSum"] == int(mask)


TRANSFORMER_OPTIMIZER_CASES = {
    # model: (model_type, heads, hidden, onnxruntime's fused ops the optimized file must hold)
    "distilbert": (
        "bert",
        4,
        128,
        {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"},
    ),
    "gpt2": ("gpt2", 4, 128, {"SkipLayerNormalization", "FastGelu"}),
    "llama": ("gpt2", 4, 128, {"SkipSimplifiedLayerNormalization"}),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMER_OPTIMIZER_CASES))
def test_onnxruntime_transformer_optimizer_output_compiles_and_matches(
    name: str,
    zoo: ZooCache,  # noqa: F811
    tmp_path: Path,
) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    model_type, heads, hidden, fused_ops = TRANSFORMER_OPTIMIZER_CASES[name]
    m = zoo.get(name)
    opt = optimize_model(
        str(m.model), model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0
    )
    opt.save_model_to_file(str(tmp_path / "optimized.onnx"))  # as users get it: with the com.microsoft opset
    optimized = onnx.load(tmp_path / "optimized.onnx")
    held = Counter(n.op_type for n in optimized.graph.node if n.domain == MS)
    assert fused_ops <= set(held), held
    _compiles_and_matches(name, optimized, onnx.load(m.model), m.inputs)
