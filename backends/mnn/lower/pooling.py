"""Pooling and reductions: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool -> Pooling;
ReduceMean/Max/Min/Sum/Prod -> Reduction.

``Pool.ceilModel`` defaults to Caffe's ceil rounding, so Kiln always writes it. ONNX
``count_include_pad`` 0 is MNN's DEFAULT count type (it excludes padding), 1 is
INCLUDE_PADDING. A global pool is ``Pool{isGlobal}`` (MNN's converter writes Pooling3D, which
is only right on NC4HW4 input). A ReduceMean/ReduceMax over H and W of a 4-D tensor with
keepdims is the same global pool and is written as one, on NC4HW4.
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType
from compiler.ops.pooling import pool_geometry
from compiler.ops.shapes import normalize_axes, resolve_pads, window_params
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "REDUCTIONS"]

REDUCTIONS: dict[str, int] = {
    "ReduceMean": fb.ReductionType.MEAN,
    "ReduceMax": fb.ReductionType.MAXIMUM,
    "ReduceMin": fb.ReductionType.MINIMUM,
    "ReduceSum": fb.ReductionType.SUM,
    "ReduceProd": fb.ReductionType.PROD,
}
_GLOBAL = {"GlobalAveragePool": fb.PoolType.AVEPOOL, "GlobalMaxPool": fb.PoolType.MAXPOOL}
_AS_POOL = {"ReduceMean": fb.PoolType.AVEPOOL, "ReduceMax": fb.PoolType.MAXPOOL}


def _global_pool(kind: int) -> Table:
    return Table(
        "Pool",
        {"isGlobal": True, "type": kind, "padType": fb.PoolPadType.CAFFE, "ceilModel": False},
        force=frozenset({"type", "ceilModel"}),
    )


def _emit_pool(ctx: LowerContext, node: Node, param: Table) -> None:
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    x = ctx.tensor(x_value, Format.NC4HW4)
    out = ctx.define(ctx.graph.value(node), Format.NC4HW4)
    ctx.emit("Pooling", ctx.op_name(node), [x], [out], param)


def _check_pool(graph: Graph, node: Node) -> str | None:
    if len(node.output_types) > 1 and graph.users(graph.value(node, 1)):
        return "the indices output"
    x = graph.inputs_of(node)[0]
    assert x is not None
    if len(x.type.static_shape) != 4:
        return "2-D pooling only"
    if not x.type.dtype.is_float:
        return "float tensors only"
    a = node.attrs
    if node.op in ("MaxPool", "AveragePool") and any(d != 1 for d in (a.dilations or ())):
        return "dilations"
    return None


def _lower_pool(ctx: LowerContext, node: Node) -> None:
    a = node.attrs
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    shape = ctx.shape(x_value)
    kernel = tuple(a.kernel_shape)
    strides, dilations, pads = window_params(2, kernel, a.strides, a.dilations, a.pads)
    pads = resolve_pads(a.auto_pad, shape[2:], kernel, strides, dilations, pads)
    pool_geometry(shape, a)  # validates the window against the input
    fields: dict[str, object] = {
        "padX": int(pads[1]),
        "padY": int(pads[0]),
        "kernelX": int(kernel[1]),
        "kernelY": int(kernel[0]),
        "strideX": int(strides[1]),
        "strideY": int(strides[0]),
        "type": fb.PoolType.MAXPOOL if node.op == "MaxPool" else fb.PoolType.AVEPOOL,
        "padType": fb.PoolPadType.CAFFE,
        "ceilModel": bool(a.ceil_mode),
        "pads": np.asarray(pads, np.int32),
    }
    if node.op == "AveragePool" and a.count_include_pad:
        fields["countType"] = fb.AvgPoolCountType.INCLUDE_PADDING
    _emit_pool(ctx, node, Table("Pool", fields, force=frozenset({"type", "ceilModel"})))


def _lower_global(ctx: LowerContext, node: Node) -> None:
    _emit_pool(ctx, node, _global_pool(_GLOBAL[node.op]))


# ------------------------------------------------------------------ reductions
def _axes(graph: Graph, node: Node) -> list[int] | None:
    ins = graph.inputs_of(node)
    x = ins[0]
    assert x is not None
    rank = len(x.type.static_shape)
    axes_value = ins[1] if len(ins) > 1 else None
    if axes_value is None:
        return [] if node.attrs.noop_with_empty_axes else list(range(rank))
    c = axes_value.const
    if c is None:
        return None
    if c.size == 0:
        return [] if node.attrs.noop_with_empty_axes else list(range(rank))
    return sorted(normalize_axes([int(v) for v in c.reshape(-1)], rank))


def _check_reduce(graph: Graph, node: Node) -> str | None:
    if _axes(graph, node) is None:
        return "axes must be constant"
    dt = node.output_types[0].dtype
    return None if dt.is_float or dt == DType.INT32 else "float and int32 tensors only"


def _lower_reduce(ctx: LowerContext, node: Node) -> None:
    axes = _axes(ctx.graph, node)
    assert axes is not None
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    value = ctx.graph.value(node)
    if not axes:
        ctx.alias(value, x_value)
        return
    shape = ctx.shape(x_value)
    if node.op in _AS_POOL and len(shape) == 4 and axes == [2, 3] and node.attrs.keepdims:
        _emit_pool(ctx, node, _global_pool(_AS_POOL[node.op]))
        return
    x = ctx.tensor(x_value, Format.NCHW)
    out = ctx.define(value, Format.NCHW)
    param = Table(
        "ReductionParam",
        {
            "operation": REDUCTIONS[node.op],
            "dim": np.asarray(axes, np.int32),
            "keepDims": bool(node.attrs.keepdims),
            "dType": fb.DataType.DT_FLOAT if value.type.dtype.is_float else fb.DataType.DT_INT32,
        },
        force=frozenset({"operation", "keepDims"}),
    )
    ctx.emit("Reduction", ctx.op_name(node), [x], [out], param)


LOWERINGS: dict[str, Lowering] = {
    "MaxPool": Lowering(_lower_pool, _check_pool),
    "AveragePool": Lowering(_lower_pool, _check_pool),
    "GlobalAveragePool": Lowering(_lower_global, _check_pool),
    "GlobalMaxPool": Lowering(_lower_global, _check_pool),
    **{op: Lowering(_lower_reduce, _check_reduce) for op in REDUCTIONS},
}
