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
        "Mod": 10,
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
        "PRelu": 7,
        "Mish": 18,
        "Gelu": 20,
        "Celu": 12,
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
