"""Ops whose output length the data decides: NonZero and NonMaxSuppression.

Each is a kernel writing a padded result (the longest the output can be) and the true length
``[1]``; :func:`backends.tvm.dynamic_shapes.define_length` makes that length a symbolic dim
``n`` and a prefix copy gives the ``[.., n]`` result. Both kernels are serial loops (the
selection is sequential by definition); on CUDA they run on one thread.

    NonZero(x)[:, j] = unravel(i_j)      i_0 < i_1 < ... the flat indices with x[i] != 0
    NonMaxSuppression: for each (batch b, class c), boxes visited by descending score (ties:
    lower index first, a stable sort) among those with score > score_threshold; a box is kept
    unless its IoU with a box already kept for (b, c) exceeds iou_threshold, until
    max_output_boxes_per_class are kept; rows (b, c, box) in that order (onnxruntime's rule:
    a box or intersection of area <= 0 suppresses nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.dynamic_shapes import UNBOUNDED, define_length
from backends.tvm.lowering.table import LowerContext, lowers_dynamic
from compiler.ir.graph import Graph, Node

__all__ = ["nonzero_te", "nms_te"]


def _one_thread() -> Any:
    """An IR frame running its body on one GPU thread (one block of one thread)."""
    from tvm import te
    from tvm.script.ir_builder import tirx as T

    return T.frame_scope(
        [
            T.attr(te.thread_axis("blockIdx.x"), "thread_extent", 1),
            T.attr(te.thread_axis("threadIdx.x"), "thread_extent", 1),
        ]
    )


def _i64(v: Any) -> Any:
    from tvm import tirx

    return v if str(getattr(v, "ty", "")) == "int64" else tirx.Cast("int64", v)


def nonzero_te(x: Any, gpu: bool = False) -> Any:
    """TE extern: (indices [rank, numel] int64 padded, count [1] int64)."""
    import contextlib

    from tvm import sym, te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    shape = [_i64(d) for d in x.shape]
    rank = max(len(shape), 1)
    numel = tirx.const(1, "int64")
    for d in shape:
        numel = numel * d
    numel = sym.Analyzer().simplify(numel)

    def ir(xb: Any, ob: Any, cb: Any) -> Any:
        with IRBuilder() as ib, T.seq_scope():
            launch = _one_thread() if gpu else contextlib.nullcontext()
            with launch:
                xp, op, cp = T.buffer_proxy(xb), T.buffer_proxy(ob), T.buffer_proxy(cb)
                cp[0] = T.int64(0)
                with T.serial(0, numel) as i:
                    coords: list[Any] = []
                    rest = i
                    for ax in reversed(range(len(shape))):
                        d = shape[ax]
                        coords.insert(0, tirx.floormod(rest, d))
                        rest = tirx.floordiv(rest, d)
                    val = xp[tuple(coords)]
                    nonzero = val if x.dtype == "bool" else val != tirx.const(0, x.dtype)
                    with T.If(nonzero), T.Then():
                        for ax, coord in enumerate(coords):
                            op[ax, cp[0]] = coord
                        cp[0] = cp[0] + T.int64(1)
        return ib.get()

    return te.extern(
        [(rank if shape else 0, numel), (1,)],
        [x],
        lambda ins, outs: ir(ins[0], outs[0], outs[1]),
        dtype=["int64", "int64"],
        name="kiln_nonzero",
    )


def prefix_te(padded: Any, n: Any, axis: int) -> Any:
    """``padded`` cut to its first ``n`` entries along ``axis``."""
    from tvm import te

    shape = list(padded.shape)
    shape[axis] = n
    return te.compute(shape, lambda *i: padded[i], name="kiln_prefix")


def _prefix(ctx: LowerContext, padded: Any, count: Any, axis: int) -> Any:
    n = define_length(ctx, count)
    return ctx.bb.emit_te(prefix_te, padded, n, axis, primfunc_name_hint="kiln_prefix")


def _nonzero_reason(graph: Graph, node: Node) -> str | None:
    t = graph.inputs_of(node)[0]
    assert t is not None
    return None if t.type.shape is not None else "NonZero of a tensor of unknown rank"


@lowers_dynamic("NonZero", check=_nonzero_reason)
def _nonzero(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax

    out = ctx.bb.emit_te(nonzero_te, ins[0], ctx.target.kind == "cuda", primfunc_name_hint="kiln_nonzero")
    padded, count = ctx.emit(relax.TupleGetItem(out, 0)), ctx.emit(relax.TupleGetItem(out, 1))
    return [_prefix(ctx, padded, count, 1)]


def nms_te(
    boxes: Any,
    scores: Any,
    order: Any,
    max_out: int,
    iou: float,
    score: float | None,
    center: bool,
    gpu: bool = False,
) -> Any:
    """TE extern: (selected [B·C·K, 3] int64 padded, count [1] int64, scratch [N]: the boxes kept
    for the current class), K = min(max_out, N); ``order[b, c]`` lists the boxes by descending
    score (stable)."""
    import contextlib

    from tvm import sym, te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    b_n, c_n, n_n = (_i64(d) for d in scores.shape)
    k_n = (
        n_n if max_out >= UNBOUNDED else sym.Analyzer().simplify(tirx.min(tirx.const(max_out, "int64"), n_n))
    )
    dt = boxes.dtype
    zero = tirx.const(0.0, dt)

    def corners(bx: Any, b: Any, i: Any) -> tuple[Any, Any, Any, Any]:
        """(y_min, x_min, y_max, x_max) of box i."""
        v = [bx[b, i, k] for k in range(4)]
        if center:  # [x_center, y_center, width, height]
            half = tirx.const(0.5, dt)
            return (v[1] - v[3] * half, v[0] - v[2] * half, v[1] + v[3] * half, v[0] + v[2] * half)
        return (tirx.min(v[0], v[2]), tirx.min(v[1], v[3]), tirx.max(v[0], v[2]), tirx.max(v[1], v[3]))

    def suppresses(bx: Any, b: Any, i: Any, j: Any) -> Any:
        ay0, ax0, ay1, ax1 = corners(bx, b, i)
        by0, bx0, by1, bx1 = corners(bx, b, j)
        iy0, ix0 = tirx.max(ay0, by0), tirx.max(ax0, bx0)
        iy1, ix1 = tirx.min(ay1, by1), tirx.min(ax1, bx1)
        inter = (ix1 - ix0) * (iy1 - iy0)
        area_a = (ax1 - ax0) * (ay1 - ay0)
        area_b = (bx1 - bx0) * (by1 - by0)
        union = area_a + area_b - inter
        ok = tirx.all(ix1 > ix0, iy1 > iy0, inter > zero, area_a > zero, area_b > zero, union > zero)
        return tirx.all(ok, inter / tirx.if_then_else(ok, union, tirx.const(1.0, dt)) > tirx.const(iou, dt))

    def ir(bb_: Any, sb: Any, ob: Any, selb: Any, cb: Any, keptb: Any) -> Any:
        with IRBuilder() as ib, T.seq_scope():
            launch = _one_thread() if gpu else contextlib.nullcontext()
            with launch:
                bx, sc, od = T.buffer_proxy(bb_), T.buffer_proxy(sb), T.buffer_proxy(ob)
                sel, cnt = T.buffer_proxy(selb), T.buffer_proxy(cb)
                kept = T.buffer_proxy(keptb)
                nk_buf = T.alloc_buffer((1,), "int64", scope="local")
                nk = T.buffer_proxy(nk_buf)
                flag_buf = T.alloc_buffer((1,), "int32", scope="local")
                flag = T.buffer_proxy(flag_buf)
                cnt[0] = T.int64(0)
                with T.serial(0, b_n) as b, T.serial(0, c_n) as c:
                    nk[0] = T.int64(0)
                    with T.serial(0, n_n) as r:
                        i = tirx.Cast("int64", od[b, c, r])
                        visit = nk[0] < k_n
                        if score is not None:
                            visit = tirx.all(visit, sc[b, c, i] > tirx.const(score, dt))
                        with T.If(visit), T.Then():
                            flag[0] = 1
                            with T.serial(0, nk[0]) as j, T.If(suppresses(bx, b, i, kept[j])), T.Then():
                                flag[0] = 0
                            with T.If(flag[0] == 1), T.Then():
                                kept[nk[0]] = i
                                sel[cnt[0], 0] = tirx.Cast("int64", b)
                                sel[cnt[0], 1] = tirx.Cast("int64", c)
                                sel[cnt[0], 2] = i
                                nk[0] = nk[0] + T.int64(1)
                                cnt[0] = cnt[0] + T.int64(1)
        return ib.get()

    return te.extern(
        [(sym.Analyzer().simplify(b_n * c_n * k_n), 3), (1,), (n_n,)],
        [boxes, scores, order],
        lambda ins, outs: ir(ins[0], ins[1], ins[2], outs[0], outs[1], outs[2]),
        dtype=["int64", "int64", "int64"],
        name="kiln_nms",
    )


def _scalar(graph: Graph, node: Node, port: int) -> float | None:
    ins = graph.inputs_of(node)
    v = ins[port] if port < len(ins) else None
    if v is None or v.const is None or v.const.size == 0:
        return None
    return float(np.asarray(v.const).reshape(-1)[0])


def _nms_reason(graph: Graph, node: Node) -> str | None:
    ins = list(graph.inputs_of(node)) + [None] * 5
    names = ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold")
    for port in (2, 3, 4):
        v = ins[port]
        if v is not None and v.const is None:
            return f"{names[port]} (input {port}) must be a constant for --target"
    for port in (0, 1):
        v = ins[port]
        assert v is not None
        if v.type.rank != 3:
            return f"{names[port]} must have rank 3"
    return None


@lowers_dynamic("NonMaxSuppression", check=_nms_reason)
def _nms(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax, topi

    g = ctx.graph
    max_out = _scalar(g, node, 2)
    k = 0 if max_out is None else int(min(max(max_out, 0), UNBOUNDED))
    iou = _scalar(g, node, 3) or 0.0
    score = _scalar(g, node, 4)
    center = bool(node.attrs.center_point_box)
    gpu = ctx.target.kind == "cuda"
    sort = topi.gpu.argsort if gpu else topi.argsort  # CPU: a stable sort (ties: lower index first)
    with ctx.target.tvm_target():  # the GPU sort reads the thread limit of the current target
        order = ctx.bb.emit_te(
            lambda s: sort(s, axis=2, is_ascend=False, dtype="int64"),
            ins[1],
            primfunc_name_hint="kiln_argsort",
        )
    out = ctx.bb.emit_te(
        nms_te, ins[0], ins[1], order, k, iou, score, center, gpu, primfunc_name_hint="kiln_nms"
    )
    padded, count = ctx.emit(relax.TupleGetItem(out, 0)), ctx.emit(relax.TupleGetItem(out, 1))
    return [_prefix(ctx, padded, count, 0)]
