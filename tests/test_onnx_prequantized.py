"""Pre-quantized ONNX: QOperator, integer and com.microsoft contrib ops lifted into Kiln's QDQ form.

Models are quantized here by onnxruntime.quantization (quantize_static QOperator on a CNN,
quantize_dynamic on MatMul / LSTM models) or fused by onnxruntime's transformer optimizer
(a two-layer BERT-like graph), imported with Kiln, run through the interpreter and through
export -> onnxruntime, and compared with onnxruntime on the original model.

Tolerances and why:

* quantized (8-bit) tensors: ±1 LSB. The QDQ form computes conv(dq(x), dq(W)) / s_y in float
  where onnxruntime scales its int32 accumulator by float32(s_x s_w / s_y): a value that lands
  within float rounding of a .5 tie may round the other way;
* float outputs of DequantizeLinear: one output step (its scale), the same ±1 LSB;
* integer ops (MatMulInteger, ConvInteger, DynamicQuantizeLinear): exact (0);
* DynamicQuantizeLSTM: onnxruntime quantizes the hidden state to uint8 at every step, Kiln's
  LSTM keeps it float (X's run-time quantization is reproduced exactly): |Δ| <= LSTM_ATOL,
  half of the largest uint8 step of h in (-1, 1), 2/255 (the rounding onnxruntime adds each step);
* float contrib ops: FLOAT_ATOL, float32 rounding of differently ordered sums (Gemm with
  alpha vs Mul, one-pass vs two-pass layer-norm statistics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from compiler.errors import ConversionError, UnsupportedOpsError
from compiler.ir import run_graph
from compiler.onnx_export import export_onnx, model_bytes
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from frontends.onnx import load_onnx
from tests.helpers.conformance import ort_session
from tests.helpers.numerics import assert_close
from tests.helpers.pass_check import op_counts, run_passes
from tests.helpers.prequantized_models import (
    BERT_HEADS,
    BERT_HIDDEN,
    bert_model,
    cnn_model,
    matmul_lstm_model,
)

MS = "com.microsoft"
LSB = 1
LSTM_ATOL = 0.5 * 2 / 255
FLOAT_ATOL = 5e-6
S8_WEIGHTS = (-64, 65)
"""Signed weights in 7 bits (``reduce_range`` for onnxruntime's quantizer): on x86 without VNNI,
onnxruntime's u8 x s8 kernels (QLinearConv, QGemm, MatMulInteger, DynamicQuantizeLSTM) add byte
products in pairs with VPMADDUBSW, which saturates at int16 once 255 * |w| * 2 > 32767; with
|w| <= 64 onnxruntime computes the ops' definition exactly on every host, so it stays the judge."""


def _three(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], ...]:
    """(onnxruntime on ``model``, Kiln's interpreter, Kiln's export run by onnxruntime) outputs."""
    want = [np.asarray(a) for a in ort_session(model).run(None, dict(feeds))]
    graph = load_onnx(model)
    got = run_graph(graph, feeds)
    exported = export_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    ran = ort_session(model_bytes(exported)).run(None, dict(feeds))
    return want, [got[v.name] for v in graph.outputs], [np.asarray(a) for a in ran]


def _check(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], atol: float | list[float]) -> float:
    """Both Kiln paths against onnxruntime (integers: |Δ| <= atol LSB); the worst |Δ| seen."""
    want, interp, exported = _three(model, feeds)
    tols = atol if isinstance(atol, list) else [atol] * len(want)
    worst = 0.0
    for i, (w, tol) in enumerate(zip(want, tols, strict=True)):
        for path, got in (("interpreter", interp[i]), ("exported", exported[i])):
            assert got.dtype == w.dtype, f"{path} output {i}: {got.dtype} != {w.dtype}"
            g64, w64 = got.astype(np.float64), w.astype(np.float64)
            assert_close(g64, w64, rtol=0.0, atol=tol, what=f"{path} output {i}")
            worst = max(worst, float(np.max(np.abs(g64 - w64), initial=0.0)))
    return worst


