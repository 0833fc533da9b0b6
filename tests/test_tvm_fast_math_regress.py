"""Regression: a requantized fast-math GELU crashed TVM's vectorizer ("Let cannot bind the same var
to two different values", issue 17) because ``nearbyint`` was not marked vectorizable
(backends.tvm.vector_intrinsics).

Tolerances: the TE kernel is exact against numpy (every value lands on a uint8 grid, and fast_erf,
within 2e-7 of erf, moves no rounding tie for these inputs); the compiled ONNX graph is within 1e-6
absolute of onnxruntime (outputs up to 6.35; measured 1.2e-7, one float32 ulp). The int8 BERT
compile must pass Kiln's own verification (its int8 tolerance against onnxruntime and float64).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from backends.tvm.kernels import fast_math
from backends.tvm.target import resolve_target
from backends.tvm.vector_intrinsics import LANEWISE_INTRINSICS, mark_vectorizable
from compiler.cli import main
from compiler.runners import run_onnxruntime
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

_S, _Z = 0.05, 128
_ERF = np.vectorize(math.erf, otypes=[np.float64])


def kiln(*args: str | Path) -> int:
    return main([str(a) for a in args])


def _q_np(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x / np.float32(_S)) + _Z, 0, 255).astype(np.float32)


def _q_tir(x: Any) -> Any:
    """``f32(u8(clamp(nearbyint(x / s) + z, 0, 255)))``, as the Q/DQ lowering writes it."""
    from tvm import tirx

    def c(v: float) -> Any:
        return tirx.const(v, "float32")

    v = tirx.nearbyint(x / c(_S)) + c(_Z)
    return tirx.Cast("float32", tirx.Cast("uint8", tirx.min(tirx.max(v, c(0.0)), c(255.0))))


def test_requantized_fast_erf_times_requantized_input_vectorizes() -> None:
    """``q(fast_erf(q(a))) * q(a)`` vectorized by 16 compiles, widens ``nearbyint`` and is exact."""
    import tvm
    from tvm import s_tir, te

    mark_vectorizable()
    mark_vectorizable()  # idempotent
    assert all(tvm.ir.Op.get(n).get_attr("TVectorizable") for n in LANEWISE_INTRINSICS)
    assert tvm.ir.Op.get("tirx.isnan").get_attr("TVectorizable") is None  # only the listed ops
    n = 1024
    a = te.placeholder((n,), "float32", name="a")
    y = te.compute((n,), lambda i: _q_tir(fast_math.fast_erf(_q_tir(a[i]))) * _q_tir(a[i]), name="y")
    sch = s_tir.Schedule(te.create_prim_func([a, y]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(sch.split(loop, [None, 16])[1])
    lib = tvm.compile(sch.mod, target=resolve_target("cpu").tvm_target())
    assert "llvm.nearbyint.v16f32" in lib.mod.inspect_source("ll")  # widened, not scalarized
    x = (np.random.default_rng(3).standard_normal(n) * 4).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(n, np.float32))
    lib(tvm.runtime.tensor(x), out)
    qa = _q_np(x)
    expected = _q_np(_ERF(qa).astype(np.float32)) * qa
    np.testing.assert_array_equal(out.numpy(), expected)


def _qdq(x: str, name: str, nodes: list[onnx.NodeProto]) -> str:
    nodes.append(helper.make_node("QuantizeLinear", [x, "s", "z"], [f"{name}_q"]))
    nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", "s", "z"], [f"{name}_dq"]))
    return f"{name}_dq"


def _qdq_gelu() -> onnx.ModelProto:
    """``y = 0.5 * qdq(x) * (1 + qdq(erf(qdq(x) / sqrt 2)))``: an int8 transformer's GELU."""
    nodes: list[onnx.NodeProto] = []
    xd = _qdq("x", "x", nodes)
    nodes.append(helper.make_node("Div", [xd, "sqrt2"], ["t"]))
    nodes.append(helper.make_node("Erf", ["t"], ["e"]))
    ed = _qdq("e", "e", nodes)
    nodes.append(helper.make_node("Add", [ed, "one"], ["a"]))
    nodes.append(helper.make_node("Mul", [xd, "a"], ["m"]))
    nodes.append(helper.make_node("Mul", ["m", "half"], ["y"]))
    consts: dict[str, np.ndarray] = {
        "s": np.array(_S, np.float32),
        "z": np.array(_Z, np.uint8),
        "sqrt2": np.array(math.sqrt(2.0), np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    graph = helper.make_graph(
        nodes,
        "qdq_gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 96])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_qdq_gelu_compiles_for_cpu_and_matches_onnxruntime(tmp_path: Path) -> None:
    model = tmp_path / "gelu.onnx"
    onnx.save(_qdq_gelu(), model)
    x = (np.random.default_rng(5).standard_normal((1, 64, 96)) * 2).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    out = tmp_path / "out"
    feeds = tmp_path / "x.npz"
    assert kiln("compile", model, "--target", "cpu", "-o", out, "--inputs", feeds) == 0
    assert kiln("run", out / "cpu" / "model.so", "--inputs", feeds, "-o", tmp_path / "y.npz") == 0
    got = np.load(tmp_path / "y.npz")["y"]
    ref = run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


def test_bert_int8_compiles_for_cpu_and_verifies(
    zoo: ZooCache,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """The zoo's int8 BERT (default options, sensitivity on) exited 3 from the vectorizer."""
    m = zoo.get("bert")
    out = tmp_path / "out"
    args = ("--quantize", "int8", "--calib", m.calib, "--inputs", m.inputs, "--target", "cpu")
    assert kiln("compile", m.model, "-o", out, *args) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["verification"]["passed"]
    assert [a["kind"] for a in man["artifacts"]] == ["tvm"]
