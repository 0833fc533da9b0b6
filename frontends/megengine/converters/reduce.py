"""Reduce and Softmax.

Reduce keeps the reduced axis (size 1). With ``axis = INT_MAX`` it reduces to
the target shape given as the second input instead: every axis where the
target is 1 and the input is not. Modes: SUM, SUM_SQR, PRODUCT, MIN_, MAX_,
MEAN -> ReduceSum, ReduceSumSquare, ReduceProd, ReduceMin, ReduceMax, ReduceMean.
"""

from __future__ import annotations

from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.enums import enum_name
from schemas.megengine.generated import params_generated as P

__all__: list[str] = []

_OPS = {
    "SUM": "ReduceSum",
    "SUM_SQR": "ReduceSumSquare",
    "PRODUCT": "ReduceProd",
    "MIN_": "ReduceMin",
    "MAX_": "ReduceMax",
    "MEAN": "ReduceMean",
}
_TO_TARGET = 2**31 - 1


@converter("Reduce")
def reduce(ctx: OprContext) -> list[Var | None]:
    """y = reduce(x) over one axis, or down to a target shape (keeping dims)."""
    p = ctx.param(P.Reduce)
    op = _OPS[enum_name(P.ReduceMode, p.Mode())]
    x = ctx.value(0)
    axis = int(p.Axis())
    if axis == _TO_TARGET:
        ctx.need_inputs(2, 2)
        target = [int(v) for v in ctx.require_const(1, "the target shape").reshape(-1)]
        shape = ctx.shape(x)
        if len(target) != len(shape) or any(t not in (1, s) for s, t in zip(shape, target, strict=True)):
            raise ctx.fail(f"cannot reduce {list(shape)} to {target}")
        axes = [i for i, (s, t) in enumerate(zip(shape, target, strict=True)) if t == 1 and s != 1]
        if not axes:
            return [ctx.var(0)]
    else:
        ctx.need_inputs(1, 1)
        axes = [axis]
    y = ctx.emit1(op, [x, ctx.ints(axes, "axes")], {"keepdims": 1}, final=True)
    return [Var(y, ctx.out_dtype(ctx.dtype(0)))]


@converter("Softmax")
def softmax(ctx: OprContext) -> list[Var | None]:
    """y = softmax(x, axis)."""
    ctx.need_inputs(1, 1)
    axis = int(ctx.param(P.Softmax).Axis())
    y = ctx.emit1("Softmax", [ctx.value(0)], {"axis": axis}, final=True)
    return [Var(y, ctx.out_dtype(ctx.dtype(0)))]
