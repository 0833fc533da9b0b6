"""decompose: isinf-equal and cast-like against onnxruntime (both bit-exact: TOL = 0)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.decompose_check import ELEMENTARY, decompose_matches_ort, fake_table, refusals
from tests.helpers.onnx_text import text_model
from tests.helpers.pass_check import op_counts

TABLE = fake_table({*ELEMENTARY, "Abs", "Equal"})
X = np.array([np.inf, -np.inf, np.nan, 0.0, 1.0, -1.0, 3.4e38, -3.4e38], np.float32)


@pytest.mark.parametrize(
    ("attrs", "ops"),
    [
        ("", {"Abs": 1, "Equal": 1}),
        ("<detect_negative=0>", {"Equal": 1}),
        ("<detect_positive=0>", {"Equal": 1}),
    ],
)
def test_isinf(attrs: str, ops: dict[str, int]) -> None:
    m = text_model(f"g (float[8] x) => (bool[8] y) {{ y = IsInf{attrs}(x) }}", 18, 9)
    g = decompose_matches_ort(m, {"x": X}, max_rel=0.0, table=TABLE)
    assert op_counts(g) == ops


def test_isinf_detecting_nothing_refused() -> None:
    m = text_model(
        "g (float[8] x) => (bool[8] y) { y = IsInf<detect_negative=0, detect_positive=0>(x) }", 18, 9
    )
    reasons, counts = refusals(m, TABLE)
    assert counts == {"IsInf": 1} and any("detects neither infinity" in r for r in reasons), reasons


def test_cast_like() -> None:
    m = text_model("g (float[8] x, int32[2] t) => (int32[8] y) { y = CastLike(x, t) }", 19, 9)
    feeds = {"x": np.array([1.5, -2.7, 3, 0, 100.9, -0.2, 7, 8], np.float32), "t": np.zeros(2, np.int32)}
    g = decompose_matches_ort(m, feeds, max_rel=0.0, table=TABLE)
    assert op_counts(g) == {"Cast": 1}


def test_cast_like_kept_when_native() -> None:
    m = text_model("g (float[8] x, int32[2] t) => (int32[8] y) { y = CastLike(x, t) }", 19, 9)
    reasons, counts = refusals(m, fake_table({*ELEMENTARY, "CastLike"}))
    assert counts == {"CastLike": 1} and not reasons
