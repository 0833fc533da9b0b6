"""Shape and layout operators: Reshape, GetVarShape, Dimshuffle, AxisAddRemove, Broadcast, Concat, Copy.

* Reshape(x, shape): the shape is a tensor (usually computed from
  GetVarShape/Subtensor/Concat and folded at import, given static input
  shapes); the axis of OptionalAxis(V1) is inferred from the element count.
* GetVarShape(x): int32 shape (or one dim when the param names an axis).
* Dimshuffle(pattern): pattern[i] is the input axis of output axis i, -1 a new
  size-1 axis; input axes left out must have size 1. Transpose, then Reshape.
* AxisAddRemove(desc): Unsqueeze / Squeeze steps in order.
* Broadcast(x, shape): Expand. Concat(axis): Concat. Copy: the input itself.

None of these leave the quantization grid, so no requantization follows them.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.types import DType
from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.dtypes import INT32
from frontends.megengine.enums import enum_name
from frontends.megengine.fbs_fields import MAX_NDIM, int_vector, required, vector_length
from schemas.megengine.generated import params_generated as P

__all__ = ["optional_axis"]


def optional_axis(ctx: OprContext) -> int | None:
    """The axis of an OptionalAxisV1 (7 = none) or OptionalAxis (-1 = none) param, if any."""
    for p in ctx.opr.params:
        if p.member == "param_OptionalAxisV1":
            axis = int(p.read(P.OptionalAxisV1).Axis())
            return None if axis == MAX_NDIM else axis
        if p.member == "param_OptionalAxis":
            axis = int(p.read(P.OptionalAxis).Axis())
            return None if axis == -1 else axis
    return None


def _resolve(ctx: OprContext, target: list[int], numel: int | None) -> list[int]:
    """The target shape with its single inferred (-1) dim resolved when the element count is known."""
    unknown = [i for i, d in enumerate(target) if d < 0]
    if len(unknown) > 1:
        raise ctx.fail(f"target shape {target} has more than one inferred dim")
    if numel is None:
        return target
    known = int(np.prod([d for d in target if d >= 0], dtype=np.int64))
    if unknown:
        if known == 0 or numel % known:
            raise ctx.fail(f"cannot reshape {numel} elements to {target}")
        target = list(target)
        target[unknown[0]] = numel // known
    elif known != numel:
        raise ctx.fail(f"cannot reshape {numel} elements to {target}")
    return target


@converter("Reshape", requantize=False)
def reshape(ctx: OprContext) -> list[Var | None]:
    """y = x reshaped to the shape tensor (input 1)."""
    ctx.need_inputs(2, 2)
    x = ctx.value(0)
    target = [int(v) for v in ctx.require_const(1, "the target shape").reshape(-1)]
    if len(target) > MAX_NDIM:
        raise ctx.fail(f"target shape {target} has more than {MAX_NDIM} dims")
    axis = optional_axis(ctx)
    if axis is not None:
        if not 0 <= axis < len(target):
            raise ctx.fail(f"inferred axis {axis} is outside the target shape {target}")
        target[axis] = -1
    numel = x.type.numel if x.type.is_static else None
    target = _resolve(ctx, target, numel)
    y = ctx.emit1("Reshape", [x, ctx.ints(target, "shape")], {"allowzero": int(0 in target)}, final=True)
    return [Var(y, ctx.dtype(0))]


@converter("GetVarShape", requantize=False)
def get_var_shape(ctx: OprContext) -> list[Var | None]:
    """y = shape(x) as int32 (one dim when the param names an axis)."""
    ctx.need_inputs(1, 1)
    x = ctx.value(0)
    axis = optional_axis(ctx)
    attrs = {} if axis is None else {"start": axis, "end": axis + 1 if axis != -1 else None}
    s = ctx.emit1("Shape", [x], attrs)
    return [Var(ctx.emit1("Cast", [s], {"to": int(DType.INT32)}), INT32)]


@converter("Dimshuffle", requantize=False)
def dimshuffle(ctx: OprContext) -> list[Var | None]:
    """Permute axes, add size-1 axes (-1 in the pattern) and drop size-1 axes left out."""
    ctx.need_inputs(1, 1)
    p = ctx.param(P.Dimshuffle)
    pattern = int_vector(p, "Pattern")
    x = ctx.value(0)
    shape = ctx.shape(x)
    rank = len(shape)
    if p.Ndim() and int(p.Ndim()) != rank:
        raise ctx.fail(f"pattern is for rank {int(p.Ndim())}, the input has rank {rank}")
    kept = [a for a in pattern if a >= 0]
    if len(pattern) > MAX_NDIM or len(set(kept)) != len(kept) or any(a >= rank for a in kept):
        raise ctx.fail(f"invalid pattern {pattern} for rank {rank}")
    dropped = [a for a in range(rank) if a not in kept]
    if any(shape[a] != 1 for a in dropped):
        raise ctx.fail(f"pattern {pattern} drops axes of size > 1 from {list(shape)}")
    perm = (*kept, *dropped)
    y = x if perm == tuple(range(rank)) else ctx.emit1("Transpose", [x], {"perm": perm})
    out = [shape[a] if a >= 0 else 1 for a in pattern]
    if dropped or len(out) != len(kept):
        y = ctx.emit1("Reshape", [y, ctx.ints(out, "shape")])
    return [Var(y, ctx.dtype(0))]


@converter("AxisAddRemove", requantize=False)
def axis_add_remove(ctx: OprContext) -> list[Var | None]:
    """Add (ADD_1) or remove (REMOVE) size-1 axes, one step at a time."""
    ctx.need_inputs(1, 1)
    p = ctx.param(P.AxisAddRemove)
    y = ctx.value(0)
    for j in range(vector_length(p.DescLength(), 8, ctx.opr.params[0].buf, "AxisAddRemove desc")):
        d = required(p.Desc(j), f"AxisAddRemove desc {j}")
        op = "Unsqueeze" if enum_name(P.AxisDescMethod, d.Method()) == "ADD_1" else "Squeeze"
        y = ctx.emit1(op, [y, ctx.ints([int(d.Axis())], "axes")])
    return [Var(y, ctx.dtype(0))]


@converter("Broadcast", requantize=False)
def broadcast(ctx: OprContext) -> list[Var | None]:
    """y = x broadcast to the shape tensor (input 1)."""
    ctx.need_inputs(2, 2)
    target = [int(v) for v in ctx.require_const(1, "the target shape").reshape(-1)]
    y = ctx.emit1("Expand", [ctx.value(0), ctx.ints(target, "shape")], final=True)
    return [Var(y, ctx.dtype(0))]


@converter("Concat", requantize=False)
def concat(ctx: OprContext) -> list[Var | None]:
    """y = concatenate(inputs, axis)."""
    ctx.need_inputs(1)
    axis = int(ctx.param(P.Axis).Axis())
    y = ctx.emit1("Concat", [ctx.value(i) for i in range(len(ctx.inputs))], {"axis": axis}, final=True)
    return [Var(y, ctx.dtype(0))]


@converter("Copy", "Identity", "MarkNoBroadcastElemwise", requantize=False)
def copy(ctx: OprContext) -> list[Var | None]:
    """y = x (device copies and markers)."""
    ctx.need_inputs(1, 1)
    return [ctx.var(0)]
