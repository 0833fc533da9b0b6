"""decompose: reduce-l1/l2/sum-square/log-sum/log-sum-exp and mean-add against onnxruntime.

Numerics: onnxruntime on the original model vs onnxruntime on Kiln's decomposed graph exported
back to ONNX; max|diff| <= TOL * max(1, max|ref|) per output, TOL stated per test (float32).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.decompose_check import ELEMENTARY, decompose_matches_ort, fake_table, refusals
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts

TABLE = fake_table({*ELEMENTARY, "ReduceSum", "ReduceMax", "Abs", "Log", "Exp"})
AXES = np.array([1, 2], np.int64)
X = rand(2, 5, 40, seed=1, scale=3.0)


def _reduce(op: str, keep: int, out: str, axes: bool = True, attrs: str = "") -> str:
    call = f"{op}<keepdims={keep}{attrs}>(x{', ax' if axes else ''})"
    return f"g (float[2,5,40] x) => (float{out} y) {{ y = {call} }}"


@pytest.mark.parametrize(
    ("op", "ops", "tol"),
    [
        ("ReduceL1", {"Abs": 1, "ReduceSum": 1}, 3e-7),  # measured 1.4e-7 (summation order)
        ("ReduceL2", {"Mul": 1, "ReduceSum": 1, "Sqrt": 1}, 4e-7),  # measured 1.9e-7
        ("ReduceSumSquare", {"Mul": 1, "ReduceSum": 1}, 1e-6),  # measured 4.7e-7
        ("ReduceLogSum", {"ReduceSum": 1, "Log": 1}, 0.0),  # bit-exact
        ("ReduceLogSumExp", {"ReduceMax": 1, "Sub": 1, "Exp": 1, "ReduceSum": 1, "Log": 1, "Add": 1}, 0.0),
    ],
)
@pytest.mark.parametrize(("keep", "out"), [(1, "[2,1,1]"), (0, "[2]")])
def test_reductions(op: str, ops: dict[str, int], tol: float, keep: int, out: str) -> None:
    x = np.abs(X) if op == "ReduceLogSum" else X
    m = text_model(_reduce(op, keep, out), 18, 9, ax=AXES)
    g = decompose_matches_ort(m, {"x": x}, max_rel=tol, table=TABLE)
    want = dict(ops)
    if op == "ReduceLogSumExp" and not keep:
        want["Squeeze"] = 1  # the max is squeezed to y's shape
    assert op_counts(g) == want


@pytest.mark.parametrize(("attrs", "out"), [("", ""), (", noop_with_empty_axes=1", "[2,5,40]")])
def test_log_sum_exp_all_axes_and_noop(attrs: str, out: str) -> None:
    """Absent axes reduce everything (the max squeezes to a scalar); with noop_with_empty_axes
    nothing is reduced: y = log(exp(x - x)) + x = x."""
    m = text_model(_reduce("ReduceLogSumExp", 0, out, axes=False, attrs=attrs), 18, 9)
    g = decompose_matches_ort(m, {"x": X * 30.0}, max_rel=0.0, table=TABLE)  # exp(x) overflows unshifted
    assert op_counts(g)["ReduceMax"] == 1 and op_counts(g).get("Squeeze", 0) == (0 if attrs else 1)


def test_reduce_l1_opset13_axes_attribute() -> None:
    text = "g (float[2,5,40] x) => (float[2,5] y) { y = ReduceL1<axes=[-1], keepdims=0>(x) }"
    g = decompose_matches_ort(text_model(text, 13, 8), {"x": X}, max_rel=3e-7, table=TABLE)  # measured 6e-8
    assert op_counts(g) == {"Abs": 1, "ReduceSum": 1}


def test_mean_broadcasts() -> None:
    text = "g (float[2,5,40] x, float[5,40] b, float[40] c) => (float[2,5,40] y) { y = Mean(x, b, c) }"
    feeds = {"x": X, "b": rand(5, 40, seed=2), "c": rand(40, seed=3)}
    g = decompose_matches_ort(text_model(text, 18, 9), feeds, max_rel=0.0, table=TABLE)  # bit-exact
    assert op_counts(g) == {"Add": 2, "Mul": 1}


def test_log_sum_exp_dynamic_axes_refused() -> None:
    text = "g (float[2,5,40] x, int64[2] ax) => (float[2] y) { y = ReduceLogSumExp<keepdims=0>(x, ax) }"
    reasons, counts = refusals(text_model(text, 18, 9), TABLE)
    assert counts == {"ReduceLogSumExp": 1}
    assert any("reduce-log-sum-exp: axes are not constant" in r for r in reasons), reasons


def test_reduce_l2_refused_for_int_and_kept_when_native() -> None:
    text = "g (int64[2,5,40] x) => (int64[2,1,1] y) { y = ReduceL2(x, ax) }"
    reasons, counts = refusals(text_model(text, 18, 9, ax=AXES), TABLE)
    assert counts == {"ReduceL2": 1} and any("reduce-l2: x is not float" in r for r in reasons), reasons
    native = fake_table({*ELEMENTARY, "ReduceL2"})
    reasons, counts = refusals(text_model(_reduce("ReduceL2", 1, "[2,1,1]"), 18, 9, ax=AXES), native)
    assert counts == {"ReduceL2": 1} and not reasons


def test_reduce_l1_refused_without_reduce_sum() -> None:
    reasons, counts = refusals(text_model(_reduce("ReduceL1", 1, "[2,1,1]"), 18, 9, ax=AXES), fake_table())
    assert counts == {"ReduceL1": 1}
    assert any("reduce-l1: produces Abs, which fake cannot write" in r for r in reasons), reasons


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_hardmax(axis: int) -> None:
    x = rand(2, 5, 7, seed=1)
    x[0, 1, 3] = x[0, 1, 5] = x[1, 2, 3] = 10.0  # ties along every axis: the first one wins
    text = f"g (float[2,5,7] x) => (float[2,5,7] y) {{ y = Hardmax<axis={axis}>(x) }}"
    table = fake_table({*ELEMENTARY, "ArgMax", "Equal"})
    g = decompose_matches_ort(text_model(text, 13, 8), {"x": x}, max_rel=0.0, table=table)  # bit-exact
    assert op_counts(g) == {"ArgMax": 1, "Equal": 1, "Cast": 1}


def test_hardmax_dynamic_axis_refused() -> None:
    text = "g (float[2,N] x) => (float[2,N] y) { y = Hardmax(x) }"
    reasons, counts = refusals(text_model(text, 13, 8), fake_table({*ELEMENTARY, "ArgMax", "Equal"}))
    assert counts == {"Hardmax": 1}
    assert any("hardmax-argmax: the size along axis is not static" in r for r in reasons), reasons
