"""N-d indexing: ScatterND, ScatterElements (every reduction), GatherND, GatherElements.

ONNX's negative indices count from the end of their axis: constant indices are wrapped here,
runtime ones by ``idx + (idx < 0) * dim`` in Relax (ScatterElements' own kernel wraps its own:
:mod:`backends.tvm.lowering.scatter_elements`).
ScatterND on CPU runs Kiln's kernel (:func:`scatter_nd_te`); on CUDA TOPI's thread-bound one,
which Relax's legalization picks under a GPU target. With ``reduction="none"`` a duplicate index
keeps the last update (ONNX leaves it undefined; onnxruntime and the registry's reference do that).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.gpu_bind import bind_gpu
from backends.tvm.lowering.scatter_elements import combine, emit_scatter_elements
from backends.tvm.lowering.table import LowerContext, lowers
from compiler.ir.graph import Node

__all__ = ["scatter_nd_te", "TVM_REDUCTION"]

TVM_REDUCTION = {"none": "update", "add": "add", "mul": "mul", "max": "max", "min": "min"}
"""ONNX scatter reduction -> the Relax/TOPI name."""

_PARALLEL_SLICE = 4096  # slice elements above which one update's slice is written in parallel


def _op() -> Any:
    from tvm import relax

    return relax.op


def _wrapped(ctx: LowerContext, node: Node, port: int, x: Any, dims: tuple[int, ...]) -> Any:
    """Indices at ``port`` with negatives wrapped; ``dims`` broadcasts against their last axis."""
    c = ctx.input_const(node, port)
    lim = np.asarray(dims, np.int64)
    if c is not None:
        return ctx.const(np.where(c < 0, c + lim, c).astype(np.int64))
    op = _op()
    dt = ctx.in_type(node, port).dtype.numpy.name
    neg = ctx.emit(op.less(x, ctx.scalar(0, dt)))
    return ctx.emit(op.where(neg, op.add(x, ctx.const(lim.astype(dt))), x))


def scatter_nd_te(data: Any, indices: Any, updates: Any, reduction: str) -> Any:
    """``out = data; out[indices[i, :], ...] (reduction)= updates[i, ...]`` over i in order.

    ``indices`` is [..., k] (ONNX's order, already non-negative); the update loop is serial (so a
    duplicate index sees the updates in order), each update's slice of ``prod(data.shape[k:])``
    elements is written in parallel only when it is large, and the copy of ``data`` is parallel.
    """
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    k = int(indices.shape[-1])
    dims = [int(d) for d in data.shape]
    count = int(np.prod([int(d) for d in indices.shape[:-1]], dtype=np.int64))
    width = int(np.prod(dims[k:], dtype=np.int64))
    total = int(np.prod(dims, dtype=np.int64))
    f = combine(reduction)

    def gen(ins: Any, outs: Any) -> Any:
        src, idx, upd = (T.buffer_proxy(b) for b in ins)
        out = T.buffer_proxy(outs[0])
        with IRBuilder() as ib:
            with T.seq_scope():
                with T.parallel(0, total) if total > _PARALLEL_SLICE else T.serial(0, total) as i:
                    out[i] = src[i]
                with T.serial(0, count) as i:
                    base = tirx.const(0, "int64")
                    for axis in range(k):
                        base = base * dims[axis] + idx[i * k + axis].astype("int64")
                    loop = T.parallel if width > _PARALLEL_SLICE else T.serial
                    with loop(0, width) as j:
                        at = base * width + j
                        out[at] = f(out[at], upd[i * width + j])
            return ib.get()

    buf = tirx.decl_buffer(data.shape, data.dtype, "scatter_out")
    return te.extern(
        [data.shape],
        [data, indices, updates],
        gen,
        dtype=data.dtype,
        out_buffers=[buf],
        name="kiln_scatter_nd",
    )


@lowers("ScatterND")
def _scatter_nd(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    shape = ctx.in_type(node, 0).static_shape
    k = ctx.in_type(node, 1).static_shape[-1]
    idx = _wrapped(ctx, node, 1, ins[1], tuple(shape[:k]))
    red = TVM_REDUCTION[node.attrs.reduction]
    if ctx.target.kind == "cuda":  # TOPI's GPU kernel (thread-bound) via Relax's legalization
        return [ctx.emit(_op().scatter_nd(ins[0], idx, ins[2], red))]
    return [ctx.bb.emit_te(scatter_nd_te, ins[0], idx, ins[2], red, primfunc_name_hint="kiln_scatter_nd")]


@lowers("ScatterElements")
def _scatter_elements(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    rank = len(ctx.in_type(node, 0).static_shape)
    axis = int(node.attrs.axis) % rank
    return [emit_scatter_elements(ctx, ins, axis, node.attrs.reduction)]


@lowers("GatherND")
def _gather_nd(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    shape = ctx.in_type(node, 0).static_shape
    b = int(node.attrs.batch_dims)
    k = ctx.in_type(node, 1).static_shape[-1]
    idx = _wrapped(ctx, node, 1, ins[1], tuple(shape[b : b + k]))
    return [ctx.emit(_op().gather_nd(ins[0], idx, b))]


@lowers("GatherElements")
def _gather_elements(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    shape = ctx.in_type(node, 0).static_shape
    axis = int(node.attrs.axis) % len(shape)
    idx = _wrapped(ctx, node, 1, ins[1], (shape[axis],))  # every index is along ``axis``
    return [ctx.emit(_op().gather_elements(ins[0], idx, axis))]


def _roi_align_reason(graph: Any, node: Node) -> str | None:
    a = node.attrs
    if a.mode != "avg":
        return (
            "RoiAlign mode 'max' takes onnxruntime's max over the weighted bilinear taps; TOPI's max "
            "(of the interpolated values) differs: no TVM lowering"
        )
    if a.coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        return f"RoiAlign coordinate_transformation_mode {a.coordinate_transformation_mode!r} is unknown"
    return None


def roi_align_rows(ctx: LowerContext, node: Node, ins: list[Any]) -> tuple[Any, tuple[int, int], float, bool]:
    """TOPI's ``[batch_index, x1, y1, x2, y2]`` rows, the pooled size, the scale and half_pixel;
    half_pixel's ``- 1/2`` after the scale is folded into the ROI as ``- 1/(2 scale)``."""
    from tvm import relax

    a = node.attrs
    op = _op()
    dt = ctx.in_type(node, 1).dtype.numpy.name
    scale = float(a.spatial_scale)
    half = a.coordinate_transformation_mode == "half_pixel"
    rois = ins[1]
    if half:
        rois = ctx.emit(op.subtract(rois, ctx.scalar(0.5 / scale, dt)))
    batch = ctx.emit(op.astype(op.expand_dims(ins[2], 1), dt))
    rows = ctx.emit(op.concat(relax.Tuple([batch, rois]), 1))
    return rows, (int(a.output_height), int(a.output_width)), scale, half


