"""Entropy's output check (compiler/quant/clip_check.py): clipped ranges kept only where no output pays.

A two-head graph, x -> Conv -> Relu (a) -> Conv -> y1 and x -> Conv -> Relu (e) -> Conv -> y2,
on samples where ``a`` and ``e`` are uniform on about [0, 1] but for one value of 1.01 per sample:

* clipping ``a`` to [0, 1] costs 0.01^2 at one value and refines the grid of 16,384 (kept);
* clipping ``e`` to [0, 0.3] cuts most of its values (put back to full range, naming y2);
* clipping the Conv output ``c`` before Relu changes nothing: Relu's grid is shared onto it.
"""

from __future__ import annotations

import numpy as np

from compiler.calibration import CalibMethod
from compiler.ir.graph import Graph
from compiler.ir.types import DType
from compiler.quant.calibrate import calibrate
from compiler.quant.clip_check import _Measure, _Models, check_clipped_ranges
from compiler.quant.cone import float_outputs
from compiler.quant.plan import QuantPlan, make_plan
from compiler.quant.qdq import activation_params
from compiler.quant.sensitivity import FloatReference, model_scores, quantized_graph
from frontends.onnx.loader import load_onnx
from tests.helpers.onnx_text import rand, text_model

SHAPE = (1, 4, 64, 64)


def _graph() -> Graph:
    eye = np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1)
    zero = np.zeros(4, np.float32)
    m = text_model(
        """g (float[1,4,64,64] x) => (float[1,4,64,64] y1, float[1,4,64,64] y2) {
             c = Conv(x, w1, b1)
             a = Relu(c)
             y1 = Conv(a, w2, b2)
             d = Conv(x, w3, b3)
             e = Relu(d)
             y2 = Conv(e, w4, b4)
           }""",
        w1=np.float32(0.987654) * eye,  # a = 0.987654 x + 0.0123: off x's int8 lattice
        b1=np.full(4, 0.0123, np.float32),
        w2=rand(4, 4, 1, 1, seed=2),
        b2=rand(4, seed=3),
        w3=eye,
        b3=zero,
        w4=rand(4, 4, 1, 1, seed=4),
        b4=rand(4, seed=5),
    )
    return load_onnx(m)


def _samples() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(4):
        x = rng.random(SHAPE, dtype=np.float32)
        x.flat[rng.integers(x.size)] = np.float32(1.01)
        out.append({"x": x})
    return out


def _setup() -> tuple[Graph, QuantPlan, dict[str, tuple[float, float]], list[dict[str, np.ndarray]]]:
    g = _graph()
    plan = make_plan(g, float_tail=True)
    samples = _samples()
    full = calibrate(g, plan.observe, samples, CalibMethod("minmax"), symmetric=False, progress=False)
    return g, plan, full, samples


def _name(plan: QuantPlan, stem: str) -> str:
    assert stem in plan.observe, f"{stem} is not observed: {plan.observe}"
    return stem


def test_clip_kept_only_where_no_output_loses() -> None:
    g, plan, full, samples = _setup()
    a, e, c = (_name(plan, s) for s in ("a", "e", "c"))
    assert full[a][1] > 1.005 and full[e][1] == np.float32(1.01)
    clipped = dict(full)
    clipped[a] = (0.0, 1.0)
    clipped[e] = (0.0, 0.3)
    clipped[c] = (0.0, 0.9)
    got = check_clipped_ranges(g, plan, clipped, full, samples, dtype=DType.UINT8, symmetric=False)
    assert got.samples == 4
    assert got.kept == [c, a] or got.kept == [a, c], got.kept
    assert got.no_effect == [c]
    assert list(got.full) == [e] and "'y2'" in got.full[e], got.full
    assert got.ranges[a] == (0.0, 1.0) and got.ranges[e] == full[e] and got.ranges[c] == (0.0, 0.9)
    again = check_clipped_ranges(g, plan, clipped, full, samples, dtype=DType.UINT8, symmetric=False)
    assert again.ranges == got.ranges and again.full == got.full  # deterministic

    # The promise, measured on the whole models: no output's error above the full ranges'.
    ref = FloatReference.run(g, samples)
    noise = {}
    for what, ranges in (("full", full), ("checked", got.ranges)):
        params = activation_params(g, ranges, DType.UINT8, symmetric=False)
        q = quantized_graph(g, plan, plan.nodes, params, True)
        noise[what] = {o: s.noise for o, s in model_scores(q, samples, ref).items()}
    assert noise["checked"]["y1"] < noise["full"]["y1"] * (1 - 1e-3), noise  # the kept clip gains
    assert noise["checked"]["y2"] == noise["full"]["y2"], noise  # y2's tensors stay on full range


def test_cone_noise_equals_the_whole_model() -> None:
    """Each clip measured on its cone (fed with the full-range model's values) equals the whole model."""
    g, plan, full, samples = _setup()
    models = _Models(g, plan, full, DType.UINT8, False, True)
    m = _Measure(models, samples)
    clips = {n: (lo, 0.5 * hi) for n, (lo, hi) in full.items() if hi > 0}
    fed: set[str] = set()
    for n, r in clips.items():
        c = models.cone({n: r}, build=False)
        fed.update(c.fed if c is not None else [])
    m.fill_cache(fed)
    measured = 0
    for n, r in clips.items():
        q = models.whole({n: r})
        whole = m.run(q, [], float_outputs(q))
        cone = m.clip({n: r})
        if cone is None:
            assert all(np.array_equal(whole[o], m.base[o]) for o in whole), n
            continue
        for o in whole:
            np.testing.assert_allclose(cone[o], whole[o], rtol=1e-9, atol=0, err_msg=f"{n} -> {o}")
        measured += any(not np.array_equal(cone[o], m.base[o]) for o in cone)
    assert measured >= 3  # x, a (c shares its grid), e: clips the outputs see
