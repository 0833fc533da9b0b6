"""Detection ops: NonMaxSuppression and RoiAlign.

NonMaxSuppression: per batch and class, boxes scoring above ``score_threshold``
are visited by descending score (ties: lower index first); a box is kept unless
its IoU with an already kept box of that class exceeds ``iou_threshold``, until
``max_output_boxes_per_class`` are kept. The output lists the kept
``[batch, class, box]`` triples (int64) by batch, class, then visit order; its
length is data-dependent, so its first dim is the symbol ``?``. Boxes are
``[y1, x1, y2, x2]`` (any two opposite corners) or, with ``center_point_box=1``,
``[x_center, y_center, width, height]``; IoU is computed in the boxes' dtype.

RoiAlign: each ROI ``[x1, y1, x2, y2]`` (times ``spatial_scale``, minus 1/2 for
``half_pixel``) is cut into output_height x output_width bins; each bin averages
(``avg``) or takes the max (``max``, of the four weighted bilinear taps) over a
grid of sampling_ratio² points (ceil(roi_size / output_size) per axis when 0).
Points more than one pixel outside the map count as 0; ``output_half_pixel``
(the opset-10 form) forces ROIs to at least 1x1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.inputs import arg, first
from compiler.ops.registry import InferContext, OpDef, register
from compiler.ops.shapes import UNKNOWN

__all__ = ["NonMaxSuppressionAttrs", "RoiAlignAttrs", "nms_selected"]


@dataclass(frozen=True)
class NonMaxSuppressionAttrs:
    """NonMaxSuppression: box encoding (0 = corners, 1 = center and size)."""

    center_point_box: int = 0


@dataclass(frozen=True)
class RoiAlignAttrs:
    """RoiAlign attributes (opset 16 form; opset 10 is ``output_half_pixel``)."""

    coordinate_transformation_mode: str = "half_pixel"
    mode: str = "avg"
    output_height: int = 1
    output_width: int = 1
    sampling_ratio: int = 0
    spatial_scale: float = 1.0


def _infer_nms(ctx: InferContext) -> list[TensorType]:
    if ctx.attrs.center_point_box not in (0, 1):
        raise ctx.fail(f"center_point_box must be 0 or 1, got {ctx.attrs.center_point_box}")
    b, s = ctx.type(0).shape, ctx.type(1).shape
    if b is not None and (len(b) != 3 or (isinstance(b[2], int) and b[2] != 4)):
        raise ctx.fail(f"boxes must be [batches, boxes, 4], got {b}")
    if s is not None and len(s) != 3:
        raise ctx.fail(f"scores must be [batches, classes, boxes], got {s}")
    return [TensorType(DType.INT64, (UNKNOWN, 3))]


def _corners(box: np.ndarray, center: bool) -> tuple[np.ndarray, ...]:
    """(x_min, x_max, y_min, y_max) of each box, in the boxes' dtype."""
    if center:
        hw, hh = box[:, 2] / box.dtype.type(2), box[:, 3] / box.dtype.type(2)
        return box[:, 0] - hw, box[:, 0] + hw, box[:, 1] - hh, box[:, 1] + hh
    return (
        np.minimum(box[:, 1], box[:, 3]),
        np.maximum(box[:, 1], box[:, 3]),
        np.minimum(box[:, 0], box[:, 2]),
        np.maximum(box[:, 0], box[:, 2]),
    )


def _suppressed(c: tuple[np.ndarray, ...], i: int, kept: list[int], thr: np.floating) -> bool:
    x0, x1, y0, y1 = c
    for j in kept:
        ix = min(x1[i], x1[j]) - max(x0[i], x0[j])
        iy = min(y1[i], y1[j]) - max(y0[i], y0[j])
        if ix <= 0 or iy <= 0:
            continue
        inter = ix * iy
        a1, a2 = (x1[i] - x0[i]) * (y1[i] - y0[i]), (x1[j] - x0[j]) * (y1[j] - y0[j])
        union = a1 + a2 - inter
        if inter <= 0 or a1 <= 0 or a2 <= 0 or union <= 0:
            continue
        if inter / union > thr:
            return True
    return False


def nms_selected(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_per_class: int,
    iou_threshold: float,
    score_threshold: float | None,
    center: bool,
) -> np.ndarray:
    """The ``[batch, class, box]`` triples NonMaxSuppression keeps (int64 [n, 3])."""
    out: list[tuple[int, int, int]] = []
    thr = boxes.dtype.type(iou_threshold)
    for b in range(boxes.shape[0]):
        c = _corners(boxes[b], center)
        for k in range(scores.shape[1]):
            s = scores[b, k]
            cand = np.arange(s.shape[0])
            if score_threshold is not None:
                cand = cand[s > s.dtype.type(score_threshold)]
            order = cand[np.lexsort((cand, -s[cand].astype(np.float64)))]
            kept: list[int] = []
            for i in order:
                if len(kept) >= max_per_class:
                    break
                if not _suppressed(c, int(i), kept, thr):
                    kept.append(int(i))
            out.extend((b, k, i) for i in kept)
    return np.asarray(out, dtype=np.int64).reshape(-1, 3)


def _scalar(x: np.ndarray | None) -> float | None:
    return None if x is None or np.asarray(x).size == 0 else float(np.asarray(x).reshape(-1)[0])


