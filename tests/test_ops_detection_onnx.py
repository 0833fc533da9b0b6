"""NonMaxSuppression and RoiAlign: Kiln vs onnxruntime.

NonMaxSuppression's selected indices must match exactly; its data-dependent
length is the symbol ``?`` in Kiln's type and a ``dim_param`` in the export.
RoiAlign within rtol 1e-6, atol 1e-6 (bilinear sums of standard-normal data,
outputs of order 1; ROI geometry is computed in float32 as onnxruntime does).
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.types import DType, TensorType
from compiler.ops.shapes import UNKNOWN
from frontends.onnx import load_onnx
from tests.helpers.ort_parity import check_parity, node_attrs, node_case, one_node_model

RNG = np.random.default_rng(0)
ROI_RTOL, ROI_ATOL = 1e-6, 1e-7

NMS_CASES = [
    "test_nonmaxsuppression_center_point_box_format",
    "test_nonmaxsuppression_flipped_coordinates",
    "test_nonmaxsuppression_identical_boxes",
    "test_nonmaxsuppression_iou_threshold_boundary",
    "test_nonmaxsuppression_limit_output_size",
    "test_nonmaxsuppression_single_box",
    "test_nonmaxsuppression_suppress_by_IOU",
    "test_nonmaxsuppression_suppress_by_IOU_and_scores",
    "test_nonmaxsuppression_two_batches",
    "test_nonmaxsuppression_two_classes",
]


@pytest.mark.parametrize("name", NMS_CASES)
def test_nms_node_case(name: str) -> None:
    model, feeds = node_case(name)
    check_parity(model, feeds, rtol=0, atol=0)


def _boxes(b: int, n: int, center: bool) -> np.ndarray:
    xy = RNG.uniform(0, 10, (b, n, 2))
    wh = RNG.uniform(0.5, 4, (b, n, 2))
    if center:
        return np.concatenate([xy, wh], -1).astype(np.float32)
    flip = RNG.random((b, n, 1)) < 0.3  # some boxes give their corners in the other order
    a, c = xy[..., ::-1], xy[..., ::-1] + wh[..., ::-1]
    return np.where(flip, np.concatenate([c, a], -1), np.concatenate([a, c], -1)).astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize(
    ("max_out", "iou", "score"), [(3, 0.5, 0.2), (50, 0.3, None), (50, 0.0, 0.5), (0, 0.5, None)]
)
def test_nms_random(center: int, max_out: int, iou: float, score: float | None) -> None:
    boxes = _boxes(2, 40, bool(center))
    scores = RNG.random((2, 3, 40)).astype(np.float32)
    scores[0, 0, :4] = scores[0, 0, 4]  # ties: the lower index goes first
    ins = [
        ("boxes", boxes),
        ("scores", scores),
        ("max_out", np.asarray([max_out], np.int64)),
        ("iou", np.asarray([iou], np.float32)),
        ("score", None if score is None else np.asarray([score], np.float32)),
    ]
    model, feeds = one_node_model(
        "NonMaxSuppression",
        ins,
        {"center_point_box": center},
        opset=11,
        initializers=["max_out", "iou", "score"],
    )
    p = check_parity(model, feeds, rtol=0, atol=0)
    assert node_attrs(p.exported, "NonMaxSuppression") == ({"center_point_box": 1} if center else {})
    out = p.exported.graph.output[0].type.tensor_type.shape.dim
    assert out[0].dim_param == UNKNOWN and out[1].dim_value == 3


def test_nms_output_type_is_symbolic() -> None:
    model, _ = node_case("test_nonmaxsuppression_two_classes")
    graph = load_onnx(model)
    assert graph.outputs[0].type == TensorType(DType.INT64, (UNKNOWN, 3))


def test_nms_without_optional_inputs_selects_nothing() -> None:
    """max_output_boxes_per_class defaults to 0: an empty [0, 3] result."""
    model, feeds = one_node_model(
        "NonMaxSuppression",
        [("boxes", _boxes(1, 5, False)), ("scores", RNG.random((1, 2, 5)).astype(np.float32))],
        opset=10,
    )
    check_parity(model, feeds, rtol=0, atol=0)


def _rois(n: int, h: int, w: int, scale: float) -> np.ndarray:
    x0 = RNG.uniform(-2, w / scale, (n, 1))
    y0 = RNG.uniform(-2, h / scale, (n, 1))
    size = RNG.uniform(0.2, 12, (n, 2))
    return np.concatenate([x0, y0, x0 + size[:, :1], y0 + size[:, 1:]], 1).astype(np.float32)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align_16(mode: str, ctm: str, sampling_ratio: int) -> None:
    x = RNG.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = _rois(6, 10, 12, 0.5)
    idx = RNG.integers(0, 2, 6).astype(np.int64)
    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": ctm,
        "output_height": 3,
        "output_width": 4,
        "sampling_ratio": sampling_ratio,
        "spatial_scale": 0.5,
    }
    model, feeds = one_node_model("RoiAlign", [("x", x), ("rois", rois), ("idx", idx)], attrs, opset=16)
    p = check_parity(model, feeds, rtol=ROI_RTOL, atol=ROI_ATOL)
    defaults = {"mode": "avg", "coordinate_transformation_mode": "half_pixel", "sampling_ratio": 0}
    want = {k: (v.encode() if isinstance(v, str) else v) for k, v in attrs.items() if defaults.get(k) != v}
    assert node_attrs(p.exported, "RoiAlign") == want
    assert load_onnx(model).outputs[0].type == TensorType(DType.FLOAT32, (6, 3, 3, 4))


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_10_is_output_half_pixel(mode: str) -> None:
    x = RNG.standard_normal((1, 2, 8, 8)).astype(np.float32)
    rois = _rois(4, 8, 8, 1.0)
    idx = np.zeros(4, np.int64)
    attrs = {"mode": mode, "output_height": 2, "output_width": 2, "sampling_ratio": 3}
    model, feeds = one_node_model("RoiAlign", [("x", x), ("rois", rois), ("idx", idx)], attrs, opset=10)
    p = check_parity(model, feeds, rtol=ROI_RTOL, atol=ROI_ATOL)
    assert node_attrs(p.exported, "RoiAlign")["coordinate_transformation_mode"] == b"output_half_pixel"
