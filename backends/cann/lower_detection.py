"""Lowering of NonMaxSuppression to GE's ``NonMaxSuppressionV6``, the form ATC's ONNX parser writes.

The ops-plugin maps ONNX NonMaxSuppression (opsets 10 to 13) to ``NonMaxSuppressionV6``:

    REG_OP(NonMaxSuppressionV6)
        .INPUT(boxes)  .INPUT(scores)                            float16 / float
        .OPTIONAL_INPUT(max_output_size)                         int32
        .OPTIONAL_INPUT(iou_threshold) .OPTIONAL_INPUT(score_threshold)   float
        .OUTPUT(selected_indices)                                int32 [M, 3]
        .ATTR(center_point_box, Int, 0) .ATTR(max_boxes_size, Int, 0)

Kiln writes ``max_output_size = [K]`` with ``K = min(max_output_boxes_per_class, N)`` (int32; the
op's documented limit is 700), the thresholds as one-element float32 Consts (an absent
``score_threshold`` stays an absent input), ``center_point_box`` as in ONNX and
``max_boxes_size = M = B·C·K``, the bound GE's infershape gives the output (``min(B·C·max, B·C·N)``).
ONNX's int64 ``[num_selected, 3]`` is then ``Cast(selected_indices, int64)``, named after the Kiln
value. The .om describes both by their static bound ``[M, 3]``: .om files hold static shapes, and
the strict reader reads the symbolic dim back from it (``frontends/cann/lift_detection.py``).
The thresholds and ``max_output_boxes_per_class`` must be constants (they fix M).
"""

from __future__ import annotations

import numpy as np

from backends.cann.lower import Lowerer, lowering
from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from schemas.cann.codes import CPP_DTYPE, format_for
from schemas.cann.om_graph import Attr, TensorDesc

__all__ = ["MAX_OUTPUT_SIZE_LIMIT", "nms_bound"]

MAX_OUTPUT_SIZE_LIMIT = 700
"""The largest ``max_output_size`` NonMaxSuppressionV6 takes (CANN's operator documentation)."""

_INPUTS = ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold")


def _scalar(value: Value | None) -> float | None:
    c = None if value is None else value.const
    return None if c is None or c.size == 0 else float(np.asarray(c).reshape(-1)[0])


def nms_bound(graph: Graph, node: Node) -> tuple[int, int]:
    """``(K, M)``: the per-class cap ``min(max_output_boxes_per_class, N)`` and ``M = B·C·K``."""
    ins = list(graph.inputs_of(node)) + [None] * 5
    scores = ins[1]
    assert scores is not None
    b, c, n = scores.type.static_shape
    k = int(min(_scalar(ins[2]) or 0, n))
    return k, b * c * k


def _check(graph: Graph, node: Node) -> str | None:
    ins = list(graph.inputs_of(node)) + [None] * 5
    for port in (0, 1):
        v = ins[port]
        if v is None or v.type.dtype not in (DType.FLOAT32, DType.FLOAT16):
            return f"NonMaxSuppressionV6 takes float32/float16 {_INPUTS[port]}"
    for port in (2, 3, 4):
        v = ins[port]
        if v is not None and v.const is None:
            return f"{_INPUTS[port]} is computed (the .om needs it constant to bound the output)"
    k, _ = nms_bound(graph, node)
    if k <= 0:
        return "max_output_boxes_per_class is absent or 0 (selects nothing)"
    if k > MAX_OUTPUT_SIZE_LIMIT:
        return f"{k} boxes per class exceed NonMaxSuppressionV6's limit {MAX_OUTPUT_SIZE_LIMIT}"
    iou = _scalar(ins[3]) or 0.0
    if not 0.0 <= iou <= 1.0:
        return f"iou_threshold {iou} is outside [0, 1]"
    return None


@lowering("NonMaxSuppression", check=_check, dynamic_outputs=True)
def _nms(low: Lowerer, node: Node) -> None:
    ins = list(low.g.inputs_of(node)) + [None] * 5
    out = low.g.value(node)
    k, m = nms_bound(low.g, node)
    refs = [low.ref_of(ins[0]), low.ref_of(ins[1])]
    refs.append(low.const(np.array([k], np.int32), f"{out.name}/max_output_size"))
    refs.append(low.const(np.array([_scalar(ins[3]) or 0.0], np.float32), f"{out.name}/iou_threshold"))
    score = _scalar(ins[4])
    if score is not None:
        refs.append(low.const(np.array([score], np.float32), f"{out.name}/score_threshold"))
    attrs = {"center_point_box": Attr.i(node.attrs.center_point_box), "max_boxes_size": Attr.i(m)}
    fmt = format_for(2)
    name = low.names.fresh(f"{out.name}/NonMaxSuppressionV6")
    sel = low.emit(name, "NonMaxSuppressionV6", refs, [TensorDesc(DType.INT32, (m, 3), fmt)], attrs)
    cast = {"dst_type": Attr.i(CPP_DTYPE[DType.INT64])}
    low.bind(node, low.emit(out.name, "Cast", [sel], [TensorDesc(DType.INT64, (m, 3), fmt)], cast))
