"""Converters of elementwise ops: arithmetic, activations, Clip, variadic Min/Max/Sum/Mean.

All are 1:1 since the opsets listed (multidirectional broadcasting from opset
7 on); Clip before opset 11 carries ``min``/``max`` as attributes, which become
constant inputs of the input's element type.
"""

from __future__ import annotations

import logging

import numpy as np

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []

logger = logging.getLogger(__name__)

register_generic(
    {
        "Add": 7,
        "Sub": 7,
        "Mul": 7,
        "Div": 7,
        "Pow": 7,
        "Relu": 6,
        "LeakyRelu": 6,
        "Elu": 6,
        "Selu": 6,
        "Sigmoid": 6,
        "HardSigmoid": 6,
        "HardSwish": 14,
        "Tanh": 6,
        "Exp": 6,
        "Log": 6,
        "Sqrt": 6,
        "Neg": 6,
        "Abs": 6,
        "Reciprocal": 6,
        "Floor": 6,
        "Ceil": 6,
        "Round": 11,
        "Sign": 9,
        "Softplus": 1,
        "Softsign": 1,
        "Erf": 9,
        "Sin": 7,
        "Cos": 7,
        "Tan": 7,
        "Asin": 7,
        "Acos": 7,
        "Atan": 7,
        "Sinh": 9,
        "Cosh": 9,
        "Asinh": 9,
        "Acosh": 9,
        "Atanh": 9,
        "PRelu": 7,
        "Mish": 18,
        "Gelu": 20,
        "Celu": 12,
        "Shrink": 9,
        "ThresholdedRelu": 10,
        "Max": 8,
        "Min": 8,
        "Sum": 8,
        "Mean": 8,
        "Identity": 1,
        "Clip": 11,
    }
)


@converter("Clip", since=6)
def clip_v6(ctx: NodeContext) -> list[Value]:
    """Clip-6: ``min``/``max`` attributes become constant inputs."""
    x = ctx.require(0)
    dt = x.type.dtype.numpy
    lo, hi = ctx.pop("min"), ctx.pop("max")
    ins: list[Value | None] = [
        x,
        None if lo is None else ctx.constant(np.asarray(lo, dtype=dt), "min"),
        None if hi is None else ctx.constant(np.asarray(hi, dtype=dt), "max"),
    ]
    return ctx.emit("Clip", ins, ctx.rest())


@converter("Mod", since=10)
def mod_v10(ctx: NodeContext) -> list[Value]:
    """Mod; floating-point ``fmod=0`` (floor mod, opset 28) as C fmod plus a sign fix, exactly:
    r = fmod(a, b); y = r + b where r != 0 and sign(r) != sign(b), else r (numpy's ``mod`` rule)."""
    a, b = ctx.require(0), ctx.require(1)
    fmod = ctx.pop("fmod", 0)
    if not a.type.dtype.is_float or fmod != 0:
        return ctx.emit("Mod", ctx.inputs, ctx.rest(fmod=fmod))
    zero = ctx.constant(np.zeros((), a.type.dtype.numpy), "zero")
    (r,) = ctx.emit("Mod", [a, b], {"fmod": 1}, final=False)
    (nonzero,) = ctx.emit("Not", ctx.emit("Equal", [r, zero], final=False), final=False)
    signs = [ctx.emit("Less", [v, zero], final=False)[0] for v in (r, b)]
    (differ,) = ctx.emit("Xor", signs, final=False)
    (fix,) = ctx.emit("And", [nonzero, differ], final=False)
    (shifted,) = ctx.emit("Add", [r, b], final=False)
    return ctx.emit("Where", [fix, shifted, r], ctx.rest())
