"""Transformer forms in MNN files (issue 18), each checked in MNN 3.6.1's runtime against onnxruntime:

* a decomposed RMSNorm (T5: Pow, ReduceMean, Add, Sqrt, Div, Mul, Mul) is one LayerNorm with
  ``useRMSNorm`` (fuse-rms-norm in the MNN legalization); a mean over a leading axis stays decomposed;
* Pow by 2 or 3 is written as multiplications (no POW BinaryOp); Pow by 2.5 keeps POW;
* a ReLU between two fully connected layers runs on the first one's packed output and becomes its
  conv's ``relu`` flag (no ReLU op, no layout copy between the layers); not where that output is
  also a graph output;
* the tanh GELU (x + 0.044715 x^3, its tanh, the products) stays on the packed rows of the fully
  connected layer it follows: no layout copy until the next layer's output;
* x * 1, x / 1, x + 0 and x - 0 write no op (not where the constant broadcasts x to more dims);
* the net peephole takes ReLU6{0, 6} into the conv and leaves a Clip(0, 1).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import flatbuffers
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from backends.mnn.backend import BACKEND
from backends.mnn.lower.fuse_conv_act import fuse_conv_activation
from backends.mnn.model import MnnNet, MnnOp, Table
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.metrics import agreement
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from schemas.mnn.generated import MNN_generated as M
from tests.helpers.mnn_convert import mnn_op_types

MAX_REL = 1e-5  # max|mnn - ort| / max|ort| (Kiln's fp32 rule is 1e-4)
_RNG = np.random.default_rng(181)
_X = _RNG.standard_normal((1, 12, 16)).astype(np.float32)


def _r(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (_RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes: list[onnx.NodeProto], outs: list[str], inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", T.FLOAT, list(_X.shape))],
        [oh.make_tensor_value_info(o, T.FLOAT, None) for o in outs],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _run(model: onnx.ModelProto, tmp_path: Path) -> tuple[Counter[str], Path]:
    """Kiln's fp32 .mnn (default pipeline + MNN legalization): its op types; MNN checked against ORT."""
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    graph = load_model(src)
    PassManager(pipeline("default")).run(graph)
    PassManager(BACKEND.legalization("mnn", None)).run(graph)
    mnn = write_mnn(graph, tmp_path / "m.mnn", MnnOptions())[-1]
    got, ref = run_mnn(mnn, {"x": _X}), run_onnxruntime(src, {"x": _X})
    for name, want in ref.items():
        m = agreement(got[name].reshape(want.shape), want)
        assert m.max_rel <= MAX_REL, f"{name}: max_rel {m.max_rel:.3g}"
    return Counter(mnn_op_types(mnn)), mnn


def _params(path: Path, table: type, main_type: int) -> list[object]:
    net = M.Net.GetRootAs(path.read_bytes(), 0)
    out = []
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.MainType() == main_type:
            p = table()
            p.Init(op.Main().Bytes, op.Main().Pos)
            out.append(p)
    return out


# ------------------------------------------------------------------------- RMSNorm
def _rms_norm(axes: list[int]) -> onnx.ModelProto:
    nodes = [
        oh.make_node("Pow", ["x", "two"], ["sq"]),
        oh.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        oh.make_node("Add", ["ms", "eps"], ["v"]),
        oh.make_node("Sqrt", ["v"], ["r"]),
        oh.make_node("Div", ["one", "r"], ["inv"]),
        oh.make_node("Mul", ["x", "inv"], ["n"]),
        oh.make_node("Mul", ["w", "n"], ["y"]),
    ]
    inits: dict[str, np.ndarray] = {
        "two": np.array(2.0, np.float32),
        "axes": np.array(axes, np.int64),
        "eps": np.array(1e-6, np.float32),
        "one": np.array(1.0, np.float32),
        "w": _r(16, scale=0.5) + 1.0,
    }
    return _model(nodes, ["y"], inits)


