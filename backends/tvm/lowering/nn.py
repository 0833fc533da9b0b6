"""Pooling, reductions, softmax and dense layers (Gemm, MatMul, kiln::QGemm).

Pooling over blocked ``NCHW{b}c`` tensors arrives as 3-D pooling with a unit
kernel on the lane axis (choose-layout's N-D form) and runs as Kiln's NCHWc pool
kernel; Gemm with a constant weight runs as Kiln's packed dense kernel. kiln::QGemm runs on CPU
as Kiln's packed int8 dense kernel (VNNI / pmaddwd / SDOT, requantize fused); elsewhere it is an
integer product in Relax (``matmul`` of int32 operands, int32 accumulation) and the requantize
epilogue of :mod:`compiler.ops.qgemm` (float64 for an integer output).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.conv import linear_requantize
from backends.tvm.lowering.table import LowerContext, const_inputs, lowers, single_output
from compiler.backend import all_of
from compiler.errors import ConversionError
from compiler.ir.graph import Graph, Node
from compiler.ops.pooling import pool_geometry
from compiler.ops.qconv import qconv_multiplier, qconv_requant_multiplier
from compiler.ops.reduce import reduce_axes
from passes.normalize_gemm import canonical_gemm_reason

__all__: list[str] = []


def _op() -> Any:
    from tvm import relax

    return relax.op


def _in_shape(ctx: LowerContext, node: Node, port: int = 0) -> tuple[int, ...]:
    s = ctx.in_type(node, port).shape or ()
    return tuple(int(d) for d in s)


def _blocked_pool(ctx: LowerContext, node: Node, x: Any, mode: str) -> Any | None:
    """A 5-D pool with unit lane kernel on [N, Cb, H, W, b] through Kiln's NCHWc pool kernel."""
    try:
        from backends.tvm.kernels.pool_nchwc import PoolSpec, pool_kernel
    except ImportError:
        return None
    shape = _in_shape(ctx, node)
    a = node.attrs
    k, s, d, pads, _ = pool_geometry(shape, a)
    if len(shape) != 5 or k[2] != 1 or s[2] != 1 or pads[2] or pads[5] or any(v != 1 for v in d):
        return None
    spec = PoolSpec(
        mode=mode,
        batch=shape[0],
        chunks=shape[1],
        in_h=shape[2],
        in_w=shape[3],
        block=shape[4],
        kernel=(k[0], k[1]),
        strides=(s[0], s[1]),
        pads=(pads[0], pads[1], pads[3], pads[4]),
        ceil_mode=False,  # pool_geometry already extended the end pads
        count_include_pad=bool(getattr(a, "count_include_pad", 0)),
    )
    return ctx.call_kernel(pool_kernel(spec, ctx.target), [x])


