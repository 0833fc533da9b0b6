"""Shape and layout ops: Reshape, Flatten, Squeeze, Unsqueeze (all Reshape to the static
output shape), Transpose (Permute), Concat, Softmax, Cast, Expand (BroadcastTo to the static
output shape, an int32 constant; MNN 3.6.1's runtime runs it), Identity and Dropout (aliases).

All shapes are static by the time Kiln writes MNN, so every reshape-like op becomes one
``Reshape{dims = output shape, dimType NCHW}``; NCHW is what gives ONNX semantics. A reshape
that keeps the last dim N (and the product P of the others) keeps its input's packed
[P, N, 1, 1] form (:meth:`~backends.mnn.lower.context.LowerContext.rows_view`).
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext, mnn_dtype
from backends.mnn.lower.elementwise import shared_format
from backends.mnn.lower.linear import reshape_table
from backends.mnn.lower.quant import emit_int8_to_float, from_quantize
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType
from compiler.ops.shapes import normalize_axis
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS"]


def _first(ctx: LowerContext, node: Node) -> int:
    x = ctx.graph.inputs_of(node)[0]
    assert x is not None
    return ctx.tensor(x, Format.NCHW)


def _lower_reshape(ctx: LowerContext, node: Node) -> None:
    x = _first(ctx, node)
    value = ctx.graph.value(node)
    out = ctx.define(value, Format.NCHW)
    ctx.emit("Reshape", ctx.op_name(node), [x], [out], reshape_table(ctx.shape(value)))
    # a reshape that keeps the last dim keeps the [P, N, 1, 1] packed form of its input
    src = ctx.graph.inputs_of(node)[0]
    assert src is not None
    rows = ctx.rows_view(src)
    if rows is not None and ctx.shape(value)[-1:] == ctx.shape(src)[-1:] and len(ctx.shape(value)) >= 2:
        ctx.set_rows_view(value, rows)


def _lower_transpose(ctx: LowerContext, node: Node) -> None:
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    rank = len(ctx.shape(x_value))
    perm = node.attrs.perm if node.attrs.perm is not None else tuple(range(rank - 1, -1, -1))
    x = ctx.tensor(x_value, Format.NCHW)
    out = ctx.define(ctx.graph.value(node), Format.NCHW)
    ctx.emit("Permute", ctx.op_name(node), [x], [out], Table("Permute", {"dims": np.asarray(perm, np.int32)}))


def _lower_concat(ctx: LowerContext, node: Node) -> None:
    ins = [v for v in ctx.graph.inputs_of(node) if v is not None]
    value = ctx.graph.value(node)
    rank = len(ctx.shape(value))
    fmt = shared_format(ctx, ins, rank) if all(v.const is None for v in ins) else Format.NCHW
    tensors = [ctx.tensor(v, fmt) for v in ins]
    out = ctx.define(value, fmt)
    axis = normalize_axis(node.attrs.axis, rank)
    ctx.emit(
        "Concat", ctx.op_name(node), tensors, [out], Table("Axis", {"axis": axis}, force=frozenset({"axis"}))
    )


def _lower_softmax(ctx: LowerContext, node: Node) -> None:
    x = _first(ctx, node)
    value = ctx.graph.value(node)
    axis = normalize_axis(node.attrs.axis, len(ctx.shape(value)))
    out = ctx.define(value, Format.NCHW)
    ctx.emit(
        "Softmax", ctx.op_name(node), [x], [out], Table("Axis", {"axis": axis}, force=frozenset({"axis"}))
    )


def _lower_identity(ctx: LowerContext, node: Node) -> None:
    x = ctx.graph.inputs_of(node)[0]
    assert x is not None
    ctx.alias(ctx.graph.value(node), x)


def _check_cast(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if mnn_dtype(x.type.dtype) is None or mnn_dtype(node.output_types[0].dtype) is None:
        return f"{x.type.dtype.numpy.name} -> {node.output_types[0].dtype.numpy.name}"
    return None


def _lower_cast(ctx: LowerContext, node: Node) -> None:
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    value = ctx.graph.value(node)
    src, dst = mnn_dtype(x_value.type.dtype), mnn_dtype(value.type.dtype)
    if src == dst and not (value.type.dtype == DType.BOOL) ^ (x_value.type.dtype == DType.BOOL):
        ctx.alias(value, x_value)
        return
    if dst == fb.DataType.DT_FLOAT and from_quantize(ctx, node):
        # the int8 tensor of an MNN FloatToInt8 (packed int8): widen it with Int8ToFloat
        emit_int8_to_float(ctx, node, 1.0, 0)
        return
    fmt = ctx.format_of(x_value)
    x = ctx.tensor(x_value, fmt)
    out = ctx.define(value, fmt)
    if value.type.dtype == DType.BOOL:
        dst = fb.DataType.DT_BOOL
    ctx.emit("Cast", ctx.op_name(node), [x], [out], Table("CastParam", {"srcT": src, "dstT": dst}))


def _check_expand(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if mnn_dtype(x.type.dtype) is None:
        return f"dtype {x.type.dtype.numpy.name} has no MNN tensor"
    return None


def _lower_expand(ctx: LowerContext, node: Node) -> None:
    x = _first(ctx, node)
    value = ctx.graph.value(node)
    name = ctx.op_name(node)
    shape = ctx.const_tensor(np.asarray(ctx.shape(value), np.int32), f"{name}__shape")
    ctx.emit("BroadcastTo", name, [x, shape], [ctx.define(value, Format.NCHW)], None)


def _check_dropout(graph: Graph, node: Node) -> str | None:
    if node.num_outputs > 1 and graph.users(graph.value(node, 1)):
        return "the mask output"
    return None


LOWERINGS: dict[str, Lowering] = {
    **{op: Lowering(_lower_reshape) for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")},
    "Transpose": Lowering(_lower_transpose),
    "Concat": Lowering(_lower_concat),
    "Softmax": Lowering(_lower_softmax),
    "Cast": Lowering(_lower_cast, _check_cast),
    "Expand": Lowering(_lower_expand, _check_expand),
    "Identity": Lowering(_lower_identity),
    "Dropout": Lowering(_lower_identity, _check_dropout),
}
