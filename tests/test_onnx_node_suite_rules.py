"""The frontend and exporter rules the ONNX node suite (issue 15) asked for, one small model each.

* a function op without a converter is expanded into its ONNX function body;
* floating-point Mod with ``fmod=0`` (opset 28) is C fmod plus a sign fix, exactly;
* an If with a constant condition imports only its taken branch (the other may not type-check);
* the ONNX exporter refuses an element type its schema does not allow at the export opset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from compiler.cli import main
from compiler.ir import run_graph
from compiler.onnx_export import export_onnx, model_bytes
from frontends.onnx import load_onnx
from tests.helpers.conformance import ort_session
from tests.helpers.numerics import assert_close


def _model(
    nodes: list[onnx.NodeProto], ins: list[onnx.ValueInfoProto], outs: list[onnx.ValueInfoProto], opset: int
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _both_paths(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Kiln's interpreter and its ONNX export both match onnxruntime on the original model."""
    want = ort_session(model).run(None, feeds)
    graph = load_onnx(model)
    got = run_graph(graph, feeds)
    exported = ort_session(model_bytes(export_onnx(graph))).run(None, feeds)
    for v, w, e in zip(graph.outputs, want, exported, strict=True):
        assert_close(got[v.name], w, rtol=1e-5, atol=1e-6, what=f"{v.name} (interpreter)")
        assert_close(e, w, rtol=1e-5, atol=1e-6, what=f"{v.name} (export)")


def test_function_op_is_expanded_into_its_body() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 4])
    model = _model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"])], [x], [y], 13)
    graph = load_onnx(model)
    assert "MeanVarianceNormalization" not in {n.op for n in graph.nodes()}
    _both_paths(model, {"x": np.random.default_rng(0).normal(size=(2, 3, 4, 4)).astype(np.float32)})


def test_float_mod_with_fmod_0_takes_the_divisor_sign() -> None:
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [8])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [8])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [8])
    model = _model([helper.make_node("Mod", ["a", "b"], ["z"], fmod=0)], [a, b], [z], 28)
    feeds = {
        "a": np.array([5.5, -5.5, 5.5, -5.5, 0.0, 3.0, -3.0, 7.25], np.float32),
        "b": np.array([2.0, 2.0, -2.0, -2.0, 3.0, np.inf, np.inf, -0.5], np.float32),
    }
    graph = load_onnx(model)
    got = run_graph(graph, feeds)["z"]
    np.testing.assert_array_equal(got, np.mod(feeds["a"], feeds["b"]))
    exported = ort_session(model_bytes(export_onnx(graph))).run(None, feeds)[0]
    np.testing.assert_array_equal(exported, np.mod(feeds["a"], feeds["b"]))


def test_constant_if_imports_only_the_taken_branch() -> None:
    # the else branch splits a 5-vector 4 ways, which cannot type-check; the condition is constant
    five = helper.make_tensor_value_info("s", TensorProto.INT64, [5])
    then_out = helper.make_tensor_value_info("t", TensorProto.INT64, [1])
    else_out = helper.make_tensor_value_info("e", TensorProto.INT64, [2])
    then_g = helper.make_graph(
        [helper.make_node("Slice", ["s", "zero", "one"], ["t"])], "then", [], [then_out]
    )
    else_g = helper.make_graph(
        [helper.make_node("Split", ["s"], ["e", "e1", "e2", "e3"], num_outputs=4)], "else", [], [else_out]
    )
    nodes = [
        helper.make_node("Constant", [], ["zero"], value_ints=[0]),
        helper.make_node("Constant", [], ["one"], value_ints=[1]),
        helper.make_node("Size", ["s"], ["n"]),
        helper.make_node("Constant", [], ["five"], value_int=5),
        helper.make_node("Equal", ["n", "five"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.INT64, None)
    graph = load_onnx(_model(nodes, [five], [y], 18))
    assert "If" not in {n.op for n in graph.nodes()} and [v.name for v in graph.outputs] == ["y"]
    s = np.arange(10, 15, dtype=np.int64)
    np.testing.assert_array_equal(run_graph(graph, {"s": s})["y"], s[:1])


def test_export_refuses_a_dtype_the_onnx_schema_does_not_allow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4])
    model = _model([helper.make_node("Celu", ["x"], ["y"], alpha=2.0)], [x], [y], 28)  # float16 from opset 28
    onnx.save(model, tmp_path / "celu.onnx")
    rc = main(["compile", str(tmp_path / "celu.onnx"), "-o", str(tmp_path / "out"), "--emit", "onnx"])
    err = capsys.readouterr().err
    assert rc == 2 and "unsupported op(s) for onnx" in err and "float16 input 0 (X)" in err, err
    assert "Celu-12 (exported at opset 21)" in err


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_signed_bit_shift_through_the_unsigned_shift(dtype: np.dtype, direction: str) -> None:
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    vi = [helper.make_tensor_value_info(n, code, [6]) for n in ("x", "s", "z")]
    model = _model([helper.make_node("BitShift", ["x", "s"], ["z"], direction=direction)], vi[:2], vi[2:], 28)
    width = 8 * np.dtype(dtype).itemsize
    x: np.ndarray = np.array([5, -5, 100, -100, -1, 7], dtype)
    s: np.ndarray = np.array([1, 2, 3, width, -1, width - 1], dtype)
    bits = x.astype(np.int64)  # the opset-28 rule: out-of-range shifts give 0, or -1 (RIGHT of x < 0)
    valid = (s >= 0) & (s < width)
    amount = np.where(valid, s, 0).astype(np.int64)
    want: np.ndarray
    if direction == "LEFT":
        want = np.where(valid, (bits << amount), 0).astype(dtype)  # wraps to the width
    else:
        want = np.where(valid, bits >> amount, np.where(bits < 0, -1, 0)).astype(dtype)
    graph = load_onnx(model)
    np.testing.assert_array_equal(run_graph(graph, {"x": x, "s": s})["z"], want)
    exported = ort_session(model_bytes(export_onnx(graph))).run(None, {"x": x, "s": s})[0]
    np.testing.assert_array_equal(exported, want)
