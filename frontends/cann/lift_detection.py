"""Lifter of GE's ``NonMaxSuppressionV6``, the inverse of ``backends/cann/lower_detection.py``.

``NonMaxSuppressionV6(boxes, scores, max_output_size, iou_threshold[, score_threshold])`` with
constant one-element operands becomes ``Cast(NonMaxSuppression(...), int32)``: ONNX's selection
(int64 ``[?, 3]``) in the int32 the GE op outputs. The file's ``[M, 3]`` descriptor is the static
bound of the data-dependent dim; ``max_boxes_size``, when present, must equal M, and M must be the
bound ``B·C·min(max_output_size, N)`` of the op's inputs.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from frontends.cann.lift import Lifter, LiftError, lifter
from schemas.cann.om_graph import OmOp

__all__: list[str] = []

_OPERANDS = ("max_output_size", "iou_threshold", "score_threshold")


def _scalar(lf: Lifter, op: OmOp, port: int, kind: str) -> np.ndarray:
    c = lf.const(op, port, _OPERANDS[port - 2])
    if c.size != 1 or c.dtype.kind not in kind:
        raise LiftError(f"{_OPERANDS[port - 2]} must be one {'integer' if kind == 'iu' else 'float'}")
    return c.reshape(1)


@lifter("NonMaxSuppressionV6")
def _nms(lf: Lifter, op: OmOp) -> Value:
    if len(op.inputs) not in (4, 5):
        raise LiftError(f"Kiln reads NonMaxSuppressionV6 with 4 or 5 inputs, not {len(op.inputs)}")
    boxes, scores = (lf.value(r) for r in op.inputs[:2])
    if boxes is None or scores is None or scores.type.rank != 3:
        raise LiftError("boxes and scores [B, C, N] are required")
    k = int(_scalar(lf, op, 2, "iu")[0])
    b, c, n = scores.type.static_shape
    bound = b * c * min(k, n)
    m = op.outputs[0].shape[0] if op.outputs[0].shape else None
    if m != bound or lf.attr(op, "max_boxes_size", "i", bound) != bound:
        raise LiftError(f"selected_indices has {m} rows and max_boxes_size, not the bound {bound}")
    ins = [boxes, scores, lf.g.add_constant(np.array([k], np.int64), f"{op.name}/max_output_size")]
    for port in (3, 4):
        if port < len(op.inputs):
            v = _scalar(lf, op, port, "f").astype(np.float32)
            ins.append(lf.g.add_constant(v, f"{op.name}/{_OPERANDS[port - 2]}"))
    center = lf.attr(op, "center_point_box", "i", 0)
    sel = lf.node("NonMaxSuppression", ins, {"center_point_box": center}, f"{op.name}/selected")
    return lf.node("Cast", [sel], {"to": int(DType.INT32)}, op.name)
