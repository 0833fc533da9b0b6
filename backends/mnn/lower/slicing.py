"""Indexing ops: Slice and Split (StridedSlice), Gather (GatherV2), Pad (Padding), ScatterND
(ScatterNd).

StridedSlice takes TensorFlow semantics (``fromType`` 0) with full-rank int32 constant
``begin``/``end``/``strides`` inputs; Kiln resolves ONNX's clamping per axis
(:func:`compiler.ops.shapes.slice_bounds`). An axis with a negative step is a GatherV2 of
its explicit indices instead: MNN 3.6.1's StridedSlice with a negative stride reads and
writes out of bounds (valgrind), which corrupts the heap and crashes the process later.

ScatterND is MNN's four-input ``ScatterNd(indices, updates, shape, data)`` (what MNN's
converter writes for ONNX, target version >= 2), with a ``BinaryOp`` parameter naming the
reduction (none: no parameter). MNN's kernel reads the indices as they are, so negative
ones must be wrapped: constant indices are written wrapped, variable ones go through
``(i + dims) mod dims`` (two int32 BinaryOps, as MNN's converter writes). Observed with
MNN 3.6.1 (so refused): the reductions max and min (BinaryOp MAXIMUM / MINIMUM) leave
``data`` unchanged, and add / mul of int32 tensors give wrong values; add and mul of
float tensors are exact.
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.elementwise import binary_table
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node, Value
from compiler.ops.shapes import normalize_axes, normalize_axis, slice_bounds
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "emit_strided_slice"]

_PAD_MODES = {
    "constant": fb.PadValueMode.CONSTANT,
    "reflect": fb.PadValueMode.REFLECT,
    "edge": fb.PadValueMode.EDGE,
}


def _dtype(value: Value) -> int:
    return fb.DataType.DT_FLOAT if value.type.dtype.is_float else fb.DataType.DT_INT32


def emit_strided_slice(
    ctx: LowerContext,
    name: str,
    x: int,
    out: int,
    begin: list[int],
    end: list[int],
    strides: list[int],
    end_mask: int,
    dtype: int = fb.DataType.DT_FLOAT,
) -> None:
    """``out = x[begin:end:strides]`` per axis (TensorFlow semantics)."""
    ins = [
        x,
        ctx.const_tensor(np.asarray(begin, np.int32), f"{name}__begin"),
        ctx.const_tensor(np.asarray(end, np.int32), f"{name}__end"),
        ctx.const_tensor(np.asarray(strides, np.int32), f"{name}__strides"),
    ]
    param = Table(
        "StridedSliceParam",
        {"Index": fb.DataType.DT_INT32, "T": dtype, "endMask": end_mask, "fromType": 0},
    )
    ctx.emit("StridedSlice", name, ins, [out], param)


def _slice_spec(graph: Graph, node: Node) -> tuple[list[int], list[int], list[int]] | None:
    """Full-rank begin/end/stride of a Slice (ONNX clamping applied; end -1 = through index 0)."""
    ins = graph.inputs_of(node)
    x = ins[0]
    assert x is not None
    shape = x.type.static_shape
    consts = [v.const if v is not None else None for v in ins[1:]]
    if (
        consts[0] is None
        or consts[1] is None
        or any(ins[i] is not None and consts[i - 1] is None for i in range(3, len(ins)))
    ):
        return None
    starts, ends = [int(v) for v in consts[0].reshape(-1)], [int(v) for v in consts[1].reshape(-1)]
    axes_c = consts[2] if len(consts) > 2 else None
    steps_c = consts[3] if len(consts) > 3 else None
    axes = (
        normalize_axes([int(v) for v in axes_c.reshape(-1)], len(shape))
        if axes_c is not None
        else list(range(len(starts)))
    )
    steps = [int(v) for v in steps_c.reshape(-1)] if steps_c is not None else [1] * len(starts)
    begin, end, stride = [0] * len(shape), list(shape), [1] * len(shape)
    for ax, s, e, st in zip(axes, starts, ends, steps, strict=True):
        b, f, _ = slice_bounds(shape[ax], s, e, st)
        begin[ax], end[ax], stride[ax] = b, f, st
    return begin, end, stride


def _check_slice(graph: Graph, node: Node) -> str | None:
    return None if _slice_spec(graph, node) is not None else "starts/ends/axes/steps must be constant"


def _lower_slice(ctx: LowerContext, node: Node) -> None:
    spec = _slice_spec(ctx.graph, node)
    assert spec is not None
    begin, end, stride = spec
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    shape = ctx.shape(x_value)
    name = ctx.op_name(node)
    value = ctx.graph.value(node)
    dtype = _dtype(x_value)
    x = ctx.tensor(x_value, Format.NCHW)
    # Negative steps become a GatherV2 of the explicit indices: MNN 3.6.1's StridedSlice with a
    # negative stride and the end mask reads and writes out of bounds (found with valgrind).
    reverse = [ax for ax in range(len(shape)) if stride[ax] < 0]
    fwd_begin = [0 if ax in reverse else begin[ax] for ax in range(len(shape))]
    fwd_end = [shape[ax] if ax in reverse else end[ax] for ax in range(len(shape))]
    fwd_stride = [1 if ax in reverse else stride[ax] for ax in range(len(shape))]
    steps: list[tuple[str, int | None]] = []
    if (fwd_begin, fwd_end, fwd_stride) != ([0] * len(shape), list(shape), [1] * len(shape)) or not reverse:
        steps.append(("slice", None))
    steps += [("gather", ax) for ax in reverse]
    cur = x
    for i, (kind, ax) in enumerate(steps):
        last = i == len(steps) - 1
        out = ctx.define(value, Format.NCHW) if last else ctx.temp(f"{value.name}__{kind}{i}")
        if ax is None:
            emit_strided_slice(
                ctx,
                f"{name}__slice" if not last else name,
                cur,
                out,
                fwd_begin,
                fwd_end,
                fwd_stride,
                0,
                dtype,
            )
        else:
            idx = np.arange(begin[ax], end[ax], stride[ax], dtype=np.int32)
            ins = [
                cur,
                ctx.const_tensor(idx, f"{name}__indices{ax}"),
                ctx.const_tensor(np.array(ax, np.int32), f"{name}__axis{ax}"),
            ]
            param = Table("GatherV2", {"Tindices": fb.DataType.DT_INT32, "Tparams": dtype})
            ctx.emit("GatherV2", name if last else f"{name}__reverse{ax}", ins, [out], param)
        cur = out


def _lower_split(ctx: LowerContext, node: Node) -> None:
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    shape = ctx.shape(x_value)
    axis = normalize_axis(node.attrs.axis, len(shape))
    x = ctx.tensor(x_value, Format.NCHW)
    start = 0
    for port in range(node.num_outputs):
        value = ctx.graph.value(node, port)
        size = ctx.shape(value)[axis]
        begin, end = [0] * len(shape), list(shape)
        begin[axis], end[axis] = start, start + size
        out = ctx.define(value, Format.NCHW)
        name = f"{ctx.op_name(node)}__{port}"
        emit_strided_slice(ctx, name, x, out, begin, end, [1] * len(shape), 0, _dtype(x_value))
        start += size


def _check_gather(graph: Graph, node: Node) -> str | None:
    x, idx = graph.inputs_of(node)
    assert x is not None and idx is not None
    if idx.const is None and idx.type.dtype.is_float:
        return "float indices"
    return None


def _lower_gather(ctx: LowerContext, node: Node) -> None:
    x_value, idx_value = ctx.graph.inputs_of(node)
    assert x_value is not None and idx_value is not None
    shape = ctx.shape(x_value)
    axis = normalize_axis(node.attrs.axis, len(shape))
    name = ctx.op_name(node)
    x = ctx.tensor(x_value, Format.NCHW)
    c = idx_value.const
    if c is not None:
        fixed = np.where(c < 0, c + shape[axis], c).astype(np.int32)
        idx = ctx.const_tensor(fixed, f"{name}__indices")
    else:
        idx = ctx.tensor(idx_value, Format.NCHW)
    ax = ctx.const_tensor(np.array(axis, np.int32), f"{name}__axis")
    out = ctx.define(ctx.graph.value(node), Format.NCHW)
    param = Table("GatherV2", {"Tindices": fb.DataType.DT_INT32, "Tparams": _dtype(x_value)})
    ctx.emit("GatherV2", name, [x, idx, ax], [out], param)


def _pad_spec(graph: Graph, node: Node) -> tuple[list[int], float] | None:
    ins = graph.inputs_of(node)
    x = ins[0]
    assert x is not None
    rank = len(x.type.static_shape)
    pads_v = ins[1]
    value_v = ins[2] if len(ins) > 2 else None
    axes_v = ins[3] if len(ins) > 3 else None
    if pads_v is None or pads_v.const is None:
        return None
    if (value_v is not None and value_v.const is None) or (axes_v is not None and axes_v.const is None):
        return None
    pads = [int(v) for v in pads_v.const.reshape(-1)]
    axes = list(range(rank))
    if axes_v is not None and axes_v.const is not None:
        axes = normalize_axes([int(v) for v in axes_v.const.reshape(-1)], rank)
    n = len(axes)
    full = [0] * (2 * rank)
    for i, ax in enumerate(axes):
        full[2 * ax], full[2 * ax + 1] = pads[i], pads[i + n]
    fill = (
        float(value_v.const.reshape(-1)[0])
        if value_v is not None and value_v.const is not None and value_v.const.size
        else 0.0
    )
    return full, fill


def _check_pad(graph: Graph, node: Node) -> str | None:
    if node.attrs.mode not in _PAD_MODES:
        return f"mode {node.attrs.mode}"
    spec = _pad_spec(graph, node)
    if spec is None:
        return "pads, value and axes must be constant"
    if min(spec[0]) < 0:
        return "negative pads"
    return None


def _lower_pad(ctx: LowerContext, node: Node) -> None:
    spec = _pad_spec(ctx.graph, node)
    assert spec is not None
    pads, fill = spec
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    name = ctx.op_name(node)
    ins = [ctx.tensor(x_value, Format.NCHW), ctx.const_tensor(np.asarray(pads, np.int32), f"{name}__pads")]
    if fill != 0.0:
        dt = np.float32 if x_value.type.dtype.is_float else np.int32
        ins.append(ctx.const_tensor(np.array(fill, dt), f"{name}__value"))
    out = ctx.define(ctx.graph.value(node), Format.NCHW)
    ctx.emit("Padding", name, ins, [out], Table("PadParam", {"mode": _PAD_MODES[node.attrs.mode]}))


_SCATTER_REDUCTIONS = {"add": fb.BinaryOpOperation.ADD, "mul": fb.BinaryOpOperation.MUL}


def _check_scatter_nd(graph: Graph, node: Node) -> str | None:
    data, idx, _ = graph.inputs_of(node)
    assert data is not None and idx is not None
    reduction = node.attrs.reduction
    if reduction != "none" and reduction not in _SCATTER_REDUCTIONS:
        return f"reduction {reduction} (MNN 3.6.1's kernel leaves data unchanged)"
    if reduction != "none" and not data.type.dtype.is_float:
        return f"reduction {reduction} of integer tensors (wrong in MNN 3.6.1)"
    return None


def _lower_scatter_nd(ctx: LowerContext, node: Node) -> None:
    data_value, idx_value, upd_value = ctx.graph.inputs_of(node)
    assert data_value is not None and idx_value is not None and upd_value is not None
    shape = ctx.shape(data_value)
    name = ctx.op_name(node)
    dims = np.asarray(shape[: ctx.shape(idx_value)[-1]], np.int64)
    if idx_value.const is not None:
        c = idx_value.const.astype(np.int64)
        idx = ctx.const_tensor(np.where(c < 0, c + dims, c).astype(np.int32), f"{name}__indices")
    else:
        d = ctx.const_tensor(dims.astype(np.int32), f"{name}__dims")
        shifted, idx = ctx.temp(f"{name}__shifted"), ctx.temp(f"{name}__wrapped")
        int_add = binary_table(fb.BinaryOpOperation.ADD, integer=True)
        ctx.emit("BinaryOp", f"{name}__shift", [ctx.tensor(idx_value, Format.NCHW), d], [shifted], int_add)
        ctx.emit(
            "BinaryOp", f"{name}__wrap", [shifted, d], [idx], binary_table(fb.BinaryOpOperation.MOD, True)
        )
    ins = [
        idx,
        ctx.tensor(upd_value, Format.NCHW),
        ctx.const_tensor(np.asarray(shape, np.int32), f"{name}__shape"),
        ctx.tensor(data_value, Format.NCHW),
    ]
    reduction = node.attrs.reduction
    param = None
    if reduction != "none":
        fields = {"opType": _SCATTER_REDUCTIONS[reduction], "T": fb.DataType.DT_FLOAT}
        param = Table("BinaryOp", fields, force=frozenset({"opType"}))
    ctx.emit("ScatterNd", name, ins, [ctx.define(ctx.graph.value(node), Format.NCHW)], param)


LOWERINGS: dict[str, Lowering] = {
    "ScatterND": Lowering(_lower_scatter_nd, _check_scatter_nd),
    "Slice": Lowering(_lower_slice, _check_slice),
    "Split": Lowering(_lower_split),
    "Gather": Lowering(_lower_gather, _check_gather),
    "Pad": Lowering(_lower_pad, _check_pad),
}
