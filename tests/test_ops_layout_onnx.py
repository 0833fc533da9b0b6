"""DepthToSpace, SpaceToDepth, GridSample and Einsum: Kiln vs onnxruntime.

Data movement (DepthToSpace, SpaceToDepth) must be exact; GridSample (all modes)
and Einsum within rtol 1e-6, atol 1e-7 (GridSample computes coordinates and
weights in float32 as onnxruntime does, so only the summation order differs).
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.types import DType, TensorType
from frontends.onnx import load_onnx
from tests.helpers.ort_parity import check_parity, node_attrs, node_case, one_node_model

RTOL, ATOL = 1e-6, 1e-7

NODE_CASES = [
    "test_depthtospace_example",
    "test_depthtospace_crd_mode_example",
    "test_spacetodepth",
    "test_spacetodepth_example",
    "test_gridsample",
    "test_gridsample_aligncorners_true",
    "test_gridsample_bilinear",
    "test_gridsample_border_padding",
    "test_gridsample_reflection_padding",
    "test_gridsample_zeros_padding",
    "test_gridsample_nearest",
    "test_gridsample_nearest_align_corners_0_additional_1",
    "test_gridsample_nearest_align_corners_1_additional_1",
    "test_gridsample_bilinear_align_corners_0_additional_1",
    "test_gridsample_bilinear_align_corners_1_additional_1",
    "test_gridsample_volumetric_bilinear_align_corners_0",
    "test_gridsample_volumetric_bilinear_align_corners_1",
    "test_gridsample_volumetric_nearest_align_corners_0",
    "test_gridsample_volumetric_nearest_align_corners_1",
    "test_gridsample_bicubic",
    "test_gridsample_bicubic_align_corners_0_additional_1",
    "test_gridsample_bicubic_align_corners_1_additional_1",
    "test_einsum_batch_diagonal",
    "test_einsum_batch_matmul",
    "test_einsum_inner_prod",
    "test_einsum_scalar",
    "test_einsum_sum",
    "test_einsum_transpose",
]

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("name", NODE_CASES)
def test_onnx_node_case(name: str) -> None:
    model, feeds = node_case(name)
    check_parity(model, feeds, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("blocksize", [2, 3])
def test_depth_to_space_round_trip(mode: str, blocksize: int) -> None:
    x = RNG.standard_normal((2, 2 * blocksize * blocksize, 3, 4)).astype(np.float32)
    model, feeds = one_node_model(
        "DepthToSpace", [("x", x)], {"blocksize": blocksize, "mode": mode}, opset=13
    )
    p = check_parity(model, feeds, rtol=0, atol=0)
    assert node_attrs(p.exported, "DepthToSpace") == {
        "blocksize": blocksize,
        **({"mode": b"CRD"} if mode == "CRD" else {}),
    }
    assert load_onnx(model).outputs[0].type == TensorType(DType.FLOAT32, (2, 2, 3 * blocksize, 4 * blocksize))
    s2d, feeds = one_node_model(
        "SpaceToDepth",
        [("x", x.reshape(2, 2, 3 * blocksize, 4 * blocksize))],
        {"blocksize": blocksize},
        opset=13,
    )
    check_parity(s2d, feeds, rtol=0, atol=0)


def test_depth_to_space_opset_9_has_no_mode() -> None:
    x = RNG.standard_normal((1, 8, 2, 3)).astype(np.float32)
    model, feeds = one_node_model("DepthToSpace", [("x", x)], {"blocksize": 2}, opset=9)
    check_parity(model, feeds, rtol=0, atol=0)


def _grid(n: int, out: tuple[int, ...], spread: float) -> np.ndarray:
    return RNG.uniform(-spread, spread, (n, *out, len(out))).astype(np.float32)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_20(mode: str, padding_mode: str, align_corners: int) -> None:
    x = RNG.standard_normal((2, 3, 5, 7)).astype(np.float32)
    grid = _grid(2, (4, 6), 1.6)  # a third of the points fall outside [-1, 1]
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    model, feeds = one_node_model("GridSample", [("x", x), ("grid", grid)], attrs, opset=20)
    p = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    want = {k: (v.encode() if isinstance(v, str) else v) for k, v in attrs.items()}
    want = {k: v for k, v in want.items() if v not in (b"linear", b"zeros", 0)}
    assert node_attrs(p.exported, "GridSample") == want


@pytest.mark.parametrize(
    ("mode16", "mode20"), [("bilinear", "linear"), ("nearest", "nearest"), ("bicubic", "cubic")]
)
def test_grid_sample_16_modes(mode16: str, mode20: str) -> None:
    x = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    grid = _grid(1, (5, 3), 1.2)
    model, feeds = one_node_model("GridSample", [("x", x), ("grid", grid)], {"mode": mode16}, opset=16)
    p = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    assert node_attrs(p.exported, "GridSample") == ({} if mode20 == "linear" else {"mode": mode20.encode()})


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_volumetric(mode: str) -> None:
    x = RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    grid = _grid(1, (2, 3, 4), 1.3)
    model, feeds = one_node_model(
        "GridSample", [("x", x), ("grid", grid)], {"mode": mode, "padding_mode": "border"}, opset=20
    )
    check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    assert load_onnx(model).outputs[0].type == TensorType(DType.FLOAT32, (1, 2, 2, 3, 4))


EQUATIONS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ii->i", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,j->ij", [(3,), (5,)]),
    ("ijk", [(2, 3, 4)]),
    ("kji", [(2, 3, 4)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)]),
    ("b...c, b...c -> b...", [(2, 3, 4), (2, 3, 4)]),
]


@pytest.mark.parametrize(("equation", "shapes"), EQUATIONS)
def test_einsum_equations(equation: str, shapes: list[tuple[int, ...]]) -> None:
    # positive operands: no cancellation, so float32 sums stay within 1e-6 of the float64 ones
    ins = [(f"x{i}", RNG.uniform(0.5, 1.5, s).astype(np.float32)) for i, s in enumerate(shapes)]
    model, feeds = one_node_model("Einsum", ins, {"equation": equation}, opset=12)
    p = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    want = np.einsum(equation.replace(" ", ""), *(x for _, x in ins)).shape
    assert load_onnx(model).outputs[0].type == TensorType(DType.FLOAT32, want)
    assert node_attrs(p.exported, "Einsum") == {"equation": equation.encode()}


def test_einsum_int64_exact() -> None:
    a, b = RNG.integers(-5, 5, (3, 4)).astype(np.int64), RNG.integers(-5, 5, (4, 2)).astype(np.int64)
    model, feeds = one_node_model("Einsum", [("a", a), ("b", b)], {"equation": "ij,jk->ik"}, opset=12)
    check_parity(model, feeds, rtol=0, atol=0)


def test_einsum_rejects_a_bad_equation() -> None:
    from compiler.errors import ConversionError

    x = np.ones((2, 3), np.float32)
    model, _ = one_node_model("Einsum", [("x", x)], {"equation": "ij,jk->ik"}, opset=12)
    with pytest.raises(ConversionError, match="2 input terms for 1 inputs"):
        load_onnx(model)
