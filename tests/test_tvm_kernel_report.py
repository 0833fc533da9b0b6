""" "Which kernel ran": the kernel report in the manifest, model.json and ``kiln bench --json``.

A small model with one op of each class (conv, depthwise, grouped conv, pooling, dense, matmul,
batched matmul, softmax, elementwise) is compiled for the host; the report must say, per op class,
the schedules used and their ISA path. Structure only, never timing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.tvm.kernel_report import OP_CLASSES, kernel_report
from backends.tvm.kernels.kernel import ISA_PATHS, mark_scheduled, simd_isa
from backends.tvm.target import resolve_target
from compiler.bench import bench_artifact
from compiler.driver import compile_model
from compiler.options import CompileOptions

R = np.random.default_rng(5)


def _w(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((R.standard_normal(shape) * 0.3).astype(np.float32), name)


def small_model() -> onnx.ModelProto:
    """x [1, 8, 16, 16] -> conv, max pool, depthwise, grouped conv, GAP, Gemm -> y [1, 10];
    t [1, 4, 12, 8] -> MatMul by a weight + Erf, t @ t^T, Softmax -> a, s."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "wd"], ["c2"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("Conv", ["c2", "wg"], ["c3"], pads=[1, 1, 1, 1], group=4),
        helper.make_node("GlobalAveragePool", ["c3"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
        helper.make_node("MatMul", ["t", "wm"], ["m"]),
        helper.make_node("Erf", ["m"], ["a"]),
        helper.make_node("Transpose", ["t"], ["tt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["t", "tt"], ["qk"]),
        helper.make_node("Softmax", ["qk"], ["s"], axis=-1),
    ]
    inits = [
        _w("w1", 16, 8, 3, 3),
        _w("b1", 16),
        _w("wd", 16, 1, 3, 3),
        _w("wg", 16, 4, 3, 3),
        _w("wf", 10, 16),
        _w("bf", 10),
        _w("wm", 8, 32),
    ]
    graph = helper.make_graph(
        nodes,
        "report",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16]),
            helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4, 12, 8]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10]),
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4, 12, 32]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 4, 12, 12]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("report")
    onnx.save(small_model(), tmp / "m.onnx")
    compile_model(
        CompileOptions(model=tmp / "m.onnx", out_dir=tmp / "out", emit=(), targets=("cpu",), progress=False)
    )
    return tmp / "out", json.loads((tmp / "out" / "manifest.json").read_text())


def _check_rows(report: dict[str, Any]) -> None:
    for cls, row in report.items():
        assert cls in OP_CLASSES, cls
        assert set(row) == {"isa", "kernels", "schedules"}, row
        assert row["isa"] and set(row["isa"]) <= set(ISA_PATHS), row
        assert row["kernels"] == sum(row["schedules"].values()) >= 1, row


def test_manifest_reports_isa_per_op_class(built: tuple[Path, dict[str, Any]]) -> None:
    out, manifest = built
    (art,) = [a for a in manifest["artifacts"] if a["kind"] == "tvm"]
    report = art["details"]["kernel_report"]
    _check_rows(report)
    simd = simd_isa(resolve_target("cpu"))
    expect = {
        "conv": ([simd], "conv2d_nchwc"),
        "depthwise_conv": ([simd], "depthwise_nchwc"),
        "pooling": ([simd], "pool_nchwc"),
        "dense": ([simd], "dense"),
        "grouped_conv": ([simd], "grouped_nchwc"),
        "matmul": (["generic"], "generic:matmul"),
        "batched_matmul": (["generic"], "generic:matmul"),
        "softmax": ([simd], "row_softmax"),
    }
    for cls, (isa, rule) in expect.items():
        assert cls in report, (cls, sorted(report))
        assert report[cls]["isa"] == isa, (cls, report[cls])
        if rule is not None:
            assert rule in report[cls]["schedules"], (cls, report[cls])
    assert "elementwise" in report
    # the same report beside the library, and in kiln bench --json
    meta = json.loads((out / "cpu" / "model.json").read_text())
    assert meta["kernel_report"] == report
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    feeds["t"] = rng.standard_normal((1, 4, 12, 8)).astype(np.float32)
    bench = bench_artifact(out / "cpu" / "model.so", feeds, threads=1, rounds=1, min_batch_s=0.001)
    assert bench.as_json()["kernel_report"] == report
    assert "kernels: " in bench.summary()


@pytest.mark.parametrize(("target", "simd"), [("x86-avx2", "avx2"), ("arm", "neon")])
def test_lowering_records_the_targets_isa(target: str, simd: str) -> None:
    """The kernels' own records, lowered for another target (no compile needed)."""
    from backends.tvm.emit import prepare_graph
    from backends.tvm.lower import lower_graph
    from frontends.onnx.loader import load_onnx

    graph = load_onnx(small_model())
    spec = resolve_target(target)
    legal, _ = prepare_graph(graph, spec)
    report = kernel_report(lower_graph(legal, spec).kernels)
    _check_rows(report)
    for cls in ("conv", "depthwise_conv", "grouped_conv", "pooling", "dense"):
        assert report[cls]["isa"] == [simd], (cls, report[cls])


def test_report_folds_records_and_refuses_unknown_isa() -> None:
    rows = kernel_report(
        [
            {"kernel": "a", "rule": "qconv2d_vnni", "op_class": "conv", "isa": "vnni"},
            {"kernel": "b", "rule": "conv2d_nchwc", "op_class": "conv", "isa": "avx512"},
            {"kernel": "c", "rule": "qconv2d_vnni", "op_class": "conv", "isa": "vnni"},
        ]
    )
    assert rows == {
        "conv": {"isa": ["avx512", "vnni"], "kernels": 3, "schedules": {"conv2d_nchwc": 1, "qconv2d_vnni": 2}}
    }
    import tvm
    from tvm import te

    x = te.placeholder((4,), "float32", name="x")
    func = te.create_prim_func([x, te.compute((4,), lambda i: x[i], name="y")])
    with pytest.raises(ValueError, match="unknown ISA path"):
        mark_scheduled(func, "conv2d_nchwc", "conv", "sse9")
    assert isinstance(mark_scheduled(func, "dense", "dense", "neon"), tvm.tirx.PrimFunc)