def test_rms_norm_is_one_layer_norm(tmp_path: Path) -> None:
    types, mnn = _run(_rms_norm([-1]), tmp_path)
    assert types["LayerNorm"] == 1 and "BinaryOp" not in types and "Reduction" not in types, types
    (ln,) = _params(mnn, M.LayerNorm, M.OpParameter.LayerNorm)
    assert ln.GammaLength() == 16  # type: ignore[attr-defined]
    # useRMSNorm: slot 6 of LayerNorm (the generated reader predates the field)
    tab = ln._tab  # type: ignore[attr-defined]
    at = tab.Offset(4 + 2 * 6)
    assert at and tab.Get(flatbuffers.number_types.BoolFlags, at + tab.Pos)


def test_rms_norm_over_a_leading_axis_stays_decomposed(tmp_path: Path) -> None:
    types, _ = _run(_rms_norm([1]), tmp_path)
    assert "LayerNorm" not in types and types["Reduction"] == 1, types


# ----------------------------------------------------------------------------- Pow
@pytest.mark.parametrize(("power", "muls"), [(2.0, 1), (3.0, 2), (2.5, 0)])
def test_small_integer_powers_are_products(tmp_path: Path, power: float, muls: int) -> None:
    nodes = [oh.make_node("Abs", ["x"], ["a"]), oh.make_node("Pow", ["a", "p"], ["y"])]
    _, mnn = _run(_model(nodes, ["y"], {"p": np.array(power, np.float32)}), tmp_path)
    kinds = [p.OpType() for p in _params(mnn, M.BinaryOp, M.OpParameter.BinaryOp)]  # type: ignore[attr-defined]
    assert kinds.count(M.BinaryOpOperation.MUL) == muls
    assert kinds.count(M.BinaryOpOperation.POW) == (1 if muls == 0 else 0)


