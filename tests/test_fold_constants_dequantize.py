"""fold-constants and the DequantizeLinear of integer constants (a quantized source's weights).

dq(W_q) = (W_q - z) s folds by default (TVM's legalization: float weights for what its integer
kernels did not take); ``dequantize=0`` (the optimize pipelines) keeps it a node, so the integer
weights reach the backends' integer forms; ``only_dequantize=1`` (MNN's legalization, after its
fusions) folds it and nothing else.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from frontends.onnx.loader import load_onnx
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

FEEDS = {"x": np.random.default_rng(1).normal(0, 1, (1, 2, 50, 50)).astype(np.float32)}
C = (1, 3, 48, 48)  # past the importer's folding size: c1 + c2 reaches the pass


def _model() -> onnx.ModelProto:
    """y = conv(x, dq(W_q; s)) + (c1 + c2): one integer-weight dq and one float constant Add."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(rng.integers(-60, 60, (3, 2, 3, 3)).astype(np.int8), "wq"),
        numpy_helper.from_array(np.array([0.02, 0.03, 0.01], np.float32), "ws"),
        numpy_helper.from_array(rng.normal(0, 1, C).astype(np.float32), "c1"),
        numpy_helper.from_array(rng.normal(0, 1, C).astype(np.float32), "c2"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], axis=0),
        helper.make_node("Conv", ["x", "w"], ["h"]),
        helper.make_node("Add", ["c1", "c2"], ["c"]),
        helper.make_node("Add", ["h", "c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 50, 50])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_frontend_keeps_both_for_the_passes() -> None:
    counts = op_counts(load_onnx(_model()))
    assert counts["DequantizeLinear"] == 1 and counts["Add"] == 2


@pytest.mark.parametrize(
    ("spec", "dq_left", "adds_left"),
    [
        ("fold-constants", 0, 1),
        ("fold-constants{dequantize=0}", 1, 1),  # must not fire on dq(W_q); still folds c1 + c2
        ("fold-constants{only_dequantize=1}", 0, 2),  # must not fire on c1 + c2
    ],
)
def test_fold_options(spec: str, dq_left: int, adds_left: int) -> None:
    graph = assert_pass_matches_ort(_model(), [spec, "eliminate-dead-nodes"], FEEDS, max_rel=1e-6)
    counts = op_counts(graph)
    assert counts == Counter({"Conv": 1, "Add": adds_left, "DequantizeLinear": dq_left}) - Counter()


def test_default_pipeline_keeps_dq_of_integer_weights() -> None:
    from compiler.pipelines import pipeline

    graph = load_onnx(_model())
    run_passes(graph, pipeline("default"))
    assert op_counts(graph)["DequantizeLinear"] == 1


def test_a_requantized_constant_folds_whole() -> None:
    """q(dq(c_q)) (a tied bias that onnxruntime's quantizer quantizes again) folds with
    dequantize=0: only a dq that linear ops alone read is kept, so q(dq(c_q)) folds, and so do the
    dequantizers that the Adds read (float constants)."""
    rng = np.random.default_rng(4)
    inits = [
        numpy_helper.from_array(rng.integers(-100, 100, (8,)).astype(np.int8), "bq"),
        numpy_helper.from_array(np.array(0.02, np.float32), "s"),
        numpy_helper.from_array(np.array(0.03, np.float32), "s2"),
        numpy_helper.from_array(np.array(5, np.int8), "z2"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["bq", "s"], ["b"]),
        helper.make_node("Add", ["x", "b"], ["h"]),
        helper.make_node("QuantizeLinear", ["b", "s2", "z2"], ["b2q"]),
        helper.make_node("DequantizeLinear", ["b2q", "s2", "z2"], ["b2"]),
        helper.make_node("Add", ["h", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": np.random.default_rng(5).normal(0, 1, (2, 8)).astype(np.float32)}
    g = assert_pass_matches_ort(
        model, ["fold-constants{dequantize=0}", "eliminate-dead-nodes"], feeds, max_rel=1e-6
    )
    counts = op_counts(g)
    assert counts == Counter({"Add": 2})
