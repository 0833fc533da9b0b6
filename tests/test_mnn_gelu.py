"""The erf GELU in MNN files: mnn-fuse-gelu finds x/2 (1 + erf(x/sqrt(2))), the MNN writer computes
it as x * sigmoid(x * h(x^2)) on the fully connected layer's packed output, checked in MNN 3.6.1's
runtime against onnxruntime (the original graph), with the must-not-fire cases."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from backends.mnn.backend import BACKEND
from backends.mnn.fuse_gelu import MnnFuseGelu
from backends.mnn.lower.gelu import gelu_partial_fractions
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.ir.graph import Graph
from compiler.metrics import agreement
from compiler.pass_infra import PassContext
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from schemas.mnn.generated import MNN_generated as M
from schemas.mnn.schema import fb
from tests.helpers.mnn_convert import mnn_op_types

MAX_REL = 1e-5  # max|mnn - ort| / max(1, max|ort|), Kiln's fp32 rule is 1e-4
_RNG = np.random.default_rng(18)
_X = (_RNG.standard_normal((1, 16, 32)) * 2).astype(np.float32)
_W1 = (_RNG.standard_normal((32, 64)) * 0.4).astype(np.float32)
_B1 = (_RNG.standard_normal(64) * 0.5).astype(np.float32)
_W2 = (_RNG.standard_normal((64, 24)) * 0.2).astype(np.float32)


def _inits(half: float = 0.5, c: float = math.sqrt(2.0)) -> list[onnx.TensorProto]:
    arrays = {"w1": _W1, "b1": _B1, "w2": _W2, "w3": _W1[:, :24].copy()}
    scalars = {"c": c, "rc": 1.0 / c, "one": 1.0, "half": half}
    return [onnx.numpy_helper.from_array(a, k) for k, a in arrays.items()] + [
        onnx.numpy_helper.from_array(np.array(v, np.float32), k) for k, v in scalars.items()
    ]


def _mlp(shape: str = "xp-half", arg: str = "div", half: float = 0.5, extra_out: str = "") -> onnx.ModelProto:
    """y = (GELU(x W1 + b1)) W2 and z = x W3 (x read by two fully connected layers)."""
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["mm"]),
        oh.make_node("Add", ["mm", "b1"], ["h"]),
        oh.make_node("Div", ["h", "c"], ["a"]) if arg == "div" else oh.make_node("Mul", ["rc", "h"], ["a"]),
        oh.make_node("Erf", ["a"], ["e"]),
        oh.make_node("Add", ["one", "e"], ["p"]),
    ]
    if shape == "xp-half":
        nodes += [oh.make_node("Mul", ["h", "p"], ["m"]), oh.make_node("Mul", ["m", "half"], ["g"])]
    elif shape == "xhalf-p":
        nodes += [oh.make_node("Mul", ["half", "h"], ["m"]), oh.make_node("Mul", ["p", "m"], ["g"])]
    elif shape == "xp":  # the 1/2 folded into the next layer
        nodes += [oh.make_node("Mul", ["h", "p"], ["g"])]
    else:
        nodes += [oh.make_node("Mul", ["p", "half"], ["m"]), oh.make_node("Mul", ["h", "m"], ["g"])]
    nodes += [oh.make_node("MatMul", ["g", "w2"], ["y"]), oh.make_node("MatMul", ["x", "w3"], ["z"])]
    outs = ["y", "z", *([extra_out] if extra_out else [])]
    graph = oh.make_graph(
        nodes,
        "mlp",
        [oh.make_tensor_value_info("x", T.FLOAT, list(_X.shape))],
        [oh.make_tensor_value_info(o, T.FLOAT, None) for o in outs],
        _inits(half),
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _legalized(model: onnx.ModelProto, tmp_path: Path) -> tuple[Graph, Path]:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    PassManager(pipeline("default")).run(graph)
    PassManager(BACKEND.legalization("mnn", None)).run(graph)
    return graph, path


def _unary_kinds(path: Path) -> list[int]:
    net = M.Net.GetRootAs(path.read_bytes(), 0)
    kinds = []
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.MainType() == M.OpParameter.UnaryOp:
            u = M.UnaryOp()
            main = op.Main()
            u.Init(main.Bytes, main.Pos)
            kinds.append(u.OpType())
    return kinds


def _run(model: onnx.ModelProto, tmp_path: Path) -> tuple[Graph, Path, float]:
    graph, path = _legalized(model, tmp_path)
    mnn = write_mnn(graph, tmp_path / "m.mnn", MnnOptions())[-1]
    got, ref = run_mnn(mnn, {"x": _X}), run_onnxruntime(path, {"x": _X})
    worst = max(agreement(got[k].reshape(ref[k].shape), ref[k]).max_rel for k in ref)
    return graph, mnn, worst


@pytest.mark.parametrize(
    ("shape", "arg"),
    [("xp-half", "div"), ("xhalf-p", "mul"), ("x-phalf", "div"), ("x-phalf", "mul"), ("xp", "div")],
)
def test_erf_gelu_fuses_and_runs_packed(tmp_path: Path, shape: str, arg: str) -> None:
    graph, mnn, worst = _run(_mlp(shape, arg), tmp_path)
    ops = [n.op for n in graph.ops()]
    assert ops.count("Gelu") == 1 and "Erf" not in ops
    assert ops.count("Mul") == 0  # x * p = Gelu(x) * 2, the 2 folded into W2
    assert _unary_kinds(mnn) == [fb.UnaryOpOperation.SIGMOID]
    types = mnn_op_types(mnn)
    # x is packed once for both of its fully connected layers; the Gelu runs on the first one's
    # packed output and the second reads it directly: the only copies are x's and the outputs'
    assert types.count("Convolution") == 3
    assert types.count("ConvertTensor") == 3
    assert worst <= MAX_REL


def test_erf_gelu_must_not_fire_on_another_constant(tmp_path: Path) -> None:
    """x * 0.6 * (1 + erf(x/sqrt(2))) is no Gelu: the Erf stays."""
    graph, mnn, worst = _run(_mlp(half=0.6), tmp_path)
    assert "Gelu" not in [n.op for n in graph.ops()]
    assert fb.UnaryOpOperation.ERF in _unary_kinds(mnn)
    assert worst <= MAX_REL


def test_erf_gelu_must_not_fire_when_an_interior_value_is_used(tmp_path: Path) -> None:
    graph, mnn, worst = _run(_mlp(extra_out="e"), tmp_path)
    assert "Gelu" not in [n.op for n in graph.ops()]
    assert fb.UnaryOpOperation.ERF in _unary_kinds(mnn)
    assert worst <= MAX_REL


def test_fuse_gelu_near_miss_names_the_constant(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_mlp(half=0.6), path)
    graph = load_model(path)
    ctx = PassContext()
    assert not MnnFuseGelu().run(graph, ctx).changed
    assert any("half is 0.6" in m.reason for m in ctx.near_misses)


def test_gelu_rational_is_exact_to_float32_rounding() -> None:
    """h(s) = C + A/(s + d1) + B/(s + d2) in float32: |x sigmoid(x h) - Gelu(x)| <= 1.7e-6 on [-20, 20]."""
    from scipy.special import erf

    c, a, b = (np.float32(v) for v in gelu_partial_fractions())
    d1, d2 = (np.float32(v) for v in (58.19091200492282, 6.623629960572501))
    x = np.linspace(-20, 20, 400001, dtype=np.float32)
    s = x * x
    u = x * ((a / (s + d1) + b / (s + d2)) + c)
    y = x * (1 / (1 + np.exp(-u.astype(np.float64)))).astype(np.float32)
    exact = 0.5 * x.astype(np.float64) * (1 + erf(x.astype(np.float64) / math.sqrt(2)))
    assert np.abs(y - exact).max() <= 1.7e-6


def test_gelu_times_two_keeps_its_mul_when_the_product_is_read_elsewhere(tmp_path: Path) -> None:
    """x * (1 + erf(x / sqrt(2))) also a graph output: the 2 cannot go into W2, Gelu(x) * 2 stays."""
    graph, mnn, worst = _run(_mlp("xp", extra_out="g"), tmp_path)
    ops = [n.op for n in graph.ops()]
    assert ops.count("Gelu") == 1 and ops.count("Mul") == 1
    assert worst <= MAX_REL