def _contrib(
    op: str,
    inputs: Sequence[tuple[str, np.ndarray | None]],
    attrs: Mapping[str, Any] | None = None,
    *,
    consts: tuple[str, ...] = (),
    outputs: int = 1,
    domain: str = MS,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model of ``op`` in ``domain``; inputs named in ``consts`` are initializers."""
    names = [n if a is not None else "" for n, a in inputs]
    node = helper.make_node(
        op, names, [f"y{i}" for i in range(outputs)], domain=domain, name="n0", **(attrs or {})
    )
    present = [(n, a) for n, a in inputs if a is not None]
    g_in = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in present
        if n not in consts
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in present if n in consts]
    outs = [helper.make_empty_tensor_value_info(f"y{i}") for i in range(outputs)]
    graph = helper.make_graph([node], op.lower(), g_in, outs, initializer=inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model, {n: a for n, a in present if n not in consts}


def _u8(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.integers(0, 256, shape, dtype=np.uint8)


def _f(v: float) -> np.ndarray:
    return np.array(v, np.float32)


def _z(v: int, dtype: Any = np.uint8) -> np.ndarray:
    return np.array(v, dtype)


# ------------------------------------------------------------------ onnxruntime.quantization
class _Reader(CalibrationDataReader):
    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self._it = iter([{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _output_scale(model: onnx.ModelProto) -> float:
    (dq,) = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return float(init[dq.input[1]])


def _qoperator_cnn(tmp_path: Path, per_channel: bool, act: QuantType) -> Path:
    """The test CNN quantized by onnxruntime's quantize_static in QOperator form (its path)."""
    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn_q.onnx"
    onnx.save(cnn_model(), src)
    quantize_static(
        str(src),
        str(dst),
        _Reader(1),
        quant_format=QuantFormat.QOperator,
        per_channel=per_channel,
        activation_type=act,
        weight_type=QuantType.QInt8,
        reduce_range=True,  # see S8_WEIGHTS
    )
    return dst


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("act", [QuantType.QUInt8, QuantType.QInt8], ids=["u8", "s8"])
def test_quantize_static_qoperator_cnn(tmp_path: Path, per_channel: bool, act: QuantType) -> None:
    model = onnx.load(_qoperator_cnn(tmp_path, per_channel, act))
    ops = {(n.domain, n.op_type) for n in model.graph.node}
    assert {("", "QLinearConv"), (MS, "QLinearAdd"), (MS, "QLinearGlobalAveragePool"), (MS, "QGemm")} <= ops
    graph = load_onnx(model)
    counts = op_counts(graph)
    assert not {"QLinearConv", "QLinearAdd", "QGemm"} & set(counts)
    assert counts["Conv"] == 3 and counts["Gemm"] == 1 and counts["Add"] == 1
    # Kiln's QDQ form is what fuse-quantized-ops turns into integer kernels
    assert run_passes(graph, ["fuse-quantized-ops"]).applied.get("quantized-conv", 0) >= 2
    # every quantized activation is compared too: the QLinear* outputs become graph outputs
    inner = [n.output[0] for n in model.graph.node if n.op_type.startswith("QLinear") or n.op_type == "QGemm"]
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in inner)
    feeds = {"x": np.random.default_rng(2).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)}
    step = _output_scale(model)
    _check(model, feeds, [step * LSB * (1 + 1e-6)] + [LSB] * len(inner))


def test_default_pipeline_keeps_the_integer_weights_of_a_quantized_source(tmp_path: Path) -> None:
    """dq(W_q) stays a node through the optimize pipeline (fold-constants{dequantize=0}): the ONNX
    artifact holds int8 weights (no bigger than the source), and onnxruntime, fusing its QDQ back
    into integer kernels, computes exactly what it computes on the QOperator source."""
    dst = _qoperator_cnn(tmp_path, True, QuantType.QInt8)
    graph = load_onnx(onnx.load(dst))
    run_passes(graph, pipeline("default"))
    weights = [
        n for n in graph.ops() if n.op == "DequantizeLinear" and graph.inputs_of(n)[0].const is not None
    ]
    assert sum(graph.inputs_of(n)[0].type.dtype.numpy == np.int8 for n in weights) == 4  # 3 convs, 1 gemm
    exported = export_onnx(graph)
    data = model_bytes(exported)

    def int8_bytes(m: onnx.ModelProto) -> int:
        return sum(len(t.raw_data) for t in m.graph.initializer if t.data_type == TensorProto.INT8)

    assert int8_bytes(exported) >= int8_bytes(onnx.load(dst)) > 0  # every weight stays int8,
    assert not [
        t.name for t in exported.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) == 4
    ]
    feeds = {"x": np.random.default_rng(5).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)}
    want = run_onnxruntime(dst, feeds)
    got = run_onnxruntime(data, feeds, optimized=True)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("weight", [QuantType.QInt8, QuantType.QUInt8], ids=["s8", "u8"])
