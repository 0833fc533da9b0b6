"""deduplicate-constants: structure, numerics against onnxruntime, must-not-fire, idempotence."""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import CONSTANT_OP, Graph
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from frontends.onnx.loader import load_onnx
from frontends.registry import load_model
from tests.conftest import MODELS
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import assert_pass_matches_ort, run_passes

X = {"x": rand(2, 3, 4, 4, seed=1)}


def _constants(g: Graph) -> int:
    return sum(1 for n in g.nodes() if n.op == CONSTANT_OP and not n.domain)


def test_identical_constants_merge_and_numerics_hold() -> None:
    c = rand(1, 3, 1, 1, seed=2)
    m = text_model(
        """g (float[2,3,4,4] x) => (float[2,3,4,4] y) {
             s = Mul(x, a)
             t = Add(s, b)
             y = Sub(t, d)
           }""",
        a=c,
        b=c.copy(),
        d=rand(1, 3, 1, 1, seed=3),
    )
    g = assert_pass_matches_ort(m, ["deduplicate-constants", "eliminate-dead-nodes"], X)
    assert _constants(g) == 2
    assert not run_passes(g, ["deduplicate-constants"]).changed


def test_must_not_fire_on_equal_bytes_of_other_dtype_or_shape_or_outputs() -> None:
    m = text_model(
        """g (float[2,3,4,4] x) => (float[2,3,4,4] y, float[3] k) {
             s = Mul(x, a)
             y = Add(s, b)
             k = Identity(k0)
           }""",
        a=np.ones((1, 3, 1, 1), np.float32),
        b=np.ones((3, 1, 1), np.float32),  # same bytes, other shape
        k0=np.ones(3, np.float32),
    )
    g = load_onnx(m)
    before = _constants(g)
    run_passes(g, ["deduplicate-constants", "eliminate-dead-nodes"])
    assert _constants(g) == before


def test_ultraface_prior_boxes_stored_once() -> None:
    g = load_model(MODELS / "ultraface_rfb320.onnx")
    PassManager(pipeline("default")).run(g)
    big = [n for n in g.nodes() if n.op == CONSTANT_OP and n.attrs.value.shape == (1, 4420, 2)]
    assert len(big) == 2  # the source model holds three [1, 4420, 2] prior tensors, two of them equal
