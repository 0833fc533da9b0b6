"""Index-producing and index-driven ops as MNN's own kernels: TopK (TopKV2), ArgMax / ArgMin,
Tile, GatherElements, GatherND, CumSum and OneHot.

Every operand is an NCHW tensor; Kiln's int64 tensors are MNN int32 tensors. The rewrites:

=====================  ================================================================
TopK(x, k)             TopKV2(x, k, axis) {largest, sorted: true}, k and axis int32 consts;
                       values only: MNN 3.6.1 orders equal values in no fixed order
                       (observed: neither by ascending nor by descending index; its int32
                       indices are right only where the values are distinct), where ONNX
                       puts the lower index first, so a TopK whose indices are read is
                       refused here and ``decompose`` writes it as ``topk-stable-indices``
                       (passes/decompositions/indexing.py): TopKV2 for the values, the
                       indices found by counting occurrences, exact
ArgMax / ArgMin(x)     ArgMax / ArgMin {axis, topK 1} (the axis is dropped), then a Reshape
                       to the output shape when keepdims = 1
Tile(x, r)             Tile(x, r), r an int32 constant
GatherElements(d, i)   GatherElements(d, i', axis) with i' = i + dims[axis] * (i < 0)
GatherND(d, i)         GatherND(d, i') with i' = i + dims[:m] * (i < 0), m = i.shape[-1];
                       batch_dims > 0 is refused (MNN's GatherND has no such parameter) and
                       ``decompose`` writes ``gathernd-batch``: a GatherND of the batch-
                       flattened data with a batch index column. MNN 3.6.1's own converter
                       expands batch_dims into a 28-op index computation that gives wrong
                       values whenever the index tuples have 2 or more columns (observed:
                       [2,3,4,5] by [2,3,2], batch_dims 1), and leaves negative indices
                       unwrapped
CumSum(x, a)           CumSum(x, a) {exclusive, reverse}
OneHot(i, n, [f, t])   OneHot(i', n, t, f) {axis, dType} (MNN's order: on before off) with
                       i' = i + n * (i < 0), which keeps an index outside [-n, n) outside
=====================  ================================================================

MNN's kernels read indices as they are, so negative ones are wrapped: constant indices when
they are written, variable ones with ``Less``, ``Mul`` and ``Add`` on int32 (exact: the shift
only applies where ``i < 0``).
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext, mnn_dtype
from backends.mnn.lower.elementwise import binary_table
from backends.mnn.lower.linear import reshape_table
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.backend import Check, all_of
from compiler.ir.graph import Graph, Node, Value
from compiler.ops.shapes import normalize_axis
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "wrapped_indices"]

_INT = fb.DataType.DT_INT32
_KINDS = (fb.DataType.DT_FLOAT, fb.DataType.DT_INT32)


def _in(graph: Graph, node: Node, i: int) -> Value:
    v = graph.inputs_of(node)[i]
    assert v is not None
    return v


def _dtype(value: Value) -> int:
    return fb.DataType.DT_FLOAT if value.type.dtype.is_float else _INT


def _i32(ctx: LowerContext, values: object, base: str) -> int:
    return ctx.const_tensor(np.asarray(values, np.int32), base)


def wrapped_indices(ctx: LowerContext, idx: Value, dims: np.ndarray, base: str) -> int:
    """The int32 tensor of ``idx + dims * (idx < 0)`` (``dims`` broadcasts against ``idx``)."""
    c = idx.const
    if c is not None:
        wide = c.astype(np.int64)
        return _i32(ctx, np.where(wide < 0, wide + dims, wide), f"{base}__indices")
    x = ctx.tensor(idx, Format.NCHW)
    neg, shift, out = ctx.temp(f"{base}__neg"), ctx.temp(f"{base}__shift"), ctx.temp(f"{base}__wrapped")
    zero, d = _i32(ctx, 0, f"{base}__zero"), _i32(ctx, dims, f"{base}__dims")
    ctx.emit("BinaryOp", f"{base}__neg", [x, zero], [neg], binary_table(fb.BinaryOpOperation.LESS, True))
    ctx.emit("BinaryOp", f"{base}__shift", [neg, d], [shift], binary_table(fb.BinaryOpOperation.MUL, True))
    ctx.emit("BinaryOp", f"{base}__wrap", [x, shift], [out], binary_table(fb.BinaryOpOperation.ADD, True))
    return out


def _check_kinds(*ports: int) -> Check:
    def check(graph: Graph, node: Node) -> str | None:
        for p in ports:
            v = _in(graph, node, p)
            if mnn_dtype(v.type.dtype) not in _KINDS:
                return f"{v.type.dtype.numpy.name} input {p} (MNN: float32 / int32 tensors)"
        return None

    return check


def _check_const(port: int, what: str) -> Check:
    def check(graph: Graph, node: Node) -> str | None:
        return None if _in(graph, node, port).const is not None else f"{what} must be constant"

    return check


# ---------------------------------------------------------------------- TopK
def _check_topk_indices(graph: Graph, node: Node) -> str | None:
    i = graph.value(node, 1)
    if graph.users(i) or any((o.node, o.port) == (i.node, i.port) for o in graph.outputs):
        return "the indices output (MNN 3.6.1's TopKV2 orders ties arbitrarily; see topk-stable-indices)"
    return None


def _lower_topk(ctx: LowerContext, node: Node) -> None:
    x, k = _in(ctx.graph, node, 0), _in(ctx.graph, node, 1)
    assert k.const is not None
    name = ctx.op_name(node)
    axis = normalize_axis(node.attrs.axis, len(ctx.shape(x)))
    ins = [ctx.tensor(x, Format.NCHW), _i32(ctx, [int(k.const.reshape(-1)[0])], f"{name}__k")]
    ins.append(_i32(ctx, axis, f"{name}__axis"))
    outs = [ctx.define(ctx.graph.value(node, p), Format.NCHW) for p in range(2)]
    param = Table("TopKV2", {"T": _dtype(x), "sorted": True, "largest": bool(node.attrs.largest)})
    ctx.emit("TopKV2", name, ins, outs, param)


# ------------------------------------------------------------ ArgMax / ArgMin
def _check_arg(graph: Graph, node: Node) -> str | None:
    if node.attrs.select_last_index:
        return "select_last_index=1 (MNN returns the first extremum)"
    return None


def _lower_arg(ctx: LowerContext, node: Node) -> None:
    x = _in(ctx.graph, node, 0)
    value = ctx.graph.value(node)
    name = ctx.op_name(node)
    axis = normalize_axis(node.attrs.axis, len(ctx.shape(x)))
    param = Table("ArgMax", {"axis": axis, "topK": 1}, force=frozenset({"axis", "topK"}))
    keep = bool(node.attrs.keepdims)
    out = ctx.temp(f"{value.name}__arg") if keep else ctx.define(value, Format.NCHW)
    ctx.emit(node.op, f"{name}__arg" if keep else name, [ctx.tensor(x, Format.NCHW)], [out], param)
    if keep:
        ctx.emit("Reshape", name, [out], [ctx.define(value, Format.NCHW)], reshape_table(ctx.shape(value)))


# ---------------------------------------------------------------------- Tile
def _lower_tile(ctx: LowerContext, node: Node) -> None:
    x, reps = _in(ctx.graph, node, 0), _in(ctx.graph, node, 1)
    assert reps.const is not None
    ins = [ctx.tensor(x, Format.NCHW), _i32(ctx, reps.const.reshape(-1), f"{ctx.op_name(node)}__repeats")]
    ctx.emit("Tile", ctx.op_name(node), ins, [ctx.define(ctx.graph.value(node), Format.NCHW)], None)


# ----------------------------------------------------- GatherElements / GatherND
def _lower_gather_elements(ctx: LowerContext, node: Node) -> None:
    data, idx = _in(ctx.graph, node, 0), _in(ctx.graph, node, 1)
    shape = ctx.shape(data)
    axis = normalize_axis(node.attrs.axis, len(shape))
    name = ctx.op_name(node)
    ins = [ctx.tensor(data, Format.NCHW), wrapped_indices(ctx, idx, np.asarray(shape[axis], np.int64), name)]
    ins.append(_i32(ctx, axis, f"{name}__axis"))
    ctx.emit("GatherElements", name, ins, [ctx.define(ctx.graph.value(node), Format.NCHW)], None)


def _check_gather_nd(graph: Graph, node: Node) -> str | None:
    return "batch_dims != 0 (MNN's GatherND has none; see gathernd-batch)" if node.attrs.batch_dims else None


def _lower_gather_nd(ctx: LowerContext, node: Node) -> None:
    data, idx = _in(ctx.graph, node, 0), _in(ctx.graph, node, 1)
    name = ctx.op_name(node)
    dims = np.asarray(ctx.shape(data)[: ctx.shape(idx)[-1]], np.int64)
    ins = [ctx.tensor(data, Format.NCHW), wrapped_indices(ctx, idx, dims, name)]
    ctx.emit("GatherND", name, ins, [ctx.define(ctx.graph.value(node), Format.NCHW)], None)


# -------------------------------------------------------------------- CumSum
def _lower_cumsum(ctx: LowerContext, node: Node) -> None:
    x, a = _in(ctx.graph, node, 0), _in(ctx.graph, node, 1)
    assert a.const is not None
    name = ctx.op_name(node)
    axis = normalize_axis(int(a.const.reshape(-1)[0]), len(ctx.shape(x)))
    ins = [ctx.tensor(x, Format.NCHW), _i32(ctx, axis, f"{name}__axis")]
    param = Table("CumSum", {"exclusive": bool(node.attrs.exclusive), "reverse": bool(node.attrs.reverse)})
    ctx.emit("CumSum", name, ins, [ctx.define(ctx.graph.value(node), Format.NCHW)], param)


# -------------------------------------------------------------------- OneHot
def _check_onehot(graph: Graph, node: Node) -> str | None:
    idx = _in(graph, node, 0)
    if not idx.type.dtype.is_integer:
        return f"{idx.type.dtype.numpy.name} indices"
    return all_of(_check_const(1, "depth"), _check_const(2, "values"), _check_kinds(2))(graph, node)


def _lower_onehot(ctx: LowerContext, node: Node) -> None:
    idx, depth, vals = (_in(ctx.graph, node, i) for i in range(3))
    assert depth.const is not None and vals.const is not None
    name = ctx.op_name(node)
    n = int(depth.const.reshape(-1)[0])
    off, on = vals.const.reshape(-1)[:2]
    value = ctx.graph.value(node)
    axis = normalize_axis(node.attrs.axis, len(ctx.shape(value)))
    dt = vals.const.dtype if value.type.dtype.is_float else np.int32
    ins = [wrapped_indices(ctx, idx, np.asarray(n, np.int64), name), _i32(ctx, n, f"{name}__depth")]
    ins += [
        ctx.const_tensor(np.asarray(on, dt), f"{name}__on"),
        ctx.const_tensor(np.asarray(off, dt), f"{name}__off"),
    ]
    param = Table("OneHotParam", {"dType": _dtype(vals), "axis": axis}, force=frozenset({"axis"}))
    ctx.emit("OneHot", name, ins, [ctx.define(value, Format.NCHW)], param)


LOWERINGS: dict[str, Lowering] = {
    "TopK": Lowering(_lower_topk, all_of(_check_kinds(0), _check_const(1, "k"), _check_topk_indices)),
    "ArgMax": Lowering(_lower_arg, all_of(_check_kinds(0), _check_arg)),
    "ArgMin": Lowering(_lower_arg, all_of(_check_kinds(0), _check_arg)),
    "Tile": Lowering(_lower_tile, all_of(_check_kinds(0), _check_const(1, "repeats"))),
    "GatherElements": Lowering(_lower_gather_elements, _check_kinds(0)),
    "GatherND": Lowering(_lower_gather_nd, all_of(_check_kinds(0), _check_gather_nd)),
    "CumSum": Lowering(_lower_cumsum, all_of(_check_kinds(0), _check_const(1, "axis"))),
    "OneHot": Lowering(_lower_onehot, _check_onehot),
}