def test_quantize_dynamic_matmul_is_exact(tmp_path: Path, weight: QuantType) -> None:
    """DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul: every step is exact, so is the output."""
    src, dst = tmp_path / "mm.onnx", tmp_path / "mm_q.onnx"
    onnx.save(matmul_lstm_model(lstm=False), src)
    quantize_dynamic(str(src), str(dst), weight_type=weight, reduce_range=True)
    model = onnx.load(dst)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in model.graph.node}
    feeds = {"x": np.random.default_rng(3).normal(0, 1, (7, 2, 4)).astype(np.float32)}
    assert _check(model, feeds, 0.0) == 0.0


@pytest.mark.parametrize("weight", [QuantType.QInt8, QuantType.QUInt8], ids=["s8", "u8"])
def test_quantize_dynamic_lstm(tmp_path: Path, weight: QuantType) -> None:
    src, dst = tmp_path / "lstm.onnx", tmp_path / "lstm_q.onnx"
    onnx.save(matmul_lstm_model(), src)
    quantize_dynamic(str(src), str(dst), weight_type=weight, reduce_range=True)
    model = onnx.load(dst)
    assert (MS, "DynamicQuantizeLSTM") in {(n.domain, n.op_type) for n in model.graph.node}
    graph = load_onnx(model)
    assert op_counts(graph)["LSTM"] == 1
    for seed in (4, 5):
        feeds = {"x": np.random.default_rng(seed).normal(0, 1, (7, 2, 4)).astype(np.float32)}
        _check(model, feeds, LSTM_ATOL)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_dynamic_quantize_lstm_reproduces_x_quantization_exactly(direction: str) -> None:
    """Each direction's first step sees h = 0 (quantized exactly): only float rounding remains there."""
    rng = np.random.default_rng(6)
    d = 2 if direction == "bidirectional" else 1
    wq = rng.integers(*S8_WEIGHTS, (d, 5, 24), dtype=np.int8)
    rq = rng.integers(*S8_WEIGHTS, (d, 6, 24), dtype=np.int8)
    model, feeds = _contrib(
        "DynamicQuantizeLSTM",
        [
            ("x", rng.normal(0, 1, (3, 2, 5)).astype(np.float32)),
            ("W", wq),
            ("R", rq),
            ("B", None),
            ("sl", None),
            ("h0", None),
            ("c0", None),
            ("P", None),
            ("ws", np.full(d, 0.01, np.float32)),  # per tensor
            ("wz", np.zeros(d, np.int8)),
            ("rs", rng.uniform(0.005, 0.02, (d, 24)).astype(np.float32)),  # per channel
            ("rz", np.zeros((d, 24), np.int8)),
        ],
        {"hidden_size": 6, "direction": direction},
        consts=("W", "R", "ws", "wz", "rs", "rz"),
    )
    want, interp, exported = _three(model, feeds)
    for got in (interp[0], exported[0]):
        assert_close(got[0, 0], want[0][0, 0], rtol=0.0, atol=FLOAT_ATOL, what="forward Y at step 0")
        if d == 2:
            assert_close(
                got[-1, 1], want[0][-1, 1], rtol=0.0, atol=FLOAT_ATOL, what="reverse Y at the last step"
            )
        assert_close(got, want[0], rtol=0.0, atol=LSTM_ATOL, what="Y")


