"""decompose: softplus-stable, mish-softplus, selu/celu-minmax, softsign-div and the Where-based
thresholded-relu-where / shrink-where against onnxruntime.

Numerics: onnxruntime on the original model vs onnxruntime on Kiln's decomposed graph exported
back to ONNX; max|diff| <= TOL * max(1, max|ref|) per output, TOL stated per test (float32).
"""

from __future__ import annotations

import numpy as np
import pytest

from frontends.onnx.loader import load_onnx
from tests.helpers.decompose_check import (
    ELEMENTARY,
    FakeDecompose,
    decompose_matches_ort,
    fake_table,
    refusals,
)
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, ort, ort_graph, run_passes

TABLE = fake_table({*ELEMENTARY, "Relu", "Abs", "Neg", "Exp", "Log", "Greater", "Where"})
N = 3009
X = np.concatenate(
    [
        rand(2000, seed=3, scale=4.0),
        np.linspace(-30.0, 30.0, 1001, dtype=np.float32),  # far tails: exp(x) would overflow at 89
        np.array([-0.5, 0.5, 1.0, 0.0, -0.0, 1e-30, -1e-30, -25.0], np.float32),
    ]
)


def _unary(op: str) -> str:
    return f"g (float[{N}] x) => (float[{N}] y) {{ y = {op}(x) }}"


SOFTPLUS_OPS = {"Relu": 1, "Abs": 1, "Neg": 1, "Exp": 1, "Add": 2, "Log": 1}
MINMAX_OPS = {"Exp": 1, "Sub": 1, "Mul": 1, "Min": 1, "Relu": 1, "Add": 1}


@pytest.mark.parametrize(
    ("op", "ops", "tol"),
    [
        ("Softplus", SOFTPLUS_OPS, 5e-8),  # measured 9.5e-9 (of max|y| = 30)
        ("Mish", {**SOFTPLUS_OPS, "Tanh": 1, "Mul": 1}, 5e-8),  # measured 1.9e-8
        ("Selu", {**MINMAX_OPS, "Mul": 2}, 2e-8),  # measured 1.7e-9
        ("Selu<alpha=1.5, gamma=2.0>", {**MINMAX_OPS, "Mul": 2}, 2e-8),  # measured 1.2e-9
        ("Celu<alpha=2.0>", {**MINMAX_OPS, "Div": 1}, 2e-8),  # measured 1.2e-9
        ("Softsign", {"Abs": 1, "Add": 1, "Div": 1}, 1e-7),  # measured 6.0e-8 (1 ulp at 1)
        ("ThresholdedRelu<alpha=0.5>", {"Greater": 1, "Where": 1}, 0.0),  # bit-exact
        ("Shrink<bias=0.25, lambd=0.5>", {"Greater": 2, "Sub": 1, "Add": 1, "Where": 2}, 0.0),
    ],
)
def test_activation(op: str, ops: dict[str, int], tol: float) -> None:
    g = decompose_matches_ort(text_model(_unary(op), 18, 9), {"x": X}, max_rel=tol, table=TABLE)
    assert op_counts(g) == ops


def test_softplus_large_input_stays_finite() -> None:
    """log(1 + exp(x)) would be inf from x = 89; the stable form gives x (an inf would fail
    the comparison). At x = -88 onnxruntime keeps exp(x) = 6e-39 where 1 + exp(x) rounds to 1."""
    x = np.array([-100.0, -88.0, 88.0, 100.0, 500.0], np.float32)
    text = "g (float[5] x) => (float[5] y) { y = Softplus(x) }"
    g = decompose_matches_ort(
        text_model(text, 18, 9), {"x": x}, max_rel=1e-9, table=TABLE
    )  # measured 1.2e-41
    assert "Softplus" not in op_counts(g)


def test_thresholds_of_nan_and_inf() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.5, 0.6, -0.6], np.float32)
    text = "g (float[6] x) => (float[6] y, float[6] z) { y = ThresholdedRelu<alpha=0.5>(x) z = Shrink(x) }"
    m = text_model(text, 18, 9)
    g = load_onnx(m)
    run_passes(g, [FakeDecompose(fixed=TABLE)])
    assert op_counts(g)["Where"] == 3
    ref, got = ort(m, {"x": x}), ort_graph(g, {"x": x})
    for k in ("y", "z"):  # bit-exact, NaN and inf included (a scaled tolerance would be inf)
        np.testing.assert_array_equal(got[k], ref[k])


def test_mish_keeps_native_softplus() -> None:
    table = fake_table({*ELEMENTARY, "Softplus"})
    g = decompose_matches_ort(text_model(_unary("Mish"), 18, 9), {"x": X}, max_rel=5e-8, table=table)
    assert op_counts(g) == {"Softplus": 1, "Tanh": 1, "Mul": 1}


def test_selu_negative_alpha_refused() -> None:
    reasons, counts = refusals(text_model(_unary("Selu<alpha=-1.0>"), 18, 9), TABLE)
    assert counts == {"Selu": 1}
    assert any("selu-minmax: alpha=-1 is not positive" in r for r in reasons), reasons


def test_thresholded_relu_needs_native_where() -> None:
    """where-affine would take a Where of constants only, so a non-native Where refuses."""
    table = fake_table({*ELEMENTARY, "Greater"})
    reasons, counts = refusals(text_model(_unary("ThresholdedRelu"), 18, 9), table)
    assert counts == {"ThresholdedRelu": 1}
    assert any("produces Where, which fake has no native entry for" in r for r in reasons), reasons


def test_softsign_kept_when_native() -> None:
    reasons, counts = refusals(text_model(_unary("Softsign"), 18, 9), fake_table({*ELEMENTARY, "Softsign"}))
    assert counts == {"Softsign": 1} and not reasons