def _pool_rank_reason(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    if x is None or x.type.rank not in (4, 5):
        return "only 2-D pooling (or blocked 2-D) lowers to TVM"
    return None


@lowers(
    "MaxPool",
    "AveragePool",
    check=all_of(single_output("MaxPool indices have no TVM lowering"), _pool_rank_reason),
)
def _pool(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    mode = "max" if node.op == "MaxPool" else "avg"
    shape = _in_shape(ctx, node)
    blocked = _blocked_pool(ctx, node, ins[0], mode) if len(shape) == 5 else None
    if blocked is not None:
        return [blocked]
    if len(shape) != 4:
        raise ConversionError(f"{node.describe()}: only 2-D pooling (or blocked 2-D) lowers to TVM")
    k, s, d, pads, _ = pool_geometry(shape, node.attrs)
    fn = _op().nn.max_pool2d if mode == "max" else _op().nn.avg_pool2d
    kw: dict[str, Any] = {}
    if mode == "avg":
        kw["count_include_pad"] = bool(node.attrs.count_include_pad)
    out = fn(ins[0], k, s, (pads[0], pads[1], pads[2], pads[3]), d, ceil_mode=False, **kw)
    return [ctx.emit(out)]


@lowers("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    rank = len(_in_shape(ctx, node))
    axes = list(range(2, rank))
    fn = _op().mean if node.op == "GlobalAveragePool" else _op().max
    return [ctx.emit(fn(ins[0], axes, keepdims=True))]


_REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}


@lowers(*_REDUCE)
def _reduce(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    shape = _in_shape(ctx, node)
    axes = reduce_axes(ctx.input_const(node, 1), len(shape), bool(node.attrs.noop_with_empty_axes))
    if not axes and node.attrs.noop_with_empty_axes:
        return [ins[0]]
    if (
        node.op == "ReduceMean"
        and len(shape) == 5
        and axes == (2, 3)
        and node.attrs.keepdims
        and shape[2] * shape[3] > 1
    ):
        from backends.tvm.kernels.pool_nchwc import PoolSpec, pool_kernel

        spec = PoolSpec("global_avg", shape[0], shape[1], shape[2], shape[3], shape[4])
        return [ctx.call_kernel(pool_kernel(spec, ctx.target), [ins[0]])]
    fn = getattr(_op(), _REDUCE[node.op])
    return [ctx.emit(fn(ins[0], list(axes), keepdims=bool(node.attrs.keepdims)))]


def _reduce_axes_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if len(ins) > 1 and ins[1] is not None and ins[1].const is None:
        return "axes (input 1) must be a constant for --target"
    return None


# op -> (elementwise before, Relax reduction, elementwise after); None = identity
_COMPOSITE_REDUCE: dict[str, tuple[str | None, str, str | None]] = {
    "ReduceL1": ("abs", "sum", None),
    "ReduceL2": ("square", "sum", "sqrt"),
    "ReduceSumSquare": ("square", "sum", None),
    "ReduceLogSum": (None, "sum", "log"),
    "ReduceProd": (None, "prod", None),
}


@lowers(*_COMPOSITE_REDUCE, check=_reduce_axes_reason)
def _composite_reduce(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """post(reduce(pre(x))); with empty axes and noop_with_empty_axes only pre and post apply."""
    op = _op()
    shape = _in_shape(ctx, node)
    axes = reduce_axes(ctx.input_const(node, 1), len(shape), bool(node.attrs.noop_with_empty_axes))
    pre, red, post = _COMPOSITE_REDUCE[node.op]
    y = ins[0] if pre is None else ctx.emit(getattr(op, pre)(ins[0]))
    if axes:
        y = ctx.emit(getattr(op, red)(y, list(axes), keepdims=bool(node.attrs.keepdims)))
    return [y if post is None else ctx.emit(getattr(op, post)(y))]


@lowers("ReduceLogSumExp", check=_reduce_axes_reason)
def _reduce_log_sum_exp(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """m + log(sum(exp(x - m))) with m the max over the axes (no overflow)."""
    op = _op()
    shape = _in_shape(ctx, node)
    axes = reduce_axes(ctx.input_const(node, 1), len(shape), bool(node.attrs.noop_with_empty_axes))
    if not axes:
        return [ins[0]]  # log(exp(x)) elementwise
    m = ctx.emit(op.max(ins[0], list(axes), keepdims=True))
    s = ctx.emit(op.sum(op.exp(op.subtract(ins[0], m)), list(axes), keepdims=True))
    y = ctx.emit(op.add(op.log(s), m))
    return [y if node.attrs.keepdims else ctx.emit(op.reshape(y, ctx.out_shape(node)))]


@lowers("Softmax", "LogSoftmax")
def _softmax(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """CPU, float32, last axis: Kiln's row kernel (:mod:`backends.tvm.kernels.row_softmax`, one
    read of x and one write of y); otherwise Relax's (log_)softmax (fast_math's legalization)."""
    shape = _in_shape(ctx, node)
    rank = len(shape)
    axis = int(node.attrs.axis) % rank
    width = shape[-1] if shape else 1
    lanes = ctx.target.lanes
    vec = next((w for w in (lanes, lanes // 2, 4) if w >= 4 and width % w == 0), lanes)
    f32 = ctx.in_type(node, 0).dtype.numpy.name == "float32"
    if node.op == "Softmax" and ctx.target.is_cpu and f32 and axis == rank - 1 and width >= vec:
        from backends.tvm.kernels.row_softmax import RowSoftmaxSpec, row_softmax_kernel

        op = _op()
        rows = int(np.prod(shape[:-1])) if rank > 1 else 1
        x2 = ins[0] if rank == 2 else ctx.emit(op.reshape(ins[0], (rows, width)))
        y = ctx.call_kernel(row_softmax_kernel(RowSoftmaxSpec(rows, width, vec), ctx.target), [x2])
        return [y if rank == 2 else ctx.emit(op.reshape(y, shape))]
    fn = _op().nn.softmax if node.op == "Softmax" else _op().nn.log_softmax
    return [ctx.emit(fn(ins[0], axis))]


def _gemm_reason(graph: Graph, node: Node) -> str | None:
    return canonical_gemm_reason(node)


@lowers("Gemm", check=_gemm_reason)
def _gemm(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """y = A @ B' + C for the canonical Gemm (normalize-gemm: transA = 0, alpha = beta = 1)."""
    a = node.attrs
    op = _op()
    w = ctx.input_const(node, 1)
    c = ctx.input_const(node, 2) if len(ins) > 2 and ins[2] is not None else None
    x = ins[0]
    out_shape = ctx.out_shape(node)
    bias_ok = c is None or c.size in (1, out_shape[1]) and (c.ndim < 2 or c.shape[0] == 1)
    cpu = ctx.target.is_cpu  # GPUs take the Relax matmul (dlight's GEMV/matmul rules)
    if cpu and w is not None and bias_ok:
        w_nk = w if a.transB else w.T
        try:
            from backends.tvm.kernels.dense import DenseSpec, dense_kernel, pack_dense_bias, pack_dense_weight
        except ImportError:
            pass
        else:
            m, k = _in_shape(ctx, node)
            spec = DenseSpec(m=m, k=k, n=out_shape[1], has_bias=c is not None, block=ctx.target.lanes)
            args = [x, ctx.const(pack_dense_weight(np.asarray(w_nk, np.float32), spec))]
            if c is not None:
                bias = np.broadcast_to(c.astype(np.float32).reshape(-1), (out_shape[1],))
                args.append(ctx.const(pack_dense_bias(np.ascontiguousarray(bias), spec)))
            return [ctx.call_kernel(dense_kernel(spec, ctx.target), args)]
    wt = ctx.emit(op.permute_dims(ins[1], [1, 0])) if a.transB else ins[1]
    if w is not None:
        wt = ctx.const(np.ascontiguousarray(w if not a.transB else w.T).astype(w.dtype))
    y = ctx.emit(op.matmul(x, wt))
    if len(ins) > 2 and ins[2] is not None:
        y = ctx.emit(op.add(y, ins[2]))
    return [y]


@lowers("MatMul")
def _matmul(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [ctx.emit(_op().matmul(ins[0], ins[1]))]


def _qdense(ctx: LowerContext, node: Node, x: Any, w_kn: np.ndarray, bias: np.ndarray | None) -> Any:
    """kiln::QGemm as Kiln's packed int8 dense kernel on ``x`` flattened to ``[prod(lead), K]``."""
    from backends.tvm.kernels.dense_int8 import qdense_kernel, qdense_spec
    from backends.tvm.kernels.qdense_spec import pack_qdense_bias, pack_qdense_multiplier, pack_qdense_weight

    a = node.attrs
    op = _op()
    shape = _in_shape(ctx, node)
    k, n = (int(d) for d in w_kn.shape)
    m = int(np.prod(shape[:-1]))
    in_dtype = np.dtype(ctx.in_type(node, 0).dtype.numpy).name
    spec = qdense_spec(m, k, n, ctx.target, in_dtype, int(a.x_zero), a.out_dtype, int(a.y_zero))
    args = [
        x if len(shape) == 2 else ctx.emit(op.reshape(x, (m, k))),
        ctx.const(pack_qdense_weight(w_kn, spec)),
        ctx.const(pack_qdense_bias(bias, w_kn, spec)),
        ctx.const(pack_qdense_multiplier(float(a.x_scale), tuple(a.w_scales), float(a.y_scale), spec)),
    ]
    y = ctx.call_kernel(qdense_kernel(spec, ctx.target), args)
    return y if len(shape) == 2 else ctx.emit(op.reshape(y, ctx.out_shape(node)))


@lowers("kiln::QGemm", check=const_inputs((1, "weight")))
def _qgemm(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """CPU: Kiln's int8 dense kernel (:mod:`backends.tvm.kernels.dense_int8`); otherwise an int32
    Relax ``matmul`` and the requantize epilogue."""
    a = node.attrs
    op = _op()
    w = ctx.require_const(node, 1, "weight")
    w_kn = np.ascontiguousarray(w.T if a.trans_b else w)
    bias = ctx.require_const(node, 2, "bias") if len(ins) > 2 and ins[2] is not None else None
    if ctx.target.is_cpu:
        return [_qdense(ctx, node, ins[0], w_kn.astype(np.int8), bias)]
    n = int(w_kn.shape[1])
    x = ctx.emit(op.subtract(op.astype(ins[0], "int32"), ctx.scalar(int(a.x_zero), "int32")))
    acc = ctx.emit(op.matmul(x, ctx.const(w_kn.astype(np.int32)), out_dtype="int32"))
    if bias is not None:
        acc = ctx.emit(op.add(acc, ctx.const(bias.astype(np.int32))))
    if a.out_dtype == "float32":
        mult = np.broadcast_to(qconv_multiplier(float(a.x_scale), tuple(a.w_scales)), (n,))
        return [ctx.emit(op.multiply(op.astype(acc, "float32"), ctx.const(np.ascontiguousarray(mult))))]
    m = np.broadcast_to(qconv_requant_multiplier(float(a.x_scale), tuple(a.w_scales), float(a.y_scale)), (n,))
    bounds = (-np.inf, np.inf)
    return [linear_requantize(ctx, acc, np.ascontiguousarray(m), bounds, int(a.y_zero), a.out_dtype)]


_GRID_METHOD = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}


def _grid_sample_reason(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    return None if x.type.rank == 4 else "only 2-D GridSample (4-D X) lowers to TVM"


@lowers("GridSample", check=_grid_sample_reason)
def _grid_sample(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """TOPI's grid_sample on the grid moved to [N, 2, Ho, Wo]."""
    op = _op()
    a = node.attrs
    grid = ctx.emit(op.permute_dims(ins[1], [0, 3, 1, 2]))
    y = op.image.grid_sample(
        ins[0], grid, _GRID_METHOD[a.mode], "NCHW", a.padding_mode, bool(a.align_corners)
    )
    return [ctx.emit(y)]
