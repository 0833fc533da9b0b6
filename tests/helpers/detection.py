"""Face-detector post-processing in numpy: hard NMS (as UltraFace's ``box_utils.hard_nms``) and box matching.

Boxes are corner form ``[x1, y1, x2, y2]``. IoU(a, b) = |a ∩ b| / (|a| + |b| - |a ∩ b|) with
areas ``max(x2 - x1, 0) * max(y2 - y1, 0)``; it does not change when x and y are scaled, so
normalised and pixel boxes agree.
"""

from __future__ import annotations

import numpy as np

__all__ = ["iou", "hard_nms", "ultraface_faces", "match_boxes"]


def _area(b: np.ndarray) -> np.ndarray:
    return np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of boxes ``a`` [N, 4] and ``b`` [M, 4] -> [N, M] (float64)."""
    a = np.asarray(a, np.float64)[:, None, :]
    b = np.asarray(b, np.float64)[None, :, :]
    lt = np.maximum(a[..., :2], b[..., :2])
    rb = np.minimum(a[..., 2:], b[..., 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=-1)
    union = _area(a) + _area(b) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def hard_nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices kept by greedy NMS: best score first, dropping boxes with IoU > ``iou_threshold``."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    keep: list[int] = []
    while order.size:
        best = int(order[0])
        keep.append(best)
        rest = order[1:]
        if not rest.size:
            break
        order = rest[iou(boxes[best : best + 1], boxes[rest])[0] <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def ultraface_faces(
    scores: np.ndarray, boxes: np.ndarray, score_threshold: float = 0.7, iou_threshold: float = 0.3
) -> tuple[np.ndarray, np.ndarray]:
    """UltraFace's ``predict``: faces (class 1) with score > threshold after hard NMS.

    Args:
        scores: ``[1, N, 2]`` softmax scores (background, face).
        boxes: ``[1, N, 4]`` corner-form boxes.

    Returns:
        ``(boxes [K, 4], scores [K])`` of the kept faces, best first.
    """
    s = np.asarray(scores)[0, :, 1]
    b = np.asarray(boxes)[0]
    mask = s > score_threshold
    b, s = b[mask], s[mask]
    keep = hard_nms(b, s, iou_threshold)
    return b[keep], s[keep]


def match_boxes(ref: np.ndarray, got: np.ndarray, min_iou: float) -> list[float]:
    """Greedy one-to-one matching (reference order): each ref box's IoU with its best unused match.

    A reference box without a match at ``min_iou`` or more gets its best IoU anyway
    (possibly 0), so the caller can report it; the lists are equally long when every box matched.
    """
    used: set[int] = set()
    out: list[float] = []
    overlaps = iou(ref, got) if len(ref) and len(got) else np.zeros((len(ref), len(got)))
    for i in range(len(ref)):
        cand = [(overlaps[i, j], j) for j in range(len(got)) if j not in used]
        if not cand:
            out.append(0.0)
            continue
        best, j = max(cand)
        if best >= min_iou:
            used.add(j)
        out.append(float(best))
    return out
