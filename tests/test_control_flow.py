"""If, Loop and Scan as subgraphs in the IR: import, verifier, interpreter, printer, export.

Numerics: Kiln's interpreter and onnxruntime on Kiln's export against onnxruntime on the source
model, fp32 |a - e| <= 1e-6 + 1e-6 |e| (measured: If/Loop bit-exact, Scan <= 2.4e-7 abs, LSTM
inside an If <= 9e-8 abs; the export runs the same kernels in onnxruntime: bit-exact).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from compiler.errors import UnsupportedOpsError
from compiler.ir import Graph, print_graph, run_graph, verify
from compiler.ir.types import DType, TensorType
from compiler.ir.verifier import VerificationError
from compiler.onnx_export import export_onnx
from compiler.pipelines import pipeline
from frontends.onnx.loader import load_onnx
from tests.helpers import control_flow_models as cf
from tests.helpers.numerics import assert_close
from tests.helpers.onnx_text import rand
from tests.helpers.pass_check import op_counts, ort, run_passes

RTOL = ATOL = 1e-6


def _check(model: onnx.ModelProto, graph: Graph, feeds: dict[str, np.ndarray]) -> None:
    """Interpreter and onnxruntime-on-the-export both match onnxruntime on ``model``."""
    ref = ort(model, feeds)
    exported = export_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    for got in (run_graph(graph, feeds), ort(exported, feeds)):
        assert sorted(got) == sorted(ref)
        for k in ref:
            assert_close(got[k], ref[k], rtol=RTOL, atol=ATOL, what=k)


def _scan_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"s0": rand(2, 3, seed=seed), "x": rand(2, 5, 3, seed=seed + 1), "wx": rand(3, seed=seed + 2)}


@pytest.mark.parametrize("cond", [True, False])
def test_if_imports_runs_and_exports(cond: bool) -> None:
    m = cf.if_model(cond_from_shape=False)
    g = load_onnx(m)
    verify(g)
    assert op_counts(g) == {"If": 1}
    _check(m, g, {"x": rand(2, 4), "cond": np.asarray(cond)})


def test_if_prints_its_branches_indented() -> None:
    g = load_onnx(cf.if_model(cond_from_shape=False))
    assert print_graph(g, constants=False) == (
        "graph if_model(\n"
        "  %x: f32[2,4],\n"
        "  %cond: bool[],\n"
        ") {\n"
        "  %y = If(%cond, %x) {captures=1} : f32[2,4]  # the_if\n"
        "    then_branch(%x: f32[2,4]) {\n"
        "      %r = Relu(%x) : f32[2,4]\n"
        "      %t_out = Mul(%r, %w) : f32[2,4]\n"
        "      return %t_out\n"
        "    }\n"
        "    else_branch(%x: f32[2,4]) {\n"
        "      %n = Neg(%x) : f32[2,4]\n"
        "      %e_out = Add(%n, %b) : f32[2,4]\n"
        "      return %e_out\n"
        "    }\n"
        "  return %y\n"
        "}\n"
    )


def test_export_writes_captures_back_as_outer_scope_names() -> None:
    exported = export_onnx(load_onnx(cf.if_model(cond_from_shape=False)))
    (node,) = [n for n in exported.graph.node if n.op_type == "If"]
    assert list(node.input) == ["cond"]  # the capture is not a node input in ONNX
    then_g = next(a.g for a in node.attribute if a.name == "then_branch")
    assert not then_g.input and "x" in then_g.node[0].input
    assert not [a.name for a in node.attribute if a.name == "captures"]


def test_clone_deep_copies_subgraphs() -> None:
    g = load_onnx(cf.if_model(cond_from_shape=False))
    c = g.clone()
    (a,), (b,) = g.ops(), c.ops()
    assert a.subgraphs and all(x is not y for x, y in zip(a.subgraphs, b.subgraphs, strict=True))
    assert print_graph(c) == print_graph(g)


def test_verifier_recurses_into_subgraphs() -> None:
    g = load_onnx(cf.if_model(cond_from_shape=False))
    (node,) = g.ops()
    branch = node.attrs.then_branch
    relu = next(n for n in branch.ops() if n.op == "Relu")
    relu.output_types[0] = TensorType(DType.FLOAT32, (9,))
    with pytest.raises(VerificationError, match="subgraph then_branch: Relu"):
        verify(g)


def test_loop_with_static_trip_count() -> None:
    m = cf.loop_cumsum_model(5)
    g = load_onnx(m)
    verify(g)
    (loop,) = g.ops()
    assert [str(t) for t in loop.output_types] == ["f32[3]", "f32[5,3]"]
    _check(m, g, {"x": rand(3), "s0": rand(3, seed=1)})


def test_loop_with_dynamic_trip_count_runs() -> None:
    m = cf.loop_cumsum_model(m_input=True)
    g = load_onnx(m)
    (loop,) = g.ops()
    assert str(loop.output_types[1]) == "f32[?,3]"
    for trips in (0, 1, 4):
        _check(m, g, {"x": rand(3), "s0": rand(3, seed=1), "M": np.asarray(trips, np.int64)})


def test_loop_carried_shape_that_grows_and_nested_captures() -> None:
    m = cf.loop_growing_model(3)
    g = load_onnx(m)
    verify(g)
    (_, loop) = g.ops()  # Exp, Loop
    body = loop.attrs.body
    assert str(body.inputs[2].type) == "f32[?,2]"  # the carried type widened by the fixed point
    assert [v.name for v in body.inputs[3:]] == ["x", "scale"]  # captured for the If inside
    inner = next(n for n in body.ops() if n.op == "If")
    assert inner.attrs.captures == 2
    _check(m, g, {"x": rand(1, 2), "s0": rand(1, 2, seed=1), "logscale": rand(1, seed=2)})


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_opset9_form(reverse: bool) -> None:
    m = cf.scan_cumsum_model(reverse=reverse)
    g = load_onnx(m)
    verify(g)
    (_, scan) = g.ops()
    assert [str(t) for t in scan.output_types] == ["f32[2,3]", "f32[2,5,3]"]
    _check(m, g, _scan_feeds())


def test_dead_code_keeps_values_used_only_inside_subgraphs() -> None:
    g = load_onnx(cf.scan_cumsum_model())
    run_passes(g, ["eliminate-dead-nodes"])
    assert op_counts(g) == {"Sigmoid": 1, "Scan": 1}  # w = Sigmoid(wx) is read by the body only


def test_float64_interpreter_runs_bodies_in_float64() -> None:
    g = load_onnx(cf.scan_cumsum_model())
    feeds = _scan_feeds()
    got = run_graph(g, feeds, float64=True)
    assert got["ys"].dtype == np.float64
    assert_close(got["ys"], run_graph(g, feeds)["ys"], rtol=1e-6, atol=1e-6)


def test_unsupported_op_inside_a_branch_is_one_refusal_naming_it() -> None:
    with pytest.raises(UnsupportedOpsError) as info:
        load_onnx(cf.unsupported_in_branch_model())
    assert list(info.value.ops) == ["Unique"]
    assert info.value.ops["Unique"] == ["outer_if/else_branch/the_unique"]
    assert "Unique (nodes 'outer_if/else_branch/the_unique')" in str(info.value)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "MatMulTanh"])
def test_silero_style_if_with_constant_condition_imports_folds_and_matches(cell: str) -> None:
    m = cf.silero_style_model(cell)
    g = load_onnx(m)
    assert op_counts(g)["If"] == 1
    run_passes(g, pipeline("default"))
    counts = op_counts(g)
    assert "If" not in counts
    if cell != "MatMulTanh":
        assert counts[cell] == 1
    _check(m, g, {"x": rand(4, 1, 8, seed=3)})


@pytest.mark.parametrize("opset", [9, 13, 21])
def test_opsets(opset: int) -> None:
    for m, feeds in (
        (cf.if_model(cond_from_shape=True, opset=opset), {"x": rand(2, 4)}),
        (cf.loop_cumsum_model(4, opset=opset), {"x": rand(3), "s0": rand(3, seed=1)}),
        (cf.scan_cumsum_model(opset=opset), _scan_feeds()),
    ):
        _check(m, load_onnx(m), feeds)