# ------------------------------------------------------------------ QOperator ops one by one
def _qlinear_cases() -> list[Any]:
    rng = np.random.default_rng(7)
    a, b = ("a", _u8(rng, 2, 3, 4, 4)), ("b", _u8(rng, 2, 3, 4, 4))
    aq = [a, ("as", _f(0.05)), ("az", _z(120))]
    bq = [b, ("bs", _f(0.03)), ("bz", _z(90))]
    yq = [("ys", _f(0.07)), ("yz", _z(128))]
    gap = [("x", _u8(rng, 2, 3, 5, 5)), ("xs", _f(0.05)), ("xz", _z(100)), ("ys", _f(0.02)), ("yz", _z(110))]
    return [
        ("QLinearAdd", aq + bq + yq, {}),
        ("QLinearMul", aq + bq + [("ys", _f(0.2)), ("yz", _z(10))], {}),
        ("QLinearSigmoid", aq + [("ys", _f(1 / 256)), ("yz", _z(0))], {}),
        ("QLinearLeakyRelu", aq + yq, {"alpha": 0.2}),
        ("QLinearConcat", [("ys", _f(0.06)), ("yz", _z(127)), *aq, *bq], {"axis": 1}),
        ("QLinearGlobalAveragePool", gap, {}),
        ("QLinearGlobalAveragePool", gap, {"channels_last": 1}),
        ("QLinearAveragePool", gap, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("QLinearAveragePool", gap, {"kernel_shape": [2, 2], "count_include_pad": 1, "pads": [0, 0, 1, 1]}),
        ("QLinearAveragePool", gap, {"kernel_shape": [2, 3], "channels_last": 1, "ceil_mode": 1}),
        ("QLinearSoftmax", aq + [("ys", _f(1 / 256)), ("yz", _z(0))], {"axis": -1, "opset": 13}),
        ("QLinearSoftmax", aq + [("ys", _f(1 / 256)), ("yz", _z(0))], {"axis": 1, "opset": 13}),
        ("QLinearSoftmax", aq + [("ys", _f(1 / 256)), ("yz", _z(0))], {"axis": 2, "opset": 11}),
    ]


@pytest.mark.parametrize(
    ("op", "inputs", "attrs"), _qlinear_cases(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_contrib_qlinear_ops(op: str, inputs: list[tuple[str, np.ndarray]], attrs: dict[str, Any]) -> None:
    consts = tuple(n for n, v in inputs if v.ndim == 0)
    model, feeds = _contrib(op, inputs, attrs, consts=consts)
    _check(model, feeds, LSB)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_qlinear_conv_and_matmul(per_channel: bool) -> None:
    rng = np.random.default_rng(8)
    ws = rng.uniform(0.002, 0.01, 6 if per_channel else 1).astype(np.float32)
    w = rng.integers(*S8_WEIGHTS, (6, 3, 3, 3), dtype=np.int8)
    conv_in = [
        ("x", _u8(rng, 1, 3, 8, 8)),
        ("xs", _f(0.04)),
        ("xz", _z(128)),
        ("w", w),
        ("ws", ws),
        ("wz", np.zeros(ws.shape, np.int8)),
        ("ys", _f(0.05)),
        ("yz", _z(100)),
        ("b", rng.integers(-2000, 2000, 6, dtype=np.int32)),
    ]
    model, feeds = _contrib(
        "QLinearConv",
        conv_in,
        {"pads": [1, 1, 1, 1], "strides": [2, 1]},
        consts=("xs", "xz", "w", "ws", "wz", "ys", "yz", "b"),
        domain="",
    )
    _check(model, feeds, LSB)
    bs = rng.uniform(0.002, 0.01, 5 if per_channel else 1).astype(np.float32)
    mm_in = [
        ("a", _u8(rng, 4, 6)),
        ("as", _f(0.04)),
        ("az", _z(128)),
        ("b", rng.integers(*S8_WEIGHTS, (6, 5), dtype=np.int8)),
        ("bs", bs),
        ("bz", np.zeros(bs.shape, np.int8)),
        ("ys", _f(0.02)),
        ("yz", _z(128)),
    ]
    model, feeds = _contrib(
        "QLinearMatMul", mm_in, consts=("as", "az", "b", "bs", "bz", "ys", "yz"), domain=""
    )
    _check(model, feeds, LSB)


@pytest.mark.parametrize("quantized_out", [True, False], ids=["u8-out", "float-out"])
def test_qgemm_alpha_scales_the_bias(quantized_out: bool) -> None:
    rng = np.random.default_rng(9)
    ins = [
        ("a", _u8(rng, 4, 6)),
        ("as", _f(0.04)),
        ("az", _z(120)),
        ("b", rng.integers(*S8_WEIGHTS, (5, 6), dtype=np.int8)),
        ("bs", rng.uniform(0.002, 0.01, 5).astype(np.float32)),
        ("bz", np.zeros(5, np.int8)),
        ("c", rng.integers(-3000, 3000, 5, dtype=np.int32)),
    ]
    if quantized_out:
        ins += [("ys", _f(0.02)), ("yz", _z(128))]
    model, feeds = _contrib("QGemm", ins, {"alpha": 0.5, "transB": 1}, consts=tuple(n for n, _ in ins[1:]))
    _check(model, feeds, LSB if quantized_out else FLOAT_ATOL)


# ------------------------------------------------------------------ integer ops
def test_matmul_integer_forms() -> None:
    """Constant b within the float32 bound: dq(scale 1) + MatMul; a long dynamic K: int32 MatMul."""
    rng = np.random.default_rng(10)
    ins = [
        ("a", _u8(rng, 3, 16)),
        ("b", rng.integers(*S8_WEIGHTS, (16, 5), dtype=np.int8)),
        ("az", _z(7)),
        ("bz", rng.integers(-5, 5, 5, dtype=np.int8)),
    ]
    model, feeds = _contrib("MatMulInteger", ins, consts=("b", "az", "bz"), domain="")
    assert op_counts(load_onnx(model))["DequantizeLinear"] == 2
    _check(model, feeds, 0.0)
    k = 300  # 300 * 255 * 255 > 2^24: float32 partial sums could be inexact
    ins = [
        ("a", _u8(rng, 3, k)),
        ("b", rng.integers(0, 256, (k, 4), dtype=np.uint8)),
        ("az", _z(0)),
        ("bz", _z(255)),
    ]
    model, feeds = _contrib("MatMulInteger", ins, consts=("az", "bz"), domain="")
    counts = op_counts(load_onnx(model))
    assert counts["DequantizeLinear"] == 0 and counts["MatMul"] == 1
    _check(model, feeds, 0.0)


def test_conv_integer_exact_and_refused_past_the_bound() -> None:
    rng = np.random.default_rng(11)
    ins = [
        ("x", _u8(rng, 1, 4, 6, 6)),
        ("w", rng.integers(0, 256, (3, 4, 3, 3), dtype=np.uint8)),
        ("xz", _z(100)),
        ("wz", _z(131)),
    ]  # onnxruntime: w_zero_point per tensor only
    model, feeds = _contrib("ConvInteger", ins, {"pads": [1, 1, 1, 1]}, consts=("w", "xz", "wz"), domain="")
    _check(model, feeds, 0.0)
    big = [
        ("x", _u8(rng, 1, 64, 4, 4)),
        ("w", np.full((2, 64, 3, 3), 255, np.uint8)),
        ("xz", _z(0)),
        ("wz", _z(0)),
    ]
    model, _ = _contrib("ConvInteger", big, consts=("w", "xz", "wz"), domain="")
    with pytest.raises(ConversionError, match=r"node 'n0' \(ConvInteger\).*2\^24.*no int32 Conv"):
        load_onnx(model)


@pytest.mark.parametrize("kind", ["mixed", "positive", "negative", "zeros"])
def test_dynamic_quantize_linear_bit_exact(kind: str) -> None:
    r = np.random.default_rng(12).normal(0, 3, (4, 33)).astype(np.float32)
    cases: dict[str, np.ndarray] = {
        "mixed": r,
        "positive": np.abs(r) + 0.5,
        "negative": -np.abs(r),
        "zeros": np.zeros_like(r),
    }
    x = cases[kind]
    model, feeds = _contrib("DynamicQuantizeLinear", [("x", x)], outputs=3, domain="")
    _check(model, feeds, 0.0)


# ------------------------------------------------------------------ transformer contrib ops
def test_transformer_optimizer_bert(tmp_path: Path) -> None:
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    src, dst = tmp_path / "bert.onnx", tmp_path / "bert_opt.onnx"
    onnx.save(bert_model(), src)
    options = FusionOptions("bert")
    options.enable_shape_inference = False  # symbolic shape inference needs sympy
    opt = optimizer.optimize_model(
        str(src),
        model_type="bert",
        num_heads=BERT_HEADS,
        hidden_size=BERT_HIDDEN,
        optimization_options=options,
        opt_level=0,
        use_gpu=False,
    )
    opt.save_model_to_file(str(dst))  # adds the com.microsoft opset import
    model = onnx.load(dst)
    fused = {n.op_type for n in model.graph.node if n.domain == MS}
    assert fused == {"Attention", "SkipLayerNormalization", "BiasGelu", "FastGelu"}
    assert not {n.domain for n in load_onnx(model).ops()} - {""}
    x = np.random.default_rng(13).normal(0, 1, (2, 5, BERT_HIDDEN)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64)
    _check(model, {"x": x, "attention_mask": mask}, FLOAT_ATOL)


def _attention_inputs(rng: np.random.Generator, mask: np.ndarray | None, sizes: tuple[int, int, int]) -> list:
    return [
        ("x", rng.normal(0, 1, (2, 4, 6)).astype(np.float32)),
        ("w", rng.normal(0, 0.5, (6, sum(sizes))).astype(np.float32)),
        ("bias", rng.normal(0, 0.1, sum(sizes)).astype(np.float32)),
        ("mask", mask),
    ]


@pytest.mark.parametrize("mask", ["none", "1d", "2d", "3d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks(mask: str, unidirectional: int) -> None:
    rng = np.random.default_rng(14)
    m = {
        "none": None,
        "1d": np.array([4, 2], np.int32),
        "2d": np.array([[1, 1, 0, 1], [1, 1, 1, 0]], np.int32),
        "3d": rng.integers(0, 2, (2, 4, 4)).astype(np.int32),
    }[mask]
    if m is not None and m.ndim == 3:
        m[:, :, 0] = 1  # every query sees a key
    model, feeds = _contrib(
        "Attention",
        _attention_inputs(rng, m, (6, 6, 6)),
        {"num_heads": 2, "unidirectional": unidirectional},
        consts=("w", "bias"),
    )
    _check(model, feeds, FLOAT_ATOL)


def test_attention_qkv_sizes_scale_and_bias() -> None:
    rng = np.random.default_rng(15)
    ins = _attention_inputs(rng, None, (4, 4, 8)) + [
        ("past", None),
        ("ab", rng.normal(0, 1, (1, 2, 4, 4)).astype(np.float32)),
    ]
    attrs = {"num_heads": 2, "qkv_hidden_sizes": [4, 4, 8], "scale": 0.3}
    model, feeds = _contrib("Attention", ins, attrs, consts=("w", "bias"))
    _check(model, feeds, FLOAT_ATOL)


def test_skip_layer_norm_outputs_and_gelus() -> None:
    rng = np.random.default_rng(16)
    x, skip = rng.normal(0, 1, (2, 3, 8)).astype(np.float32), rng.normal(0, 1, (2, 3, 8)).astype(np.float32)
    g, b, bias = (rng.normal(0, 1, 8).astype(np.float32) for _ in range(3))
    model, feeds = _contrib(
        "SkipLayerNormalization",
        [("x", x), ("skip", skip), ("g", g), ("b", b), ("bias", bias)],
        {"epsilon": 1e-5},
        consts=("g", "b", "bias"),
        outputs=4,
    )
    _check(model, feeds, FLOAT_ATOL)  # y, mean, 1/sigma, x + skip + bias
    model, feeds = _contrib(
        "SkipLayerNormalization", [("x", x), ("skip", skip), ("g", g)], consts=("g",), outputs=4
    )
    model.graph.node[0].output[1] = model.graph.node[0].output[2] = ""  # no statistics wanted
    del model.graph.output[1:3]
    _check(model, feeds, FLOAT_ATOL)
    for op, ins in (
        ("Gelu", [("x", x)]),
        ("FastGelu", [("x", x)]),
        ("FastGelu", [("x", x), ("b", b)]),
        ("BiasGelu", [("x", x), ("b", b)]),
    ):
        model, feeds = _contrib(op, ins)
        _check(model, feeds, FLOAT_ATOL)


# ------------------------------------------------------------------ refusals
def test_unknown_contrib_op_is_one_refusal_naming_op_domain_and_node() -> None:
    x = np.zeros((2, 8), np.float32)
    model, _ = _contrib("BiasSplitGelu", [("x", x)])
    with pytest.raises(UnsupportedOpsError, match=r"com\.microsoft::BiasSplitGelu \(nodes 'n0'\)") as err:
        load_onnx(model)
    assert err.value.ops == {f"{MS}::BiasSplitGelu": ["n0"]}


def test_attention_refusals_name_the_node() -> None:
    rng = np.random.default_rng(17)
    ins = _attention_inputs(rng, np.array([4, 2, 0, 0], np.int32), (6, 6, 6))
    model, _ = _contrib("Attention", ins, {"num_heads": 2}, consts=("w", "bias"))
    with pytest.raises(ConversionError, match=r"node 'n0' \(Attention\).*mask_index of shape \(4,\)"):
        load_onnx(model)
    ins = _attention_inputs(rng, None, (6, 6, 6)) + [("past", np.zeros((2, 2, 2, 1, 3), np.float32))]
    model, _ = _contrib("Attention", ins, {"num_heads": 2}, consts=("w", "bias"))
    with pytest.raises(ConversionError, match=r"node 'n0' \(Attention\): past state"):
        load_onnx(model)
