"""decompose: instance-norm, rms-norm and lp-norm against onnxruntime.

Numerics: onnxruntime on the original model vs onnxruntime on Kiln's decomposed graph exported
back to ONNX; max|diff| <= TOL * max(1, max|ref|) per output, TOL stated per test.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.decompose_check import ELEMENTARY, decompose_matches_ort, fake_table, refusals
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts

TABLE = fake_table({*ELEMENTARY, "ReduceSum", "Abs", "Reciprocal"})
IN_OPS = {"ReduceMean": 2, "Sub": 1, "Mul": 2, "Add": 2, "Sqrt": 1, "Div": 1}


def test_instance_norm_graph_scale() -> None:
    text = (
        "g (float[2,4,6,10] x, float[4] s, float[4] b) => (float[2,4,6,10] y) "
        "{ y = InstanceNormalization(x, s, b) }"
    )
    feeds = {"x": rand(2, 4, 6, 10, seed=5, scale=3.0) + 1.5, "s": rand(4, seed=6), "b": rand(4, seed=7)}
    g = decompose_matches_ort(text_model(text, 17, 8), feeds, max_rel=3e-7, table=TABLE)  # measured 6.4e-8
    assert op_counts(g) == {**IN_OPS, "Unsqueeze": 2}  # s, b -> [C, 1, 1]


def test_instance_norm_constant_scale_1d() -> None:
    text = "g (float[2,4,30] x) => (float[2,4,30] y) { y = InstanceNormalization<epsilon=0.001>(x, s, b) }"
    m = text_model(text, 17, 8, s=rand(4, seed=6), b=rand(4, seed=7))
    g = decompose_matches_ort(m, {"x": rand(2, 4, 30, seed=8, scale=2.0)}, max_rel=3e-7, table=TABLE)
    assert op_counts(g) == IN_OPS  # constants are reshaped in place


def test_instance_norm_dynamic_refused() -> None:
    text = "g (float[N,4,6] x) => (float[N,4,6] y) { y = InstanceNormalization(x, s, b) }"
    reasons, counts = refusals(text_model(text, 17, 8, s=rand(4), b=rand(4)), TABLE)
    assert counts == {"InstanceNormalization": 1}
    assert any("instance-norm: dynamic shape" in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("p", "axis", "ops"),
    [
        (1, 1, {"Abs": 1, "ReduceSum": 1, "Max": 1, "Div": 1}),
        (1, -1, {"Abs": 1, "ReduceSum": 1, "Max": 1, "Div": 1}),
        (2, 1, {"Mul": 1, "ReduceSum": 1, "Sqrt": 1, "Max": 1, "Div": 1}),
        (2, -1, {"Mul": 1, "ReduceSum": 1, "Sqrt": 1, "Max": 1, "Div": 1}),
    ],
)
def test_lp_norm(p: int, axis: int, ops: dict[str, int]) -> None:
    x = rand(2, 5, 16, seed=8, scale=2.0)
    x[0, 1] = 0.0  # a zero norm along the last axis gives 0, not NaN
    text = f"g (float[2,5,16] x) => (float[2,5,16] y) {{ y = LpNormalization<p={p}, axis={axis}>(x) }}"
    g = decompose_matches_ort(text_model(text, 17, 8), {"x": x}, max_rel=1e-7, table=TABLE)  # measured 6.0e-8
    assert op_counts(g) == ops


RMS = "g ({t}[2,5,16] x, {t}[{s}] s) => ({t}[2,5,16] y) {{ y = RMSNormalization{a}(x, s) }}"


@pytest.mark.parametrize(
    ("dtype", "attrs", "scale", "casts", "tol"),
    [
        ("float", "", (16,), 0, 3e-7),  # measured 1.1e-7
        ("float", "<axis=1, epsilon=0.01>", (5, 16), 0, 3e-7),  # measured 0
        ("float16", "", (16,), 2, 1e-3),  # float16 output (1 ulp at 1: 9.8e-4): measured 0
    ],
)
def test_rms_norm(dtype: str, attrs: str, scale: tuple[int, ...], casts: int, tol: float) -> None:
    np_dt = np.float16 if dtype == "float16" else np.float32
    text = RMS.format(t=dtype, s=",".join(map(str, scale)), a=attrs)
    feeds = {
        "x": (rand(2, 5, 16, seed=8, scale=2.0) + 1).astype(np_dt),
        "s": rand(*scale, seed=9).astype(np_dt),
    }
    g = decompose_matches_ort(text_model(text, 23, 10), feeds, max_rel=tol, table=TABLE)
    want = {"Mul": 3, "ReduceMean": 1, "Add": 1, "Sqrt": 1, "Reciprocal": 1}
    assert op_counts(g) == ({**want, "Cast": casts} if casts else want)


def test_lp_norm_kept_when_native_and_refused_without_max() -> None:
    text = "g (float[2,16] x) => (float[2,16] y) { y = LpNormalization(x) }"
    reasons, counts = refusals(text_model(text, 17, 8), fake_table({*ELEMENTARY, "LpNormalization"}))
    assert counts == {"LpNormalization": 1} and not reasons
    reasons, counts = refusals(text_model(text, 17, 8), fake_table(set(TABLE.ops()) - {"Max"}))
    assert counts == {"LpNormalization": 1}
    assert any("lp-norm: produces Max, which fake cannot write" in r for r in reasons), reasons


BN = "g (float[2,6,5,7] x{ins}) => (float[2,6,5,7] y) {{ y = BatchNormalization{a}(x, s, b, mu, v) }}"
BN_PARAMS = {
    "s": rand(6, seed=2),
    "b": rand(6, seed=3),
    "mu": rand(6, seed=4),
    "v": rand(6, seed=5, positive=True),
}


def test_batch_norm_constant_params() -> None:
    m = text_model(BN.format(ins="", a=""), 15, 8, **BN_PARAMS)
    x = rand(2, 6, 5, 7, seed=1, scale=3.0) + 2
    g = decompose_matches_ort(m, {"x": x}, max_rel=0.0, table=TABLE)  # bit-exact: onnxruntime's order
    assert op_counts(g) == {"Mul": 1, "Add": 1}  # a and c computed here


def test_batch_norm_graph_params() -> None:
    ins = "".join(f", float[6] {k}" for k in BN_PARAMS)
    m = text_model(BN.format(ins=ins, a="<epsilon=0.001>"), 15, 8)
    feeds = {"x": rand(2, 6, 5, 7, seed=1, scale=3.0), **BN_PARAMS}
    g = decompose_matches_ort(m, feeds, max_rel=0.0, table=TABLE)  # bit-exact
    assert op_counts(g) == {"Add": 2, "Sqrt": 1, "Div": 1, "Mul": 3, "Sub": 1, "Unsqueeze": 2}


def test_batch_norm_float16_refused() -> None:
    text = BN.format(ins="", a="").replace("float[", "float16[")
    params = {k: v.astype(np.float16) for k, v in BN_PARAMS.items()}
    reasons, counts = refusals(text_model(text, 15, 8, **params), TABLE)
    assert counts == {"BatchNormalization": 1}
    assert any("batch-norm: x is f16, not float32/float64" in r for r in reasons), reasons


LRN_OPS = {"Mul": 3, "Reshape": 2, "Pad": 1, "AveragePool": 1, "Add": 1, "Pow": 1}


@pytest.mark.parametrize("attrs", ["<size=5>", "<size=3, alpha=0.001, beta=0.5, bias=2.0>", "<size=1>"])
def test_lrn(attrs: str) -> None:
    """onnxruntime takes odd sizes only."""
    table = fake_table({*ELEMENTARY, "Reshape", "Pad", "AveragePool", "Pow"})
    m = text_model(f"g (float[2,10,5,7] x) => (float[2,10,5,7] y) {{ y = LRN{attrs}(x) }}", 13, 8)
    g = decompose_matches_ort(m, {"x": rand(2, 10, 5, 7, seed=1, scale=3.0)}, max_rel=3e-7, table=table)
    assert op_counts(g) == LRN_OPS  # measured <= 1.1e-7


def test_lrn_refused_without_pool() -> None:
    m = text_model("g (float[2,10,5,7] x) => (float[2,10,5,7] y) { y = LRN<size=3>(x) }", 13, 8)
    reasons, counts = refusals(m, fake_table({*ELEMENTARY, "Reshape", "Pad", "Pow"}))
    assert counts == {"LRN": 1}
    assert any("lrn-pool: produces AveragePool, which fake cannot write" in r for r in reasons), reasons
