"""Broadcasting binary ops: Add, Sub, Mul, Div, Pow, Max, Min, Sum -> BinaryOp.

Layout: NC4HW4 when every variable input is a 4-D tensor already produced in NC4HW4 (a
residual add or a squeeze-excitation multiply between convs) and any constant is a
scalar; otherwise NCHW, where MNN broadcasts numpy-style. A fully connected layer's output
times (plus, ...) a scalar constant runs on the layer's packed [P, N, 1, 1] form and keeps it
(:meth:`~backends.mnn.lower.context.LowerContext.rows_view`). Variadic Max/Min/Sum become a
chain of two-input ops.
"""

from __future__ import annotations

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node, Value
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "BINARY_OPS", "binary_table", "shared_format"]

BINARY_OPS: dict[str, int] = {
    "Add": fb.BinaryOpOperation.ADD,
    "Sum": fb.BinaryOpOperation.ADD,
    "Sub": fb.BinaryOpOperation.SUB,
    "Mul": fb.BinaryOpOperation.MUL,
    "Div": fb.BinaryOpOperation.REALDIV,  # float only (see _INT_OK); MNN 3.6.1 cannot create a float DIV
    "Pow": fb.BinaryOpOperation.POW,
    "Max": fb.BinaryOpOperation.MAXIMUM,
    "Min": fb.BinaryOpOperation.MINIMUM,
}
_INT_OK = frozenset({"Add", "Sum", "Sub", "Mul", "Max", "Min"})


def binary_table(kind: int, integer: bool = False, relu: bool = False) -> Table:
    """A ``BinaryOp`` parameter (``relu`` fuses a ReLU on the result)."""
    fields: dict[str, object] = {
        "opType": kind,
        "T": fb.DataType.DT_INT32 if integer else fb.DataType.DT_FLOAT,
    }
    if relu:
        fields["activationType"] = 1
    return Table("BinaryOp", fields, force=frozenset({"opType"}))


def shared_format(ctx: LowerContext, inputs: list[Value], out_rank: int) -> Format:
    """NC4HW4 if all variable inputs are 4-D NC4HW4 tensors and constants are scalars, else NCHW."""
    variables = [v for v in inputs if v.const is None]
    if out_rank != 4 or not variables:
        return Format.NCHW
    if any(v.const is not None and v.const.size != 1 for v in inputs):
        return Format.NCHW
    ok = all(len(ctx.shape(v)) == 4 and ctx.format_of(v) == Format.NC4HW4 for v in variables)
    return Format.NC4HW4 if ok else Format.NCHW


def operand(ctx: LowerContext, value: Value, fmt: Format, base: str) -> int:
    """The tensor of an operand in ``fmt`` (a scalar constant stays a 0-d NCHW constant)."""
    c = value.const
    if fmt == Format.NC4HW4 and c is not None:
        return ctx.const_tensor(c.reshape(()), f"{base}__scalar")
    return ctx.tensor(value, fmt)


def _lower_on_rows(ctx: LowerContext, ins: list[Value], value: Value, kind: int, name: str) -> bool:
    """``x op c`` / ``c op x`` (float, c a scalar constant) on x's packed [P, N, 1, 1] form, when x
    has one (a fully connected layer's output): the result keeps that form; True if emitted."""
    if len(ins) != 2 or not value.type.dtype.is_float or ctx.int8_form:
        return False
    consts = [v.const is not None and v.const.size == 1 for v in ins]
    if consts.count(True) != 1:
        return False
    x = ins[consts.index(False)]
    rows = ctx.rows_view(x)
    if rows is None or ctx.shape(x) != ctx.shape(value):
        return False
    operands = [rows if v is x else operand(ctx, v, Format.NC4HW4, name) for v in ins]
    packed = ctx.temp(f"{value.name}__rows")
    ctx.emit("BinaryOp", f"{name}__rows", operands, [packed], binary_table(kind))
    ctx.define_rows(value, packed, name)
    return True


def _check(graph: Graph, node: Node) -> str | None:
    dt = node.output_types[0].dtype
    if dt.is_float or (node.op in _INT_OK and dt.is_integer):
        return None
    return f"{dt.numpy.name} tensors"


def _lower(ctx: LowerContext, node: Node) -> None:
    ins = [v for v in ctx.graph.inputs_of(node) if v is not None]
    value = ctx.graph.value(node)
    name = ctx.op_name(node)
    integer = not value.type.dtype.is_float
    if len(ins) == 1:
        ctx.alias(value, ins[0])
        return
    kind = BINARY_OPS[node.op]
    if _lower_on_rows(ctx, ins, value, kind, name):
        return
    fmt = shared_format(ctx, ins, len(ctx.shape(value)))
    acc = operand(ctx, ins[0], fmt, name)
    for i, v in enumerate(ins[1:], start=1):
        last = i == len(ins) - 1
        out = ctx.define(value, fmt) if last else ctx.temp(f"{value.name}__{i}")
        rhs = operand(ctx, v, fmt, name)
        ctx.emit("BinaryOp", name if last else f"{name}__{i}", [acc, rhs], [out], binary_table(kind, integer))
        acc = out


LOWERINGS: dict[str, Lowering] = {op: Lowering(_lower, _check) for op in BINARY_OPS}