@lowers("RoiAlign", check=_roi_align_reason)
def _roi_align(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """TOPI's roi_align on the rows of :func:`roi_align_rows`."""
    from tvm import relax

    a = node.attrs
    rows, pooled, scale, half = roi_align_rows(ctx, node, ins)
    dt = ctx.in_type(node, 1).dtype.numpy.name
    if ctx.target.kind != "cuda":
        return [ctx.emit(_op().vision.roi_align(ins[0], rows, pooled, scale, int(a.sampling_ratio), half))]
    from tvm import te, topi

    x_t = te.placeholder(ctx.in_type(node, 0).static_shape, ctx.in_type(node, 0).dtype.numpy.name, "x")
    r_t = te.placeholder((ctx.in_type(node, 1).static_shape[0], 5), dt, "rois")
    y_t = topi.vision.roi_align_nchw(x_t, r_t, pooled, scale, 0, int(a.sampling_ratio), half)
    func = bind_gpu(te.create_prim_func([x_t, r_t, y_t]), ctx.target)  # dlight cannot bind its nest
    gv = ctx.bb.add_func(func, "roi_align")
    out = relax.TensorType(ctx.out_shape(node), ctx.out_type(node).dtype.numpy.name)
    return [ctx.emit(relax.call_tir(gv, [ins[0], rows], out))]


def _topk_reason(graph: Any, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    k = ins[1].const if ins[1] is not None else None
    if k is None:
        return "k (input 1) must be a constant for --target"
    if int(np.asarray(k).reshape(-1)[0]) < 1:
        return "TopK with k = 0 (an empty output) has no TVM lowering"
    return None


@lowers("TopK", check=_topk_reason)
def _topk(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax, topi

    rank = len(ctx.in_type(node, 0).static_shape)
    k = int(ctx.require_const(node, 1, "k").reshape(-1)[0])
    axis = int(node.attrs.axis) % rank
    fn = topi.gpu.topk if ctx.target.kind == "cuda" else topi.topk
    ascend = not node.attrs.largest
    with ctx.target.tvm_target():  # the GPU form reads the thread limit of the current target
        out = ctx.bb.emit_te(fn, ins[0], k, axis, "both", ascend, "int64", primfunc_name_hint="topk")
    return [ctx.emit(relax.TupleGetItem(out, i)) for i in range(2)][: node.num_outputs]


@lowers("ArgMax", "ArgMin")
def _arg_extreme(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """The first index of the max/min along ``axis``; ``select_last_index``: the last (the argmax
    of the flipped axis, mapped back as dim - 1 - i)."""
    op = _op()
    a = node.attrs
    shape = ctx.in_type(node, 0).static_shape
    axis = int(a.axis) % len(shape)
    fn = op.argmax if node.op == "ArgMax" else op.argmin
    x = ctx.emit(op.flip(ins[0], axis)) if a.select_last_index else ins[0]
    idx = ctx.emit(op.astype(fn(x, axis, bool(a.keepdims)), "int64"))
    if a.select_last_index:
        idx = ctx.emit(op.subtract(ctx.scalar(shape[axis] - 1, "int64"), idx))
    return [idx]


def _one_hot(ctx: LowerContext, idx: Any, on: float, off: float, depth: int, axis: int, dt: str) -> Any:
    from tvm import tirx

    return ctx.emit(_op().one_hot(idx, tirx.const(on, dt), tirx.const(off, dt), depth, axis))


@lowers("Hardmax")
def _hardmax(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    shape = ctx.in_type(node, 0).static_shape
    axis = int(node.attrs.axis) % len(shape)
    idx = ctx.emit(_op().argmax(ins[0], axis, False))
    dt = ctx.in_type(node, 0).dtype.numpy.name
    return [_one_hot(ctx, idx, 1.0, 0.0, shape[axis], axis, dt)]


@lowers("OneHot", check=lambda graph, node: _onehot_reason(graph, node))
def _onehot(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """values[1] where the (wrapped) index equals the position along the new ``axis``, else values[0]."""
    op = _op()
    depth = int(np.asarray(ctx.require_const(node, 1, "depth")).reshape(-1)[0])
    off, on = (float(v) for v in ctx.require_const(node, 2, "values").reshape(-1)[:2])
    rank = len(ctx.out_shape(node))
    idx = ins[0]
    if not ctx.in_type(node, 0).dtype.is_integer:
        idx = ctx.emit(op.astype(idx, "int64"))  # ONNX: float indices are truncated
    it = "int64" if not ctx.in_type(node, 0).dtype.is_integer else ctx.in_type(node, 0).dtype.numpy.name
    idx = ctx.emit(op.where(op.less(idx, ctx.scalar(0, it)), op.add(idx, ctx.scalar(depth, it)), idx))
    return [
        _one_hot(ctx, idx, on, off, depth, int(node.attrs.axis) % rank, ctx.out_type(node).dtype.numpy.name)
    ]


def _onehot_reason(graph: Any, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    for port, what in ((1, "depth"), (2, "values")):
        if ins[port] is None or ins[port].const is None:
            return f"{what} (input {port}) must be a constant for --target"
    return None


def _reverse_sequence_te(x: Any, lens: Any, time_axis: int, batch_axis: int) -> Any:
    """y[.., t, .., b, ..] = x[.., L_b - 1 - t, .., b, ..] for t < L_b, else x itself."""
    from tvm import te, tirx

    def body(*i: Any) -> Any:
        t, b = i[time_axis].astype("int64"), i[batch_axis]
        n = lens[b].astype("int64")
        src = list(i)
        src[time_axis] = tirx.Select(t < n, n - tirx.const(1, "int64") - t, t)
        return x(*src)

    return te.compute(x.shape, body, name="reverse_sequence")


@lowers("ReverseSequence")
def _reverse_sequence(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    a = node.attrs
    rank = len(ctx.in_type(node, 0).static_shape)
    return [
        ctx.bb.emit_te(
            _reverse_sequence_te,
            ins[0],
            ins[1],
            int(a.time_axis) % rank,
            int(a.batch_axis) % rank,
            primfunc_name_hint="reverse_sequence",
        )
    ]
