"""The Elemwise mode table: each supported MegEngine mode as a small composition of Kiln ops.

Every row is ``mode: (arity, builder)``; a builder maps the input values to the
output value. Broadcasting is numpy's in both systems. Modes with MegEngine
semantics that differ from the nearest ONNX op are spelled out:

* ROUND rounds half away from zero: sign(x) * floor(|x| + 1/2);
* FLOOR_DIV on integers floors (ONNX Div truncates): q = a / b, minus one where
  the remainder a - q*b is non-zero and has the sign opposite to b;
* MOD on integers is C's remainder (sign of the dividend): a - trunc(a / b) * b;
* FAST_TANH is MegEngine's rational approximation x (27 + x^2) / (27 + 9 x^2);
* H_SWISH = x relu6(x + 3) / 6, HSIGMOID = relu6(x + 3) / 6, GELU = x Phi(x).

Comparisons give bool; TRUE_DIV of integers gives float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from compiler.ir.graph import Value
from compiler.ir.types import DType
from frontends.megengine.converter import OprContext

__all__ = ["Builder", "MODES", "BOOL_MODES"]

Builder = Callable[[OprContext, list[Value]], Value]


def _op(name: str, **attrs: object) -> Builder:
    return lambda ctx, xs: ctx.emit1(name, xs, attrs or None)


def _then(first: Builder, name: str) -> Builder:
    return lambda ctx, xs: ctx.emit1(name, [first(ctx, xs)])


def _k(ctx: OprContext, like: Value, v: float) -> Value:
    return ctx.scalar_like(like, v, "k")


def _relu6(ctx: OprContext, x: Value) -> Value:
    return ctx.emit1("Clip", [x, _k(ctx, x, 0.0), _k(ctx, x, 6.0)])


def _fast_tanh(ctx: OprContext, xs: list[Value]) -> Value:
    x = xs[0]
    x2 = ctx.emit1("Mul", [x, x])
    num = ctx.emit1("Mul", [x, ctx.emit1("Add", [x2, _k(ctx, x, 27.0)])])
    den = ctx.emit1("Add", [ctx.emit1("Mul", [x2, _k(ctx, x, 9.0)]), _k(ctx, x, 27.0)])
    return ctx.emit1("Div", [num, den])


def _round(ctx: OprContext, xs: list[Value]) -> Value:
    x = xs[0]
    half = ctx.emit1("Floor", [ctx.emit1("Add", [ctx.emit1("Abs", [x]), _k(ctx, x, 0.5)])])
    neg = ctx.emit1("Less", [x, _k(ctx, x, 0.0)])
    return ctx.emit1("Where", [neg, ctx.emit1("Neg", [half]), half])


def _sign(ctx: OprContext, xs: list[Value]) -> Value:
    x = xs[0]
    to = {"to": int(x.type.dtype)}
    pos = ctx.emit1("Cast", [ctx.emit1("Greater", [x, _k(ctx, x, 0.0)])], to)
    neg = ctx.emit1("Cast", [ctx.emit1("Less", [x, _k(ctx, x, 0.0)])], to)
    return ctx.emit1("Sub", [pos, neg])


def _trunc_div(ctx: OprContext, a: Value, b: Value) -> Value:
    if not a.type.dtype.is_integer:
        raise ctx.fail(f"integer division of {a.type.dtype.short} values is not supported")
    return ctx.emit1("Div", [a, b])


def _floor_div(ctx: OprContext, xs: list[Value]) -> Value:
    a, b = xs
    if a.type.dtype.is_float:
        return ctx.emit1("Floor", [ctx.emit1("Div", [a, b])])
    q = _trunc_div(ctx, a, b)
    r = ctx.emit1("Sub", [a, ctx.emit1("Mul", [q, b])])
    zero = _k(ctx, a, 0)
    inexact = ctx.emit1("Not", [ctx.emit1("Equal", [r, zero])])
    opposite = ctx.emit1("Xor", [ctx.emit1("Less", [r, zero]), ctx.emit1("Less", [b, zero])])
    fix = ctx.emit1("And", [inexact, opposite])
    return ctx.emit1("Where", [fix, ctx.emit1("Sub", [q, _k(ctx, a, 1)]), q])


def _mod(ctx: OprContext, xs: list[Value]) -> Value:
    a, b = xs
    return ctx.emit1("Sub", [a, ctx.emit1("Mul", [_trunc_div(ctx, a, b), b])])


def _true_div(ctx: OprContext, xs: list[Value]) -> Value:
    a, b = xs
    if not a.type.dtype.is_float:
        f32 = {"to": int(DType.FLOAT32)}
        a, b = ctx.emit1("Cast", [a], f32), ctx.emit1("Cast", [b], f32)
    return ctx.emit1("Div", [a, b])


def _fuse_add(act: Builder) -> Builder:
    return lambda ctx, xs: act(ctx, [ctx.emit1("Add", xs)])


def _silu(ctx: OprContext, xs: list[Value]) -> Value:
    return ctx.emit1("Mul", [xs[0], ctx.emit1("Sigmoid", xs)])


def _gelu(ctx: OprContext, xs: list[Value]) -> Value:
    x = xs[0]
    e = ctx.emit1("Erf", [ctx.emit1("Mul", [x, _k(ctx, x, 1.0 / math.sqrt(2.0))])])
    return ctx.emit1("Mul", [ctx.emit1("Mul", [x, _k(ctx, x, 0.5)]), ctx.emit1("Add", [e, _k(ctx, x, 1.0)])])


def _hsigmoid(ctx: OprContext, xs: list[Value]) -> Value:
    return ctx.emit1("HardSigmoid", xs, {"alpha": 1.0 / 6.0, "beta": 0.5})


def _log_sum_exp(ctx: OprContext, xs: list[Value]) -> Value:
    a, b = xs
    d = ctx.emit1("Neg", [ctx.emit1("Abs", [ctx.emit1("Sub", [a, b])])])
    return ctx.emit1("Add", [ctx.emit1("Max", [a, b]), ctx.emit1("Softplus", [d])])


def _cond_mov(cmp: str) -> Builder:
    def build(ctx: OprContext, xs: list[Value]) -> Value:
        a, b, c = xs
        return ctx.emit1("Where", [ctx.emit1(cmp, [a, b]), c, _k(ctx, c, 0)])

    return build


def _switch_gt0(ctx: OprContext, xs: list[Value]) -> Value:
    x, y = xs
    return ctx.emit1("Where", [ctx.emit1("Greater", [x, _k(ctx, x, 0)]), y, _k(ctx, y, 0)])


MODES: dict[str, tuple[int, Builder]] = {
    "RELU": (1, _op("Relu")),
    "ABS": (1, _op("Abs")),
    "CEIL": (1, _op("Ceil")),
    "FLOOR": (1, _op("Floor")),
    "EXP": (1, _op("Exp")),
    "EXPM1": (1, lambda ctx, xs: ctx.emit1("Sub", [ctx.emit1("Exp", xs), _k(ctx, xs[0], 1.0)])),
    "LOG": (1, _op("Log")),
    "LOG1P": (1, lambda ctx, xs: ctx.emit1("Log", [ctx.emit1("Add", [xs[0], _k(ctx, xs[0], 1.0)])])),
    "NEGATE": (1, _op("Neg")),
    "SIGMOID": (1, _op("Sigmoid")),
    "TANH": (1, _op("Tanh")),
    "FAST_TANH": (1, _fast_tanh),
    "ROUND": (1, _round),
    "ERF": (1, _op("Erf")),
    "ERFC": (1, lambda ctx, xs: ctx.emit1("Sub", [_k(ctx, xs[0], 1.0), ctx.emit1("Erf", xs)])),
    "H_SWISH": (1, _op("HardSwish")),
    "SILU": (1, _silu),
    "GELU": (1, _gelu),
    "RELU6": (1, lambda ctx, xs: _relu6(ctx, xs[0])),
    "HSIGMOID": (1, _hsigmoid),
    "SOFTPLUS": (1, _op("Softplus")),
    "LOGSIGMOID": (1, lambda ctx, xs: ctx.emit1("Neg", [ctx.emit1("Softplus", [ctx.emit1("Neg", xs)])])),
    "SQRT": (1, _op("Sqrt")),
    "SQUARE": (1, lambda ctx, xs: ctx.emit1("Mul", [xs[0], xs[0]])),
    "SIGN": (1, _sign),
    "NOT": (1, _op("Not")),
    "ADD": (2, _op("Add")),
    "SUB": (2, _op("Sub")),
    "MUL": (2, _op("Mul")),
    "TRUE_DIV": (2, _true_div),
    "FLOOR_DIV": (2, _floor_div),
    "MOD": (2, _mod),
    "MAX_": (2, _op("Max")),
    "MIN_": (2, _op("Min")),
    "POW": (2, _op("Pow")),
    "PRELU": (2, _op("PRelu")),
    "LOG_SUM_EXP": (2, _log_sum_exp),
    "LT": (2, _op("Less")),
    "LEQ": (2, _op("LessOrEqual")),
    "EQ": (2, _op("Equal")),
    "NEQ": (2, _then(_op("Equal"), "Not")),
    "AND": (2, _op("And")),
    "OR": (2, _op("Or")),
    "XOR": (2, _op("Xor")),
    "SWITCH_GT0": (2, _switch_gt0),
    "FUSE_ADD_RELU": (2, _fuse_add(_op("Relu"))),
    "FUSE_ADD_SIGMOID": (2, _fuse_add(_op("Sigmoid"))),
    "FUSE_ADD_TANH": (2, _fuse_add(_op("Tanh"))),
    "FUSE_ADD_H_SWISH": (2, _fuse_add(_op("HardSwish"))),
    "CLIP": (3, lambda ctx, xs: ctx.emit1("Min", [ctx.emit1("Max", xs[:2]), xs[2]])),
    "FUSE_MUL_ADD3": (3, lambda ctx, xs: ctx.emit1("Add", [ctx.emit1("Mul", xs[:2]), xs[2]])),
    "FUSE_MUL_ADD4": (
        4,
        lambda ctx, xs: ctx.emit1("Add", [ctx.emit1("Mul", xs[:2]), ctx.emit1("Mul", xs[2:])]),
    ),
    "COND_LEQ_MOV": (3, _cond_mov("LessOrEqual")),
    "COND_LT_MOV": (3, _cond_mov("Less")),
}

BOOL_MODES = frozenset({"LT", "LEQ", "EQ", "NEQ"})
"""Modes whose output is bool whatever the input dtype."""
