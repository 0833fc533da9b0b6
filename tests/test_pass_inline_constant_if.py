"""inline-constant-if: an If with a constant condition becomes its taken branch.

Numerics: onnxruntime on the rewritten export vs onnxruntime on the source model,
max|diff| <= 1e-6 * max(1, max|ref|) (measured: bit-exact, the same ops run).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from compiler.ir import print_graph, run_graph
from compiler.pass_infra import PassContext
from frontends.onnx.loader import load_onnx
from tests.helpers import control_flow_models as cf
from tests.helpers.numerics import assert_close
from tests.helpers.onnx_text import rand
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

TOL = 1e-6
PIPE = ["inline-constant-if", "eliminate-dead-nodes"]


def _branches_of_different_shapes() -> onnx.ModelProto:
    """y = Abs(If(c, then: Relu(x) [2,4], else: Reshape(x, [8]) [8])), c a graph input: the If's type
    has unknown rank (a constant c with such branches is inlined at import already)."""
    vi = helper.make_tensor_value_info
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"])], "then", [], [vi("r", TensorProto.FLOAT, [2, 4])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "flat"], ["f"])], "else", [], [vi("f", TensorProto.FLOAT, [8])]
    )
    g = helper.make_graph(
        [
            helper.make_node("If", ["c"], ["y"], name="pick", then_branch=then_g, else_branch=else_g),
            helper.make_node("Abs", ["y"], ["z"]),
        ],
        "shapes",
        [vi("x", TensorProto.FLOAT, [2, 4]), vi("c", TensorProto.BOOL, [])],
        [vi("z", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.asarray([8], np.int64), "flat")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_if_on_a_bound_shape_folds_to_its_branch() -> None:
    m = cf.if_model(cond_from_shape=True)
    feeds = {"x": rand(2, 4)}
    g = assert_pass_matches_ort(m, PIPE, feeds, max_rel=TOL, input_shapes={"x": [2, 4]})
    assert print_graph(g, constants=False) == (
        "graph if_model(\n"
        "  %x: f32[2,4],\n"
        ") {\n"
        "  %r = Relu(%x) : f32[2,4]\n"
        "  %y = Mul(%r, %w) : f32[2,4]\n"
        "  return %y\n"
        "}\n"
    )


def test_downstream_types_are_refreshed() -> None:
    m = _branches_of_different_shapes()
    g = load_onnx(m)
    assert [str(n.output_types[0]) for n in g.ops()] == ["f32[*]", "f32[*]"]
    cond = g.find_value("c")  # the condition becomes a constant (as a bound shape would make it)
    g.replace_all_uses(cond, g.add_constant(np.asarray(True), "c_true"))
    run_passes(g, PIPE)
    assert [(n.op, str(n.output_types[0])) for n in g.ops()] == [("Relu", "f32[2,4]"), ("Abs", "f32[2,4]")]
    feeds = {"x": rand(2, 4), "c": np.asarray(True)}  # c stays a (now unused) graph input
    assert_close(run_graph(g, feeds)["z"], np.abs(np.maximum(feeds["x"], 0)), rtol=0, atol=0)


def test_must_not_fire_on_a_condition_known_only_at_run_time() -> None:
    g = load_onnx(cf.if_model(cond_from_shape=False))
    ctx = PassContext(verify_each=True)
    assert not run_passes(g, PIPE, ctx).changed
    assert [(m.rule, m.node, m.reason) for m in ctx.near_misses] == [
        ("inline-constant-if", "the_if", "'cond' is not a constant")
    ]


def test_must_not_fire_while_the_shape_is_unbound() -> None:
    g = load_onnx(cf.if_model(cond_from_shape=True))  # x: [2, n]
    assert not run_passes(g, PIPE).changed
    assert op_counts(g)["If"] == 1


def test_idempotent() -> None:
    g = load_onnx(cf.silero_style_model("GRU"))
    assert run_passes(g, ["fold-constants", *PIPE]).changed
    assert op_counts(g) == {"GRU": 1, "Squeeze": 1, "MatMul": 1}
    assert not run_passes(g, PIPE).changed