# --------------------------------------------------------------- FC -> ReLU -> FC
def _ffn(act: str, extra_out: bool = False) -> onnx.ModelProto:
    nodes = [oh.make_node("MatMul", ["x", "w1"], ["mm"]), oh.make_node("Add", ["mm", "b1"], ["h"])]
    if act == "relu":
        nodes.append(oh.make_node("Relu", ["h"], ["g"]))
    else:  # the tanh GELU: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        nodes += [
            oh.make_node("Pow", ["h", "three"], ["h3"]),
            oh.make_node("Mul", ["h3", "k"], ["kh3"]),
            oh.make_node("Add", ["h", "kh3"], ["inner"]),
            oh.make_node("Mul", ["inner", "c"], ["v"]),
            oh.make_node("Tanh", ["v"], ["t"]),
            oh.make_node("Add", ["t", "one"], ["p"]),
            oh.make_node("Mul", ["h", "half"], ["hh"]),
            oh.make_node("Mul", ["hh", "p"], ["g"]),
        ]
    nodes.append(oh.make_node("MatMul", ["g", "w2"], ["y"]))
    inits = {"w1": _r(16, 40, scale=0.4), "b1": _r(40, scale=0.5), "w2": _r(40, 8, scale=0.3)}
    inits |= {
        "three": np.array(3.0, np.float32),
        "k": np.array(0.044715, np.float32),
        "c": np.array(np.sqrt(2 / np.pi), np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    return _model(nodes, ["y", *(["h"] if extra_out else [])], inits)


def _conv_relu_flags(path: Path) -> list[bool]:
    return [p.Common().Relu() for p in _params(path, M.Convolution2D, M.OpParameter.Convolution2D)]  # type: ignore[attr-defined]


def test_relu_between_fully_connected_layers_is_the_conv_flag(tmp_path: Path) -> None:
    types, mnn = _run(_ffn("relu"), tmp_path)
    assert "ReLU" not in types and types["Convolution"] == 2
    assert types["ConvertTensor"] == 2, types  # x packed once, y back to NCHW: none between the layers
    assert _conv_relu_flags(mnn) == [True, False]


def test_relu_fusion_must_not_fire_when_the_conv_output_is_read_elsewhere(tmp_path: Path) -> None:
    types, mnn = _run(_ffn("relu", extra_out=True), tmp_path)
    assert types["ReLU"] == 1 and _conv_relu_flags(mnn) == [False, False], types


def test_tanh_gelu_stays_on_packed_rows(tmp_path: Path) -> None:
    types, mnn = _run(_ffn("gelu"), tmp_path)
    assert types["ConvertTensor"] == 2, types
    kinds = [p.OpType() for p in _params(mnn, M.BinaryOp, M.OpParameter.BinaryOp)]  # type: ignore[attr-defined]
    assert M.BinaryOpOperation.POW not in kinds


# ---------------------------------------------------------------- x * 1, x + 0
@pytest.mark.parametrize(
    ("op", "k", "shape", "kept"),
    [
        ("Mul", 1.0, [], 0),
        ("Div", 1.0, [], 0),
        ("Add", 0.0, [], 0),
        ("Sub", 0.0, [], 0),
        ("Mul", 1.0, [1, 1, 1, 1], 1),  # broadcasts x to 4-D: a real op
        ("Mul", 1.5, [], 1),
    ],
)
def test_neutral_scalar_writes_no_op(tmp_path: Path, op: str, k: float, shape: list[int], kept: int) -> None:
    nodes = [oh.make_node("Abs", ["x"], ["a"]), oh.make_node(op, ["a", "k"], ["y"])]
    types, _ = _run(_model(nodes, ["y"], {"k": np.full(shape, k, np.float32)}), tmp_path)
    assert types["BinaryOp"] == kept, types


def test_fuse_conv_activation_takes_relu6_and_leaves_other_clips() -> None:
    common = Table("Convolution2DCommon", {"outputCount": 4, "inputCount": 4})
    conv = Table("Convolution2D", {"common": common})

    def net(lo: float, hi: float) -> MnnNet:
        clip = Table("Relu6", {"minValue": lo, "maxValue": hi})
        return MnnNet(
            ops=[
                MnnOp("Input", "x", [], [0]),
                MnnOp("Convolution", "c", [0], [1], conv),
                MnnOp("ReLU6", "r", [1], [2], clip),
            ],
            tensor_names=["x", "c", "y"],
            output_names=["y"],
        )

    six = net(0.0, 6.0)
    assert fuse_conv_activation(six) == 1
    assert [op.type for op in six.ops] == ["Input", "Convolution"] and six.ops[1].outputs == [2]
    fused = six.ops[1].param
    assert fused is not None and fused.get("common").get("relu6") is True
    one = net(0.0, 1.0)
    assert fuse_conv_activation(one) == 0 and len(one.ops) == 3


def test_a_weight_tied_across_layers_is_stored_once(tmp_path: Path) -> None:
    """Two MatMuls and a Gemm reading one [16, 16] weight (tied layers; normalize-gemm's copies merge
    again in deduplicate-constants): one Const of 256 values and three MatMuls, no Convolution
    holding it; an untied layer keeps the conv form (must-not-fire). Against ORT within 1e-5."""
    w, u = _r(16, 16, scale=0.25), _r(16, 16, scale=0.25)
    model = _model(
        [
            oh.make_node("MatMul", ["x", "w"], ["a"]),
            oh.make_node("MatMul", ["a", "w"], ["b"]),
            oh.make_node("Gemm", ["b2", "w", "bias"], ["c"]),
            oh.make_node("Reshape", ["b", "flat"], ["b2"]),
            oh.make_node("MatMul", ["x", "u"], ["d"]),
        ],
        ["c", "d"],
        {"w": w, "u": u, "bias": _r(16), "flat": np.array([12, 16], np.int64)},
    )
    types, mnn = _run(model, tmp_path)
    assert types["MatMul"] == 3 and types["Convolution"] == 1
    sizes = [blob.Float32sLength() for blob in _params(mnn, M.Blob, M.OpParameter.Blob)]  # type: ignore[attr-defined]
    assert sizes.count(256) == 1
