"""decompose: tan-sin-cos and cosh-exp against onnxruntime, elementwise relative error.

Both outputs grow without bound (tan next to pi/2, cosh to 1e38), so the check is per element:
|got - ref| <= TOL * |ref|, TOL stated per test (float32; 1 ulp at 1 is 1.2e-7).
"""

from __future__ import annotations

import numpy as np
import pytest

from frontends.onnx.loader import load_onnx
from tests.helpers.decompose_check import ELEMENTARY, FakeDecompose, fake_table, refusals
from tests.helpers.onnx_text import text_model
from tests.helpers.pass_check import op_counts, ort, ort_graph, run_passes

TABLE = fake_table({*ELEMENTARY, "Sin", "Cos", "Exp", "Abs", "Neg"})
HALF_PI = np.pi / 2 + np.linspace(-1e-3, 1e-3, 101)


@pytest.mark.parametrize(
    ("op", "x", "ops", "tol"),
    [
        (
            "Tan",
            np.concatenate(
                [np.linspace(-2000, 2000, 40001), np.linspace(-3, 3, 6001), HALF_PI, [0.0, 1e-30]]
            ),
            {"Sin": 1, "Cos": 1, "Div": 1},
            4e-7,  # measured 2.8e-7
        ),
        (
            "Cosh",  # cosh is finite up to 89.4 (exp alone overflows at 88.7): no inf here
            np.concatenate(
                [np.linspace(-89.4, 89.4, 20001), np.linspace(-5, 5, 20001), [88.8, -89.0, 1e-30]]
            ),
            {"Abs": 1, "Mul": 4, "Exp": 2, "Neg": 1, "Add": 1},
            4e-7,  # measured 2.3e-7
        ),
    ],
)
def test_trig(op: str, x: np.ndarray, ops: dict[str, int], tol: float) -> None:
    x = x.astype(np.float32)
    m = text_model(f"g (float[{x.size}] x) => (float[{x.size}] y) {{ y = {op}(x) }}", 18, 9)
    g = load_onnx(m)
    run_passes(g, [FakeDecompose(fixed=TABLE)])
    assert op_counts(g) == ops
    assert not run_passes(g, [FakeDecompose(fixed=TABLE)]).changed
    ref = ort(m, {"x": x})["y"].astype(np.float64)
    got = ort_graph(g, {"x": x})["y"].astype(np.float64)
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(ref))
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), np.finfo(np.float32).tiny)
    assert float(rel.max()) <= tol, float(rel.max())


@pytest.mark.parametrize("op", ["Sinh", "Asinh", "Acosh", "Atanh"])
def test_cancelling_forms_have_no_rule(op: str) -> None:
    reasons, counts = refusals(text_model(f"g (float[4] x) => (float[4] y) {{ y = {op}(x) }}", 18, 9), TABLE)
    assert counts == {op: 1} and not reasons  # no rule, so no near-miss either


def test_tan_kept_when_native_and_refused_without_cos() -> None:
    m = text_model("g (float[4] x) => (float[4] y) { y = Tan(x) }", 18, 9)
    reasons, counts = refusals(m, fake_table({*ELEMENTARY, "Tan"}))
    assert counts == {"Tan": 1} and not reasons
    reasons, counts = refusals(m, fake_table({*ELEMENTARY, "Sin"}))
    assert counts == {"Tan": 1}
    assert any("tan-sin-cos: produces Cos, which fake cannot write" in r for r in reasons), reasons
