"""decompose: shape/size/eyelike-static (constants from a static shape) and
constant-of-shape-expand against onnxruntime (bit-exact: TOL = 0)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.decompose_check import ELEMENTARY, decompose_matches_ort, fake_table, refusals
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts

X = rand(2, 5, 7, seed=1)


@pytest.mark.parametrize(
    ("body", "out", "x"),
    [
        ("Shape(x)", "int64[3]", X),
        ("Shape<start=-2, end=-1>(x)", "int64[1]", X),
        ("Size(x)", "int64", X),
        ("EyeLike<k=1>(x)", "float[5,7]", X[0]),
        ("EyeLike<k=-2, dtype=6>(x)", "int32[5,7]", X[0]),
    ],
)
def test_static_values(body: str, out: str, x: np.ndarray) -> None:
    shape = ",".join(map(str, x.shape))
    m = text_model(f"g (float[{shape}] x) => ({out} y) {{ y = {body} }}", 15, 8)
    g = decompose_matches_ort(m, {"x": x}, max_rel=0.0, table=fake_table())
    assert sum(op_counts(g).values()) == 0  # a constant, no op left


def test_shape_of_dynamic_refused() -> None:
    reasons, counts = refusals(text_model("g (float[N,5] x) => (int64[2] y) { y = Shape(x) }", 15, 8))
    assert counts == {"Shape": 1}
    assert any("shape-static: shape of x is not static" in r for r in reasons), reasons


def test_constant_of_shape_expand() -> None:
    text = "g (int64[3] s) => (float[2,5,7] y) { y = ConstantOfShape<value=float[1] {2.5}>(s) }"
    feeds = {"s": np.array([2, 5, 7], np.int64)}
    g = decompose_matches_ort(
        text_model(text, 15, 8), feeds, max_rel=0.0, table=fake_table([*ELEMENTARY, "Expand"])
    )
    assert op_counts(g) == {"Expand": 1}
