"""ScatterND, ScatterElements, GatherND, CumSum, OneHot and Trilu: Kiln vs onnxruntime.

Index and integer results must match exactly; float reductions (add/mul
scatters, CumSum) within rtol 1e-6 (Kiln sums in the same order as ORT).
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.types import DType, TensorType
from compiler.ops.shapes import UNKNOWN
from frontends.onnx import load_onnx
from tests.helpers.ort_parity import check_parity, node_attrs, node_case, one_node_model

RTOL, ATOL = 1e-6, 1e-7

NODE_CASES = [
    "test_scatternd",
    "test_scatternd_add",
    "test_scatternd_multiply",
    "test_scatternd_max",
    "test_scatternd_min",
    "test_scatternd_max_with_element_indices",
    "test_scatternd_min_with_element_indices",
    "test_scatter_elements_with_axis",
    "test_scatter_elements_with_negative_indices",
    "test_scatter_elements_with_duplicate_indices",
    "test_scatter_elements_with_reduction_max",
    "test_scatter_elements_with_reduction_min",
    "test_scatter_elements_with_reduction_mul",
    "test_scatter_elements_without_axis",
    "test_scatter_with_axis",
    "test_scatter_without_axis",
    "test_gathernd_example_float32",
    "test_gathernd_example_int32",
    "test_gathernd_example_int32_batch_dim1",
    "test_cumsum_1d",
    "test_cumsum_1d_exclusive",
    "test_cumsum_1d_reverse",
    "test_cumsum_1d_reverse_exclusive",
    "test_cumsum_1d_int32_exclusive",
    "test_cumsum_2d_axis_0",
    "test_cumsum_2d_axis_1",
    "test_cumsum_2d_int32",
    "test_cumsum_2d_negative_axis",
    "test_onehot_without_axis",
    "test_onehot_with_axis",
    "test_onehot_negative_indices",
    "test_onehot_out_of_range_indices",
    "test_onehot_with_negative_axis",
    "test_tril",
    "test_tril_neg",
    "test_tril_one_row_neg",
    "test_tril_out_neg",
    "test_tril_out_pos",
    "test_tril_zero",
    "test_triu",
    "test_triu_neg",
    "test_triu_one_row",
    "test_triu_out_pos",
    "test_triu_square_neg",
    "test_triu_zero",
]


@pytest.mark.parametrize("name", NODE_CASES)
def test_onnx_node_case(name: str) -> None:
    model, feeds = node_case(name)
    check_parity(model, feeds, rtol=RTOL, atol=ATOL)


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_scatternd_reductions_and_slices(reduction: str, k: int) -> None:
    data = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    n = 7 if reduction != "none" else 3
    idx = np.stack([RNG.integers(-d, d, n) for d in data.shape[:k]], -1).astype(np.int64)
    if reduction == "none":  # duplicates are undefined without a reduction
        idx = np.unique(np.where(idx < 0, idx + np.asarray(data.shape[:k]), idx), axis=0)
    upd = RNG.standard_normal((idx.shape[0], *data.shape[k:])).astype(np.float32)
    opset = 18 if reduction in ("max", "min") else 16
    model, feeds = one_node_model(
        "ScatterND", [("data", data), ("idx", idx), ("upd", upd)], {"reduction": reduction}, opset=opset
    )
    p = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    assert node_attrs(p.exported, "ScatterND") == (
        {} if reduction == "none" else {"reduction": reduction.encode()}
    )


def test_scatternd_convit_form() -> None:
    """convit_tiny: a constant zero tensor updated at constant index rows by computed values."""
    data = np.zeros((1, 4, 4, 3), dtype=np.float32)
    idx = np.asarray([[[[0, i, j, 2] for j in range(4)] for i in range(4)]], dtype=np.int64)
    upd = RNG.standard_normal((1, 4, 4)).astype(np.float32)
    model, feeds = one_node_model(
        "ScatterND", [("data", data), ("idx", idx), ("upd", upd)], opset=11, initializers=["data", "idx"]
    )
    check_parity(model, feeds, rtol=0, atol=0)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_int(reduction: str, axis: int) -> None:
    data = RNG.integers(-9, 9, (3, 4, 5)).astype(np.int32)
    d = data.shape[axis]
    shape = list(data.shape)
    shape[axis] = 2
    if reduction == "none":  # one writer per target: distinct indices along the axis, some negative
        distinct = np.take(np.argsort(RNG.random(data.shape), axis=axis), [0, 1], axis=axis)
        idx = (distinct - d * (RNG.random(shape) < 0.5)).astype(np.int64)
    else:
        idx = RNG.integers(-d, d, shape).astype(np.int64)
    upd = RNG.integers(-9, 9, idx.shape).astype(np.int32)
    model, feeds = one_node_model(
        "ScatterElements",
        [("data", data), ("idx", idx), ("upd", upd)],
        {"axis": axis, "reduction": reduction},
        opset=18,
    )
    check_parity(model, feeds, rtol=0, atol=0)


@pytest.mark.parametrize("batch_dims", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 2])
def test_gathernd_batch_dims(batch_dims: int, k: int) -> None:
    data = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    lead = data.shape[:batch_dims]
    tail = data.shape[batch_dims : batch_dims + k]
    idx = np.stack([RNG.integers(-d, d, (*lead, 3)) for d in tail], -1).astype(np.int64)
    model, feeds = one_node_model(
        "GatherND", [("data", data), ("idx", idx)], {"batch_dims": batch_dims}, opset=13
    )
    p = check_parity(model, feeds, rtol=0, atol=0)
    graph = load_onnx(model)
    assert graph.outputs[0].type.shape == (*lead, 3, *data.shape[batch_dims + k :])
    assert node_attrs(p.exported, "GatherND") == ({"batch_dims": batch_dims} if batch_dims else {})


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumsum_flags(exclusive: int, reverse: int, dtype: type) -> None:
    x: np.ndarray = (RNG.standard_normal((3, 4, 5)) * 5).astype(dtype)
    for axis in (0, 2, -2):
        ax = np.asarray(axis, dtype=np.int32)
        model, feeds = one_node_model(
            "CumSum", [("x", x), ("axis", ax)], {"exclusive": exclusive, "reverse": reverse}, opset=14
        )
        check_parity(model, feeds, rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot_depth_constant_and_dynamic(axis: int) -> None:
    idx = RNG.integers(-6, 8, (3, 4)).astype(np.int64)
    depth = np.asarray(6, dtype=np.int64)
    values = np.asarray([-1.5, 2.0], dtype=np.float32)
    ins: list[tuple[str, np.ndarray | None]] = [("idx", idx), ("depth", depth), ("values", values)]
    const, _ = one_node_model("OneHot", ins, {"axis": axis}, opset=11, initializers=["depth"])
    dynamic, feeds = one_node_model("OneHot", ins, {"axis": axis}, opset=9)
    check_parity(const, {"idx": idx, "values": values}, rtol=0, atol=0)
    check_parity(dynamic, feeds, rtol=0, atol=0)
    want: list[int | str] = [3, 4]
    want.insert(axis % 3, 6)
    assert load_onnx(const).outputs[0].type == TensorType(DType.FLOAT32, tuple(want))
    want[axis % 3] = UNKNOWN
    assert load_onnx(dynamic).outputs[0].type == TensorType(DType.FLOAT32, tuple(want))


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -2, 0, 3])
def test_trilu_batched(upper: int, k: int | None) -> None:
    x = RNG.integers(1, 9, (2, 3, 4, 6)).astype(np.int64)
    ins = [("x", x), ("k", None if k is None else np.asarray(k, dtype=np.int64))]
    model, feeds = one_node_model("Trilu", ins, {"upper": upper}, opset=14)
    p = check_parity(model, feeds, rtol=0, atol=0)
    assert node_attrs(p.exported, "Trilu") == ({} if upper else {"upper": 0})