def _ref_nms(ins: list[np.ndarray | None], a: NonMaxSuppressionAttrs, n: int) -> list[np.ndarray]:
    boxes, scores = first(ins), np.asarray(arg(ins, 1))
    max_out = _scalar(arg(ins, 2))
    iou = _scalar(arg(ins, 3))
    sel = nms_selected(
        boxes,
        scores,
        int(max_out or 0),
        0.0 if iou is None else iou,
        _scalar(arg(ins, 4)),
        a.center_point_box == 1,
    )
    return [sel]


def _infer_roi_align(ctx: InferContext) -> list[TensorType]:
    a: RoiAlignAttrs = ctx.attrs
    if a.mode not in ("avg", "max"):
        raise ctx.fail(f"mode must be avg or max, got {a.mode!r}")
    if a.coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ctx.fail(f"unknown coordinate_transformation_mode {a.coordinate_transformation_mode!r}")
    if a.output_height < 1 or a.output_width < 1 or a.sampling_ratio < 0:
        raise ctx.fail("output_height/output_width must be >= 1 and sampling_ratio >= 0")
    t, r = ctx.type(0), ctx.type(1).shape
    if ctx.type(2).dtype not in (DType.INT64, DType.INT32):
        raise ctx.fail(f"batch_indices must be int64, got {ctx.type(2).dtype.short}")
    if t.shape is not None and len(t.shape) != 4:
        raise ctx.fail(f"X must be 4-D (NCHW), got {t.shape}")
    c = t.shape[1] if t.shape is not None else UNKNOWN
    num = r[0] if r is not None else UNKNOWN
    return [t.with_shape((num, c, a.output_height, a.output_width))]


def _bin_samples(start: np.floating, size: np.floating, bins: int, grid: int) -> np.ndarray:
    """Sample positions [bins, grid] in the ROI dtype: start + p·bin + (i + 1/2)·bin/grid."""
    t = type(start)
    bin_size = size / t(bins)
    p = np.arange(bins, dtype=start.dtype)[:, None]
    i = np.arange(grid, dtype=start.dtype)[None, :]
    return start + p * bin_size + (i + t(0.5)) * bin_size / t(grid)


def _taps(pos: np.ndarray, length: int) -> tuple[np.ndarray, ...]:
    """Low/high indices, their weights and the in-range mask of bilinear taps along one axis."""
    ok = (pos >= -1.0) & (pos <= length)
    p = np.maximum(pos, 0)
    low = np.floor(p).astype(np.int64)
    edge = low >= length - 1
    low = np.where(edge, length - 1, low)
    high = np.where(edge, length - 1, low + 1)
    p = np.where(edge, low, p)
    frac = (p - low).astype(np.float64)
    return low, high, 1.0 - frac, frac, ok


def _ref_roi_align(ins: list[np.ndarray | None], a: RoiAlignAttrs, n: int) -> list[np.ndarray]:
    x, rois, idx = first(ins), np.asarray(arg(ins, 1)), np.asarray(arg(ins, 2))
    oh, ow = a.output_height, a.output_width
    half = a.coordinate_transformation_mode == "half_pixel"
    y = np.zeros((rois.shape[0], x.shape[1], oh, ow), dtype=np.float64)
    dt = rois.dtype.type
    _, _, h, w = x.shape
    for r in range(rois.shape[0]):
        off = dt(0.5 if half else 0.0)
        x0, y0, x1, y1 = (v * dt(a.spatial_scale) - off for v in rois[r])
        rw, rh = x1 - x0, y1 - y0
        if not half:
            rw, rh = max(rw, dt(1)), max(rh, dt(1))
        gh = a.sampling_ratio or int(np.ceil(rh / dt(oh)))
        gw = a.sampling_ratio or int(np.ceil(rw / dt(ow)))
        ylo, yhi, wyl, wyh, oky = _taps(_bin_samples(y0, rh, oh, gh), h)  # [oh, gh]
        xlo, xhi, wxl, wxh, okx = _taps(_bin_samples(x0, rw, ow, gw), w)  # [ow, gw]
        ok = oky[:, :, None, None] & okx[None, None]
        plane = x[int(idx[r])].astype(np.float64)  # [C, H, W]
        parts = []
        for yi, wy in ((ylo, wyl), (yhi, wyh)):
            for xi, wx in ((xlo, wxl), (xhi, wxh)):
                wgt = np.where(ok, wy[:, :, None, None] * wx[None, None], 0.0)  # [oh, gh, ow, gw]
                vals = plane[:, yi[:, :, None, None], xi[None, None]]  # [C, oh, gh, ow, gw]
                parts.append(wgt * vals)
        if a.mode == "avg":
            y[r] = sum(parts).sum(axis=(2, 4)) / max(gh * gw, 1)
        else:
            y[r] = np.maximum.reduce(parts).max(axis=(2, 4))
    return [y.astype(x.dtype)]


register(
    OpDef(
        "NonMaxSuppression",
        _infer_nms,
        _ref_nms,
        NonMaxSuppressionAttrs,
        inputs=(2, 5),
        doc="selected [batch, class, box] triples (int64 [?, 3]) after greedy per-class IoU suppression",
    )
)
register(
    OpDef(
        "RoiAlign",
        _infer_roi_align,
        _ref_roi_align,
        RoiAlignAttrs,
        inputs=(3, 3),
        doc="y[r, c] = bilinear samples of X[batch_indices[r], c] in each ROI bin, averaged (avg) or max",
    )
)
