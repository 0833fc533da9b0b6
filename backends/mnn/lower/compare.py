"""Comparisons, logic and selection: Equal, Less, Greater, LessOrEqual, GreaterOrEqual, Or, Xor,
And, Not, IsNaN, Mod (BinaryOp) and Where (Select).

MNN has no bool tensors: a bool is an int32 0 / 1 (:func:`backends.mnn.lower.context.mnn_dtype`),
which is what MNN's comparison kernels write. The rewrites, with ``T`` the BinaryOp's input type
(float32, or int32 for every integer / bool type):

=================  ==================================================================
Equal(a, b)        BinaryOp EQUAL (likewise LESS, GREATER, LESS_EQUAL, GREATER_EQUAL); for
                   float a, b: Less(a, b) = GREATER(b, a) and Equal(a, b) = MUL(GREATER_EQUAL(a,
                   b), LESS_EQUAL(a, b)) on int32, because MNN 3.6.1's float LESS compares the
                   bit patterns as int32 (observed: -0.54 < -0.62 and 1 < NaN give true) and
                   its float EQUAL compares bits (-0 == 0 false, NaN == NaN true); GREATER,
                   GREATER_EQUAL and LESS_EQUAL are right, NaN and -0 included, except
                   when both float operands broadcast (neither has the output shape, e.g.
                   [2, 1, 5] against [2, 3, 1]): then every float comparison compares the
                   bit patterns as int32 (observed: -0.5 > -0.22 true), so a is first
                   BroadcastTo the output shape (one-sided broadcasts compare floats)
Or / Xor(a, b)     BinaryOp LOGICALOR / LOGICALXOR
And(a, b)          BinaryOp MUL on int32: a * b = a and b for a, b in {0, 1}
Not(a)             BinaryOp EQUAL(a, 0): 1 - a for a in {0, 1}
IsNaN(x)           BinaryOp NOTEQUAL(x, x): true exactly for NaN
Mod(a, b)          BinaryOp MOD: MNN 3.6.1 computes it with the sign of b on int32 (ONNX's
                   fmod = 0) and as C's fmod, with the sign of a, on float32 (ONNX's fmod = 1);
                   observed. (MNN's converter writes fmod = 1 as FLOORMOD, the sign of b: wrong.)
                   An integer fmod = 1 has no MNN op and is refused.
Where(c, x, y)     Select(c, x, y), broadcasting numpy-style; a y that is neither a scalar nor
                   of the output shape is first BroadcastTo the output shape: MNN 3.6.1's
                   Select misreads it when x has the output shape (observed: garbage rows)
=================  ==================================================================

Every operand and result is an NCHW tensor (MNN broadcasts numpy-style there).
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext, mnn_dtype
from backends.mnn.lower.elementwise import binary_table
from backends.mnn.lower.registry import Lowering
from compiler.ir.graph import Graph, Node, Value
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "COMPARE_OPS"]

_OP = fb.BinaryOpOperation
COMPARE_OPS: dict[str, int] = {
    "Equal": _OP.EQUAL,
    "Less": _OP.LESS,
    "Greater": _OP.GREATER,
    "LessOrEqual": _OP.LESS_EQUAL,
    "GreaterOrEqual": _OP.GREATER_EQUAL,
    "Or": _OP.LOGICALOR,
    "Xor": _OP.LOGICALXOR,
    "And": _OP.MUL,
}


def _inputs(graph: Graph, node: Node) -> list[Value]:
    return [v for v in graph.inputs_of(node) if v is not None]


def _is_int(value: Value) -> bool:
    return not value.type.dtype.is_float


def _check_binary(graph: Graph, node: Node) -> str | None:
    for v in _inputs(graph, node):
        dt = mnn_dtype(v.type.dtype)
        if dt not in (fb.DataType.DT_FLOAT, fb.DataType.DT_INT32):
            return f"{v.type.dtype.numpy.name} inputs (MNN compares float32 and int32 tensors)"
    return None


def _emit_binary(ctx: LowerContext, node: Node, kind: int, a: int, b: int, integer: bool) -> None:
    out = ctx.define(ctx.graph.value(node), Format.NCHW)
    ctx.emit("BinaryOp", ctx.op_name(node), [a, b], [out], binary_table(kind, integer))


def _full(ctx: LowerContext, node: Node, a: Value, b: Value, ta: int) -> int:
    """``ta``, BroadcastTo the output shape when a and b are floats that both broadcast."""
    shape = ctx.shape(ctx.graph.value(node))
    if _is_int(a) or ctx.shape(a) == shape or ctx.shape(b) == shape:
        return ta
    name, base = ctx.op_name(node), ctx.graph.value(node).name
    full = ctx.temp(f"{base}__a")
    dims = ctx.const_tensor(np.asarray(shape, np.int32), f"{name}__shape")
    ctx.emit("BroadcastTo", f"{name}__a", [ta, dims], [full], None)
    return full


def _lower_compare(ctx: LowerContext, node: Node) -> None:
    a, b = _inputs(ctx.graph, node)
    ta, tb = ctx.tensor(a, Format.NCHW), ctx.tensor(b, Format.NCHW)
    if node.op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        ta = _full(ctx, node, a, b, ta)
    if _is_int(a) or node.op not in ("Less", "Equal"):
        _emit_binary(ctx, node, COMPARE_OPS[node.op], ta, tb, _is_int(a))
    elif node.op == "Less":  # a < b = b > a (MNN 3.6.1's float LESS compares the bits as int32)
        _emit_binary(ctx, node, _OP.GREATER, tb, ta, False)
    else:  # a == b = (a >= b) * (a <= b) (MNN 3.6.1's float EQUAL compares the bits)
        name, base = ctx.op_name(node), ctx.graph.value(node).name
        ge, le = ctx.temp(f"{base}__ge"), ctx.temp(f"{base}__le")
        ctx.emit("BinaryOp", f"{name}__ge", [ta, tb], [ge], binary_table(_OP.GREATER_EQUAL))
        ctx.emit("BinaryOp", f"{name}__le", [ta, tb], [le], binary_table(_OP.LESS_EQUAL))
        _emit_binary(ctx, node, _OP.MUL, ge, le, True)


def _lower_not(ctx: LowerContext, node: Node) -> None:
    (a,) = _inputs(ctx.graph, node)
    zero = ctx.const_tensor(np.array(0, np.int32), f"{ctx.op_name(node)}__zero")
    _emit_binary(ctx, node, _OP.EQUAL, ctx.tensor(a, Format.NCHW), zero, True)


def _lower_isnan(ctx: LowerContext, node: Node) -> None:
    (a,) = _inputs(ctx.graph, node)
    x = ctx.tensor(a, Format.NCHW)
    _emit_binary(ctx, node, _OP.NOTEQUAL, x, x, False)


def _check_isnan(graph: Graph, node: Node) -> str | None:
    (a,) = _inputs(graph, node)
    return None if mnn_dtype(a.type.dtype) == fb.DataType.DT_FLOAT else f"{a.type.dtype.numpy.name} input"


def _check_mod(graph: Graph, node: Node) -> str | None:
    a = _inputs(graph, node)[0]
    want = fb.DataType.DT_INT32 if node.attrs.fmod == 0 else fb.DataType.DT_FLOAT
    if mnn_dtype(a.type.dtype) != want:
        return f"fmod={node.attrs.fmod} of {a.type.dtype.numpy.name} tensors"
    return None


def _lower_mod(ctx: LowerContext, node: Node) -> None:
    a, b = _inputs(ctx.graph, node)
    kind = _OP.MOD
    ta, tb = ctx.tensor(a, Format.NCHW), ctx.tensor(b, Format.NCHW)
    _emit_binary(ctx, node, kind, ta, tb, _is_int(a))


def _check_where(graph: Graph, node: Node) -> str | None:
    for v in _inputs(graph, node):
        if mnn_dtype(v.type.dtype) not in (fb.DataType.DT_FLOAT, fb.DataType.DT_INT32):
            return f"{v.type.dtype.numpy.name} operands"
    return None


def _lower_where(ctx: LowerContext, node: Node) -> None:
    c, x, y = _inputs(ctx.graph, node)
    value = ctx.graph.value(node)
    name = ctx.op_name(node)
    shape = ctx.shape(value)
    ins = [ctx.tensor(c, Format.NCHW), ctx.tensor(x, Format.NCHW), ctx.tensor(y, Format.NCHW)]
    if ctx.shape(y) != shape and int(np.prod(ctx.shape(y))) != 1:
        # MNN 3.6.1's Select misreads a broadcast y (not a scalar) when x has the full shape
        full = ctx.temp(f"{value.name}__y")
        dims = ctx.const_tensor(np.asarray(shape, np.int32), f"{name}__shape")
        ctx.emit("BroadcastTo", f"{name}__y", [ins[2], dims], [full], None)
        ins[2] = full
    ctx.emit("Select", name, ins, [ctx.define(value, Format.NCHW)], None)


LOWERINGS: dict[str, Lowering] = {
    **{op: Lowering(_lower_compare, _check_binary) for op in COMPARE_OPS},
    "Not": Lowering(_lower_not, _check_binary),
    "IsNaN": Lowering(_lower_isnan, _check_isnan),
    "Mod": Lowering(_lower_mod, _check_mod),
    "Where": Lowering(_lower_where, _check_where),
}
