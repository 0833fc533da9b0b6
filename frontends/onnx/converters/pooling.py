"""Converters of pooling ops.

MaxPool and AveragePool map 1:1 at every opset: later versions only add
attributes (storage_order, ceil_mode, dilations, count_include_pad) whose
defaults equal the older behaviour. LpPool is an AveragePool of |x|^p that counts
the (zero) padding, times the window size, to the power 1/p.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []

register_generic(
    {
        "MaxPool": 1,
        "AveragePool": 1,
        "GlobalAveragePool": 1,
        "GlobalMaxPool": 1,
        "GlobalLpPool": 2,
        "MaxRoiPool": 1,
        "MaxUnpool": 9,
    }
)


@converter("LpPool", since=2, needs=("Abs", "Pow", "AveragePool", "Mul"))
def lp_pool(ctx: NodeContext) -> list[Value]:
    """LpPool: y = (sum over the window of |x|^p)^(1/p) = (k * AveragePool(|x|^p, padding counted))^(1/p)."""
    x = ctx.require(0)
    if not x.type.dtype.is_float:
        raise ctx.fail(f"input must be float, got {x.type.dtype.short}")
    p = float(ctx.pop("p", 2))
    kernel = tuple(int(k) for k in ctx.pop("kernel_shape", ()))
    if not kernel or p <= 0:
        raise ctx.fail(f"kernel_shape {kernel} and p={p} must be given and positive")
    dt = x.type.dtype.numpy

    def op(name: str, ins: list[Value], attrs: dict[str, object] | None = None) -> Value:
        return ctx.emit(name, ins, attrs, final=False)[0]

    powered = op("Pow", [op("Abs", [x]), ctx.constant(np.asarray(p, dt), "p")])
    mean = op("AveragePool", [powered], ctx.rest(kernel_shape=kernel, count_include_pad=1))
    total = op("Mul", [mean, ctx.constant(np.asarray(math.prod(kernel), dt), "window")])
    return ctx.emit("Pow", [total, ctx.constant(np.asarray(1.0 / p, dt), "root")])

