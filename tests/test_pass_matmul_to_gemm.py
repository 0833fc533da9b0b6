"""matmul-to-gemm: N-D MatMul by a constant weight (+ bias) as Reshape -> Gemm -> Reshape.

Numerics against onnxruntime at fp32 max rel 1e-6 (the same dot products; the bias is added
inside Gemm instead of by a broadcast Add). Structure: op counts, the shared row reshapes of
attention's three projections, must-not-fire reasons and idempotence.
"""

from __future__ import annotations

import pytest

from compiler.pass_infra import PassContext
from frontends.onnx.loader import load_onnx
from passes.matmul_to_gemm import MatMulToGemm
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

TOL = 1e-6
QKV = """
g (float[1, 6, 8] x) => (float[1, 6, 4] q, float[1, 6, 4] k, float[1, 6, 4] v) {
    qm = MatMul (x, wq)
    q = Add (qm, bq)
    km = MatMul (x, wk)
    k = Add (bk, km)
    v = MatMul (x, wv)
}
"""
WEIGHTS = {
    "wq": rand(8, 4, seed=1),
    "bq": rand(4, seed=2),
    "wk": rand(8, 4, seed=3),
    "bk": rand(1, 1, 4, seed=4),
    "wv": rand(8, 4, seed=5),
}
FEEDS = {"x": rand(1, 6, 8, seed=6)}


@pytest.mark.parametrize("image", [False, True])
def test_projections_become_gemms(image: bool) -> None:
    p = MatMulToGemm(image=image)
    g = assert_pass_matches_ort(text_model(QKV, 17, 8, **WEIGHTS), [p], FEEDS, max_rel=TOL)
    # one row reshape chain shared by the three projections; one output Reshape each
    assert op_counts(g) == {"Gemm": 3, "Reshape": 3 + (2 if image else 1)}
    gemms = [n for n in g.ops() if n.op == "Gemm"]
    assert len({g.inputs_of(n)[0] for n in gemms}) == 1
    assert [len([v for v in g.inputs_of(n) if v is not None]) for n in gemms] == [3, 3, 2]
    if image:
        (a,) = {g.inputs_of(n)[0] for n in gemms}
        assert g.inputs_of(a.producer)[0].type.static_shape == (6, 8, 1, 1)  # type: ignore[union-attr]
    assert not run_passes(g, [p]).changed


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "g (float[6, 8] x) => (float[6, 4] y) { y = MatMul (x, wq) }",
            "input is not a static N-D tensor (N >= 3; 2-D is canonicalize's Gemm)",
        ),
        (
            "g (float[1, 6, 8] x, float[8, 4] w) => (float[1, 6, 4] y) { y = MatMul (x, w) }",
            "W is not constant",
        ),
        (
            "g (float[1, 6, 8] x) => (float[1, 6, 4] y) { m = MatMul (x, wq)\n y = Add (m, b6) }",
            "b of shape [6, 1] does not broadcast along the last axis only",
        ),
    ],
)
def test_must_not_fire(text: str, reason: str) -> None:
    consts = {"wq": WEIGHTS["wq"], "b6": rand(6, 1, seed=7)}
    used = {k: v for k, v in consts.items() if k in text}
    graph = load_onnx(text_model(text, 17, 8, **used))
    ctx = PassContext(verify_each=True)
    before = op_counts(graph)
    result = run_passes(graph, [MatMulToGemm()], ctx)
    reasons = {m.reason for m in ctx.near_misses}
    if "Add" in text:  # the bias rule refuses; the MatMul alone is still rewritten
        assert reason in reasons and op_counts(graph)["Gemm"] == 1 and op_counts(graph)["Add"] == 1
    else:
        assert not result.changed and op_counts(graph) == before
        assert reason in reasons, reasons


def test_bias_rule_runs_first() -> None:
    """A MatMul read by its bias Add is rewritten with the bias, not before it."""
    g = load_onnx(text_model(QKV, 17, 8, **WEIGHTS))
    run_passes(g, [MatMulToGemm()])
    counts = op_counts(g)
    assert "Add" not in counts and counts["Gemm"] == 3
