"""NonMaxSuppression as MNN's native ``NonMaxSuppressionV2``, one per (batch, class).

MNN 3.6.1's ``NonMaxSuppressionV2(boxes [N, 4], scores [N], K, iou, score)`` is TensorFlow's
single-class NMS: boxes are ``[y1, x1, y2, x2]`` (any two opposite corners), a box is dropped when
its IoU with a kept box exceeds ``iou``, only scores ``> score`` are visited, and the output lists
the kept box indices (int32). Its length is data-dependent: a loaded file's runtime gives exactly
the kept ones, MNN's eager expression API pads them with ``-1`` to ``K = min(max_output, N)``;
Kiln's decoding takes either. ONNX's ``[num_selected, 3]`` triples come from one int32 code per
kept box, ``s = b·C + k`` being its (batch, class) segment:

    sel_bk   = NMSV2(boxes[b] · P, scores[b, k], K, iou, score)            b < B, k < C
    e        = concat_bk(sel_bk + 1 + s·(N + 1))                            (padding: e mod (N+1) = 0)
    e'       = GatherND(e, Where(e mod (N + 1) > 0))
    selected = [e' div (N+1) div C,  e' div (N+1) mod C,  e' mod (N+1) - 1]

which keeps ONNX's order (batch, class, then visit order). With ``center_point_box = 1`` the
boxes ``[xc, yc, w, h]`` first become corners, ``P = [[0, 1, 0, 1], [1, 0, 1, 0],
[0, -1/2, 0, 1/2], [-1/2, 0, 1/2, 0]]`` (a MatMul whose every output sums two exact products, so
``yc ∓ h/2`` and ``xc ∓ w/2`` round once, as onnxruntime's do).

Where MNN's runtime differs from ONNX (and Kiln writes it anyway): equal scores within one class
are visited in the order of MNN's heap, not lowest index first, so ties may select other boxes.
MNN's converter (3.6.1) writes the same per-class ops but keeps the ``-1`` padding and assembles
the rows with Shape/Fill; on a two-batch three-class graph its file's indices differ from
onnxruntime's. The thresholds and ``max_output_boxes_per_class`` must be constants, the IoU
threshold in [0, 1] (MNN asserts it), and ``B·C·(N+1)`` must fit int32; a missing or zero
``max_output_boxes_per_class`` (ONNX: no box is selected) is refused.
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.linear import reshape_table
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node, Value
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "CENTER_TO_CORNERS"]

CENTER_TO_CORNERS = np.array([[0, 1, 0, 1], [1, 0, 1, 0], [0, -0.5, 0, 0.5], [-0.5, 0, 0.5, 0]], np.float32)
"""``[xc, yc, w, h] · P = [yc - h/2, xc - w/2, yc + h/2, xc + w/2]``."""

_INPUT_NAMES = ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold")


def _scalar(value: Value | None) -> float | None:
    c = None if value is None else value.const
    return None if c is None or c.size == 0 else float(np.asarray(c).reshape(-1)[0])


def _check_nms(graph: Graph, node: Node) -> str | None:
    ins = list(graph.inputs_of(node)) + [None] * 5
    for port in (2, 3, 4):
        v = ins[port]
        if v is not None and v.const is None:
            return f"{_INPUT_NAMES[port]} is computed (MNN needs it constant)"
    if not _scalar(ins[2]):
        return "max_output_boxes_per_class is absent or 0 (selects nothing)"
    iou = _scalar(ins[3]) or 0.0
    if not 0.0 <= iou <= 1.0:
        return f"iou_threshold {iou} is outside [0, 1] (MNN's NonMaxSuppressionV2 asserts it)"
    for port in (0, 1):
        v = ins[port]
        if v is None or not v.type.dtype.is_float:
            return f"{_INPUT_NAMES[port]} must be float"
    scores = ins[1]
    assert scores is not None
    b, c, n = scores.type.static_shape
    if b * c * (n + 1) >= 2**31:
        return f"{b}x{c}x{n} boxes overflow the int32 codes of the selection"
    return None


def _gather(ctx: LowerContext, src: int, index: int, name: str, dtype: int) -> int:
    """``src[index]`` (axis 0 dropped): a GatherV2 by a scalar int32 constant."""
    out = ctx.temp(name)
    idx = ctx.const_tensor(np.array(index, np.int32), f"{name}__index")
    axis = ctx.const_tensor(np.array(0, np.int32), f"{name}__axis")
    param = Table("GatherV2", {"Tindices": fb.DataType.DT_INT32, "Tparams": dtype})
    ctx.emit("GatherV2", name, [src, idx, axis], [out], param)
    return out


def _lower_nms(ctx: LowerContext, node: Node) -> None:
    ins = list(ctx.graph.inputs_of(node)) + [None] * 5
    boxes_v, scores_v = ins[0], ins[1]
    assert boxes_v is not None and scores_v is not None
    batches, classes, n = ctx.shape(scores_v)
    k = int(min(_scalar(ins[2]) or 0, n))
    iou, score = _scalar(ins[3]) or 0.0, _scalar(ins[4])
    name = ctx.op_name(node)
    f32 = fb.DataType.DT_FLOAT
    boxes = ctx.tensor(boxes_v, Format.NCHW)
    scores = ctx.tensor(scores_v, Format.NCHW)
    rows = ctx.temp(f"{name}__scores2d")
    ctx.emit("Reshape", f"{name}__scores2d", [scores], [rows], reshape_table((batches * classes, n)))
    params = [ctx.const_tensor(np.array(k, np.int32), f"{name}__max")]
    params.append(ctx.const_tensor(np.array(iou, np.float32), f"{name}__iou"))
    if score is not None:
        params.append(ctx.const_tensor(np.array(score, np.float32), f"{name}__score"))
    center = node.attrs.center_point_box == 1
    proj = ctx.const_tensor(CENTER_TO_CORNERS, f"{name}__corners") if center else None
    codes: list[int] = []
    for b in range(batches):
        box_b = _gather(ctx, boxes, b, f"{name}__boxes{b}", f32)
        if proj is not None:
            corners = ctx.temp(f"{name}__corners{b}")
            mm = Table("MatMul", {"T": f32, "transposeA": False, "transposeB": False})
            ctx.emit("MatMul", f"{name}__corners{b}", [box_b, proj], [corners], mm)
            box_b = corners
        for c in range(classes):
            s = _gather(ctx, rows, b * classes + c, f"{name}__scores{b}_{c}", f32)
            pick = ctx.temp(f"{name}__nms{b}_{c}")
            ctx.emit("NonMaxSuppressionV2", f"{name}__nms{b}_{c}", [box_b, s, *params], [pick], None)
            codes.append(_encode(ctx, pick, b * classes + c, n, f"{name}__code{b}_{c}"))
    _emit_triples(ctx, node, codes, classes, n)


def _axis(axis: int) -> Table:
    return Table("Axis", {"axis": axis}, force=frozenset({"axis"}))


def _int_op(ctx: LowerContext, kind: int, a: int, b: int, name: str) -> int:
    """``a <kind> b`` on int32 tensors (one BinaryOp)."""
    out = ctx.temp(name)
    param = Table("BinaryOp", {"opType": kind, "T": fb.DataType.DT_INT32}, force=frozenset({"opType"}))
    ctx.emit("BinaryOp", name, [a, b], [out], param)
    return out


def _encode(ctx: LowerContext, pick: int, segment: int, n: int, name: str) -> int:
    """``e = pick + 1 + segment·(N + 1)`` of one (batch, class) segment (``-1`` padding: ``e ≡ 0``)."""
    offset = ctx.const_tensor(np.array(segment * (n + 1) + 1, np.int32), f"{name}__offset")
    return _int_op(ctx, fb.BinaryOpOperation.ADD, pick, offset, name)


def _emit_triples(ctx: LowerContext, node: Node, codes: list[int], classes: int, n: int) -> None:
    """Decode the kept ``e`` into ``[b, k, box]`` rows (the module docstring's last two lines)."""
    name = ctx.op_name(node)
    op = fb.BinaryOpOperation
    flat = codes[0]
    if len(codes) > 1:
        flat = ctx.temp(f"{name}__codes")
        ctx.emit("Concat", f"{name}__codes", codes, [flat], _axis(0))
    column = ctx.temp(f"{name}__column")
    ctx.emit("Reshape", f"{name}__column", [flat], [column], reshape_table((-1, 1)))
    base = ctx.const_tensor(np.array(n + 1, np.int32), f"{name}__base")
    rem = _int_op(ctx, op.MOD, flat, base, f"{name}__rem")
    zero = ctx.const_tensor(np.array(0, np.int32), f"{name}__zero")
    valid = _int_op(ctx, op.GREATER, rem, zero, f"{name}__valid")
    where = ctx.temp(f"{name}__where")
    ctx.emit("Where", f"{name}__where", [valid], [where], None)
    kept = ctx.temp(f"{name}__kept")
    ctx.emit("GatherND", f"{name}__kept", [column, where], [kept], None)
    one = ctx.const_tensor(np.array(1, np.int32), f"{name}__one")
    box = _int_op(ctx, op.SUB, _int_op(ctx, op.MOD, kept, base, f"{name}__box1"), one, f"{name}__box")
    segment = _int_op(ctx, op.FLOORDIV, kept, base, f"{name}__segment")
    c = ctx.const_tensor(np.array(classes, np.int32), f"{name}__classes")
    batch = _int_op(ctx, op.FLOORDIV, segment, c, f"{name}__batch")
    cls = _int_op(ctx, op.MOD, segment, c, f"{name}__class")
    out = ctx.define(ctx.graph.value(node), Format.NCHW)
    ctx.emit("Concat", name, [batch, cls, box], [out], _axis(1))


LOWERINGS: dict[str, Lowering] = {
    "NonMaxSuppression": Lowering(_lower_nms, _check_nms, dynamic_outputs=True),
}
