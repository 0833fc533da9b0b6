"""Broadcasting binary ops: Add, Sub, Mul, Div, Pow, Max, Min, Sum -> BinaryOp.

Layout: NC4HW4 when every variable input is a 4-D tensor already produced in NC4HW4 (a
residual add or a squeeze-excitation multiply between convs) and any constant is a
scalar; otherwise NCHW, where MNN broadcasts numpy-style. A fully connected layer's output
times (plus, ...) a scalar constant runs on the layer's packed [P, N, 1, 1] form and keeps it
(:meth:`~backends.mnn.lower.context.LowerContext.rows_view`), as does an op of two such outputs of
the same shape (the tanh GELU's x + c x^3). Variadic Max/Min/Sum become a chain of two-input ops.

x * 1, x / 1, x + 0 and x - 0 (float, the constant a scalar, the result x's shape) write no op:
the result is x's tensor (whisper's attention scales its [1, 6, 1500, 1500] scores by 1.0).

Pow by the constant 2 or 3 is written as multiplications, x^2 = x * x and x^3 = (x * x) * x
(float only; within an ulp or two of pow): MNN 3.6.1's POW kernel calls pow per element (observed
80 us for a [1, 32, 512] tensor against 3 us for a MUL, albert's tanh GELU).
"""

from __future__ import annotations

import numpy as np

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


# ops that are finite on the packed form's zero channel padding only for some constant right operands
_ZERO_UNSAFE = frozenset({fb.BinaryOpOperation.REALDIV, fb.BinaryOpOperation.POW})


def _safe_at_zero(kind: int, v: Value) -> bool:
    """0 / c finite (c != 0), or 0 ** c finite (c > 0)."""
    c = v.const
    if c is None:
        return False
    return bool(np.all(c != 0)) if kind == fb.BinaryOpOperation.REALDIV else bool(np.all(c > 0))


def _lower_on_rows(ctx: LowerContext, ins: list[Value], value: Value, kind: int, name: str) -> bool:
    """``x op c`` / ``c op x`` (float, c a scalar constant) on x's packed [P, N, 1, 1] form, when x
    has one (a fully connected layer's output), or ``x op y`` with both packed and of the result's
    shape: the result keeps that form; True if emitted."""
    if len(ins) != 2 or not value.type.dtype.is_float or ctx.int8_form:
        return False
    scalar = [v.const is not None and v.const.size == 1 for v in ins]
    variables = [v for v, c in zip(ins, scalar, strict=True) if not c]
    if not variables or any(v.const is not None for v in variables):
        return False
    if any(ctx.rows_view(v) is None or ctx.shape(v) != ctx.shape(value) for v in variables):
        return False
    if kind in _ZERO_UNSAFE and not (scalar[1] and _safe_at_zero(kind, ins[1])):
        return False  # 0 / 0 or 0 ** -1 in the zero channel padding would reach the next conv
    operands = [
        operand(ctx, v, Format.NC4HW4, name) if c else ctx.rows_view(v)
        for v, c in zip(ins, scalar, strict=True)
    ]
    packed = ctx.temp(f"{value.name}__rows")
    tensors = [t for t in operands if t is not None]
    ctx.emit("BinaryOp", f"{name}__rows", tensors, [packed], binary_table(kind))
    ctx.define_rows(value, packed, name)
    return True


_NEUTRAL = {"Mul": 1.0, "Div": 1.0, "Add": 0.0, "Sub": 0.0}


def _identity_operand(ctx: LowerContext, node: Node, ins: list[Value]) -> Value | None:
    """x when ``node`` is x * 1, 1 * x, x / 1, x + 0, 0 + x or x - 0 (float, of x's shape), else None."""
    value = ctx.graph.value(node)
    neutral = _NEUTRAL.get(node.op)
    if neutral is None or len(ins) != 2 or not value.type.dtype.is_float:
        return None
    commutes = node.op in ("Mul", "Add")
    for x, c in ((ins[0], ins[1]), (ins[1], ins[0])) if commutes else ((ins[0], ins[1]),):
        k = c.const
        if x.const is None and k is not None and k.size == 1 and float(k.reshape(-1)[0]) == neutral:
            return x if x.type == value.type else None
    return None


def _small_power(graph: Graph, node: Node) -> int | None:
    """2 or 3 when ``node`` is a float Pow by that scalar constant, else None."""
    if node.op != "Pow" or not node.output_types[0].dtype.is_float:
        return None
    e = graph.inputs_of(node)[1]
    c = None if e is None else e.const
    if c is None or c.size != 1:
        return None
    p = float(c.reshape(-1)[0])
    return int(p) if p in (2.0, 3.0) else None


def _lower_power(ctx: LowerContext, node: Node, power: int) -> None:
    """x^2 = x * x, x^3 = (x * x) * x, in x's layout (or on its packed rows)."""
    x_value = ctx.graph.inputs_of(node)[0]
    assert x_value is not None
    value = ctx.graph.value(node)
    name = ctx.op_name(node)
    mul = binary_table(fb.BinaryOpOperation.MUL)
    rows = None if ctx.int8_form or ctx.shape(x_value) != ctx.shape(value) else ctx.rows_view(x_value)
    fmt = Format.NC4HW4 if rows is not None else ctx.format_of(x_value)
    x = rows if rows is not None else ctx.tensor(x_value, fmt)
    last = ctx.temp(f"{value.name}__rows") if rows is not None else ctx.define(value, fmt)
    if power == 2:
        ctx.emit("BinaryOp", f"{name}__rows" if rows is not None else name, [x, x], [last], mul)
    else:
        sq = ctx.temp(f"{value.name}__sq")
        ctx.emit("BinaryOp", f"{name}__sq", [x, x], [sq], mul)
        ctx.emit("BinaryOp", f"{name}__rows" if rows is not None else name, [sq, x], [last], mul)
    if rows is not None:
        ctx.define_rows(value, last, name)


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
    same = None if ctx.int8_form else _identity_operand(ctx, node, ins)
    if same is not None:
        ctx.alias(value, same)
        rows = ctx.rows_view(same)
        if rows is not None:
            ctx.set_rows_view(value, rows)
        return
    power = _small_power(ctx.graph, node)
    if power is not None and ctx.shape(ins[0]) == ctx.shape(value):
        _lower_power(ctx, node, power)
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
