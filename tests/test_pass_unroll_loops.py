"""unroll-loops: a Loop or Scan with a static trip count becomes copies of its body.

Numerics: onnxruntime on the unrolled export vs onnxruntime on the source model,
max|diff| <= 1e-6 * max(1, max|ref|) (measured: Loop bit-exact, Scan <= 1.2e-7), and the
interpreter on the unrolled graph likewise.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir import run_graph
from compiler.pass_infra import PassContext
from frontends.onnx.loader import load_onnx
from passes.unroll_loops import UnrollLoops
from tests.helpers import control_flow_models as cf
from tests.helpers.numerics import assert_close
from tests.helpers.onnx_text import rand
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, ort, run_passes

TOL = 1e-6
PIPE = ["unroll-loops", "eliminate-dead-nodes"]


def _loop_feeds() -> dict[str, np.ndarray]:
    return {"x": rand(3), "s0": rand(3, seed=1)}


def _scan_feeds() -> dict[str, np.ndarray]:
    return {"s0": rand(2, 3), "x": rand(2, 5, 3, seed=1), "wx": rand(3, seed=2)}


def test_loop_cumsum_unrolls_and_still_matches() -> None:
    m = cf.loop_cumsum_model(5)
    g = assert_pass_matches_ort(m, PIPE, _loop_feeds(), max_rel=TOL)
    counts = op_counts(g)
    assert "Loop" not in counts
    assert counts["Add"] == 10 and counts["Mul"] == 5 and counts["Unsqueeze"] == 5 and counts["Concat"] == 1
    assert [str(v.type) for v in g.outputs] == ["f32[3]", "f32[5,3]"]
    ref = ort(m, _loop_feeds())
    got = run_graph(g, _loop_feeds())
    for k in ref:
        assert_close(got[k], ref[k], rtol=TOL, atol=TOL, what=k)


def test_loop_with_growing_state_and_an_if_inside() -> None:
    m = cf.loop_growing_model(3)
    feeds = {"x": rand(1, 2), "s0": rand(1, 2, seed=1), "logscale": rand(1, seed=2)}
    g = assert_pass_matches_ort(
        m, ["unroll-loops", "fold-constants", "inline-constant-if", "eliminate-dead-nodes"], feeds
    )
    assert "Loop" not in op_counts(g) and "If" not in op_counts(g)
    assert [str(v.type) for v in g.outputs] == ["f32[4,2]"]  # the unknown dim became static


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_unrolls_and_still_matches(reverse: bool) -> None:
    m = cf.scan_cumsum_model(reverse=reverse)
    g = assert_pass_matches_ort(m, PIPE, _scan_feeds(), max_rel=TOL)
    counts = op_counts(g)
    assert "Scan" not in counts
    assert counts["Gather"] == 5 and counts["Tanh"] == 5 and counts["Concat"] == 1
    idx = sorted(
        int(g.inputs_of(n)[1].const)  # type: ignore[union-attr, arg-type]
        for n in g.ops()
        if n.op == "Gather"
    )
    assert idx == [0, 1, 2, 3, 4]


def test_zero_trip_loop_gives_an_empty_stack() -> None:
    m = cf.loop_cumsum_model(0)
    g = assert_pass_matches_ort(m, PIPE, _loop_feeds(), max_rel=TOL)
    assert op_counts(g) == {}
    assert [str(v.type) for v in g.outputs] == ["f32[3]", "f32[0,3]"]


def test_must_not_fire_on_a_dynamic_trip_count() -> None:
    g = load_onnx(cf.loop_cumsum_model(m_input=True))
    ctx = PassContext(verify_each=True)
    assert not run_passes(g, PIPE, ctx).changed
    assert [m.reason for m in ctx.near_misses] == [
        "the trip count (M, cond and the body's cond output) is not static"
    ]


def test_must_not_fire_over_the_size_cap() -> None:
    g = load_onnx(cf.loop_cumsum_model(5))
    ctx = PassContext(verify_each=True)
    assert not run_passes(g, [UnrollLoops(max_nodes=10)], ctx).changed
    assert [m.reason for m in ctx.near_misses] == ["unrolling 5 iterations gives 30 nodes > max_nodes 10"]


def test_idempotent() -> None:
    g = load_onnx(cf.scan_cumsum_model())
    assert run_passes(g, PIPE).changed
    assert not run_passes(g, PIPE).changed
