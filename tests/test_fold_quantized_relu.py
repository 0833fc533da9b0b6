"""fold-quantized-relu: Q(Relu(dq(q; s, z)); s, z) = max(q, z) (= q for z at the type's minimum).

Structure after the pass (op counts), must-not-fire cases (another scale, another zero point,
per-channel scales, a 16-bit grid), and the integer outputs exactly equal to onnxruntime running
the QDQ model as written (every uint8 and int8 level is fed), on the pass alone and through the
TVM CPU artifact of a residual block's int8 tail.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from compiler.pipelines import tvm_legalization
from frontends.onnx.loader import load_onnx
from tests.helpers.pass_check import op_counts, ort, ort_graph, run_passes

_TYPES: dict[type, int] = {np.uint8: T.UINT8, np.int8: T.INT8, np.int16: T.INT16}


def _model(
    dtype: type = np.uint8,
    z: int = 0,
    s: float = 0.05,
    s2: float | None = None,
    z2: int | None = None,
    channels: bool = False,
    relu_read: bool = False,
) -> onnx.ModelProto:
    """a, b -> Q(dq(a) + dq(b)) -> dq -> Relu -> Q (the Add's output grid twice, unless s2/z2)."""
    tt = _TYPES[dtype]
    inits = [
        nh.from_array(np.array(s, np.float32), "s"),
        nh.from_array(np.array(z, dtype), "z"),
        nh.from_array(np.array(s if s2 is None else s2, np.float32), "s2"),
        nh.from_array(np.array(z if z2 is None else z2, dtype), "z2"),
        nh.from_array(np.array(0.03, np.float32), "sa"),
    ]
    out_scale = "s2"
    if channels:
        inits.append(nh.from_array(np.full(4, s, np.float32), "sc"))
        inits.append(nh.from_array(np.full(4, z, dtype), "zc"))
    nodes = [
        h.make_node("DequantizeLinear", ["a", "sa", "z"], ["fa"]),
        h.make_node("DequantizeLinear", ["b", "sa", "z"], ["fb"]),
        h.make_node("Add", ["fa", "fb"], ["sum"]),
        h.make_node("QuantizeLinear", ["sum", "s", "z"], ["qsum"]),
        h.make_node(
            "DequantizeLinear",
            ["qsum", "sc" if channels else "s", "zc" if channels else "z"],
            ["dsum"],
            axis=1,
        ),
        h.make_node("Relu", ["dsum"], ["r"]),
        h.make_node("QuantizeLinear", ["r", out_scale, "z2"], ["y"]),
    ]
    outs = [h.make_tensor_value_info("y", tt, [1, 4, 16, 16])]
    if relu_read:
        outs.append(h.make_tensor_value_info("r", T.FLOAT, [1, 4, 16, 16]))
    graph = h.make_graph(
        nodes,
        "qrelu",
        [h.make_tensor_value_info(n, tt, [1, 4, 16, 16]) for n in ("a", "b")],
        outs,
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])


def _feeds(dtype: type) -> dict[str, np.ndarray]:
    info = np.iinfo(dtype)
    levels = np.arange(1024) % (int(info.max) - int(info.min) + 1) + int(info.min)  # every level
    a: np.ndarray = levels.astype(dtype).reshape(1, 4, 16, 16)
    return {"a": a, "b": np.flip(a).copy()}


@pytest.mark.parametrize(
    ("dtype", "z", "want"),
    [(np.uint8, 0, {}), (np.uint8, 37, {"Max": 1}), (np.int8, -128, {}), (np.int8, -5, {"Max": 1})],
)
def test_folds_and_matches_onnxruntime_exactly(dtype: type, z: int, want: dict[str, int]) -> None:
    model = _model(dtype, z)
    graph = load_onnx(model)
    run_passes(graph, ["fold-quantized-relu"])
    counts = op_counts(graph)
    assert counts["Relu"] == 0 and counts["QuantizeLinear"] == 1 and counts["DequantizeLinear"] == 2
    assert counts.get("Max", 0) == want.get("Max", 0)
    feeds = _feeds(dtype)
    np.testing.assert_array_equal(ort_graph(graph, feeds)["y"], ort(model, feeds)["y"])


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"s2": 0.06}, "scales differ"),
        ({"z2": 3}, "zero points differ"),
        ({"channels": True}, "per-channel"),
        ({"dtype": np.int16}, "not 8-bit"),
    ],
)
def test_must_not_fire(kwargs: dict[str, object], why: str) -> None:
    from compiler.pass_infra import PassContext

    graph = load_onnx(_model(**kwargs))  # type: ignore[arg-type]
    ctx = PassContext(verify_each=True)
    run_passes(graph, ["fold-quantized-relu"], ctx)
    assert op_counts(graph)["Relu"] == 1
    assert any(why in m.reason for m in ctx.near_misses), ctx.near_misses


def test_a_relu_read_in_float_stays_for_that_reader() -> None:
    model = _model(np.uint8, 37, relu_read=True)
    graph = load_onnx(model)
    run_passes(graph, ["fold-quantized-relu"])
    assert op_counts(graph)["Relu"] == 1 and op_counts(graph)["Max"] == 1
    feeds = _feeds(np.uint8)
    got, want = ort_graph(graph, feeds), ort(model, feeds)
    np.testing.assert_array_equal(got["y"], want["y"])
    np.testing.assert_array_equal(got["r"], want["r"])


def test_tvm_cpu_runs_the_folded_tail_exactly(tmp_path: object) -> None:
    """In TVM's legalization, the residual tail keeps one quantizer; the artifact equals ORT."""
    import tvm
    from tvm import relax

    from backends.tvm.build import compile_module
    from backends.tvm.emit import prepare_graph
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target

    assert "fold-quantized-relu" in tvm_legalization("cpu", 16)
    spec = resolve_target("cpu")
    for z in (0, 37):
        model = _model(np.uint8, z)
        legal = prepare_graph(load_onnx(model), spec)[0]
        assert op_counts(legal)["Relu"] == 0
        vm = relax.VirtualMachine(compile_module(lower_graph(legal, spec).mod, spec), tvm.cpu())
        feeds = _feeds(np.uint8)
        got = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in legal.inputs]).numpy()
        np.testing.assert_array_equal(got, ort(model, feeds)["y"])
