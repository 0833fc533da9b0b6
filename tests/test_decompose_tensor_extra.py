"""decompose: depth-to-space / space-to-depth, trilu-where / trilu-mask-mul and einsum-matmul
against onnxruntime. All are data movement or MatMul regroupings: bit-exact (TOL = 0) here.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.decompose_check import ELEMENTARY, decompose_matches_ort, fake_table, refusals
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, ort_graph

MOVE = fake_table({*ELEMENTARY, "Reshape", "Transpose", "MatMul"})


@pytest.mark.parametrize(
    ("op", "out"),
    [
        ("DepthToSpace<blocksize=2>", "[2,2,12,20]"),
        ('DepthToSpace<blocksize=2, mode="CRD">', "[2,2,12,20]"),
        ("SpaceToDepth<blocksize=2>", "[2,32,3,5]"),
    ],
)
def test_space_depth(op: str, out: str) -> None:
    text = f"g (float[2,8,6,10] x) => (float{out} y) {{ y = {op}(x) }}"
    g = decompose_matches_ort(
        text_model(text, 13, 8), {"x": rand(2, 8, 6, 10, seed=4)}, max_rel=0.0, table=MOVE
    )
    assert op_counts(g) == {"Reshape": 2, "Transpose": 1}


def test_space_depth_dynamic_batch() -> None:
    """Reshape's 0 copies N, so only C, H, W must be static."""
    text = "g (float[N,8,6,10] x) => (float[N,2,12,20] y) { y = DepthToSpace<blocksize=2>(x) }"
    g = decompose_matches_ort(
        text_model(text, 13, 8), {"x": rand(3, 8, 6, 10, seed=5)}, max_rel=0.0, table=MOVE
    )
    assert op_counts(g) == {"Reshape": 2, "Transpose": 1}


def test_space_depth_dynamic_hw_refused() -> None:
    text = "g (float[1,8,H,W] x) => (float[1,2,?,?] y) { y = DepthToSpace<blocksize=2>(x) }"
    reasons, counts = refusals(text_model(text.replace("?", "H2"), 13, 8), MOVE)
    assert counts == {"DepthToSpace": 1}
    assert any("depth-to-space: C, H or W is not static" in r for r in reasons), reasons


TRI = "g (float[2,5,7] x) => (float[2,5,7] y) {{ y = Trilu<upper={u}>(x, k) }}"


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-1, 0, 2])
@pytest.mark.parametrize(
    ("table", "op"), [(fake_table({*ELEMENTARY, "Where"}), "Where"), (fake_table(), "Mul")]
)
def test_trilu(upper: int, k: int, table: object, op: str) -> None:
    m = text_model(TRI.format(u=upper), 14, 8, k=np.array(k, np.int64))
    g = decompose_matches_ort(m, {"x": rand(2, 5, 7, seed=6)}, max_rel=0.0, table=table)  # type: ignore[arg-type]
    assert op_counts(g) == {op: 1}


def test_trilu_where_keeps_inf_outside_the_band_zero() -> None:
    """trilu-where gives 0 for an inf below the band (the mask product would give NaN)."""
    x = np.full((1, 3, 3), np.inf, np.float32)
    text = "g (float[1,3,3] x) => (float[1,3,3] y) { y = Trilu(x) }"
    g = decompose_matches_ort(
        text_model(text, 14, 8), {"x": np.ones_like(x)}, max_rel=0.0, table=fake_table(["Where"])
    )
    y = ort_graph(g, {"x": x})["y"]
    np.testing.assert_array_equal(y[0], np.triu(np.full((3, 3), np.inf, np.float32)))


def test_trilu_dynamic_k_refused() -> None:
    text = "g (float[2,5,7] x, int64 k) => (float[2,5,7] y) { y = Trilu(x, k) }"
    reasons, counts = refusals(text_model(text, 14, 8), fake_table({*ELEMENTARY, "Where"}))
    assert counts == {"Trilu": 1}
    assert any("trilu-where: k is not a constant scalar" in r for r in reasons), reasons


EINSUM_CASES = [
    ("bhqd,bhkd->bhqk", (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 4, 5), {"Transpose": 1, "MatMul": 1}),
    ("bij,bjk->bik", (2, 4, 6), (2, 6, 5), (2, 4, 5), {"MatMul": 1}),
    ("...ij,...jk->...ik", (2, 3, 4, 6), (2, 3, 6, 5), (2, 3, 4, 5), {"MatMul": 1}),
    ("bnd,dk->bnk", (2, 4, 6), (6, 5), (2, 4, 5), {"Reshape": 2, "MatMul": 1}),
    ("bqhd,bkhd->bhqk", (2, 4, 3, 8), (2, 5, 3, 8), (2, 3, 4, 5), {"Transpose": 2, "MatMul": 1}),
    ("abcd,cde->abe", (2, 3, 4, 5), (4, 5, 6), (2, 3, 6), {"Reshape": 3, "MatMul": 1}),
    ("i,j->ij", (4,), (5,), (4, 5), {"Reshape": 2, "MatMul": 1}),
    ("...d,...d->...", (2, 3, 8), (2, 3, 8), (2, 3), {"Reshape": 3, "MatMul": 1}),
    ("bij,jk", (2, 4, 6), (6, 5), (2, 4, 5), {"Reshape": 2, "MatMul": 1}),
]


def _einsum(eq: str, sa: tuple[int, ...], sb: tuple[int, ...], so: tuple[int, ...]) -> str:
    def t(s: tuple[int, ...]) -> str:
        return ",".join(map(str, s))

    return f'g (float[{t(sa)}] a, float[{t(sb)}] b) => (float[{t(so)}] y) {{ y = Einsum<equation="{eq}">(a, b) }}'


@pytest.mark.parametrize(("eq", "sa", "sb", "so", "ops"), EINSUM_CASES)
def test_einsum(
    eq: str, sa: tuple[int, ...], sb: tuple[int, ...], so: tuple[int, ...], ops: dict[str, int]
) -> None:
    feeds = {"a": rand(*sa, seed=1), "b": rand(*sb, seed=2)}
    g = decompose_matches_ort(text_model(_einsum(eq, sa, sb, so), 12, 8), feeds, max_rel=0.0, table=MOVE)
    assert op_counts(g) == ops


@pytest.mark.parametrize(
    ("eq", "sa", "sb", "so", "why"),
    [
        ("bij,bjk->bik", (2, 4, 6), (1, 6, 5), (2, 4, 5), "has sizes 2 and 1 (a broadcast)"),
        ("iij,jk->ik", (4, 4, 6), (6, 5), (4, 5), "repeats within one term"),
        ("ij,jk->k", (4, 6), (6, 5), (5,), "label 'i' is summed in one operand only"),
    ],
)
def test_einsum_refused(
    eq: str, sa: tuple[int, ...], sb: tuple[int, ...], so: tuple[int, ...], why: str
) -> None:
    reasons, counts = refusals(text_model(_einsum(eq, sa, sb, so), 12, 8), MOVE)
    assert counts == {"Einsum": 1} and any(why in r for r in reasons), reasons


def test_einsum_one_operand_refused() -> None:
    text = 'g (float[4,5] a) => (float[5,4] y) { y = Einsum<equation="ij->ji">(a) }'
    reasons, counts = refusals(text_model(text, 12, 8), MOVE)
    assert counts == {"Einsum": 1} and any("1 operands, not 2" in r for r in reasons), reasons
