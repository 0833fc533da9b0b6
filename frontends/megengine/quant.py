"""Quantized MegEngine values as Kiln QDQ: constants and rounding points.

* A quantized constant (QuantizedS8 weight, QuantizedS32 bias...) becomes its
  integer storage as a constant followed by DequantizeLinear, so the int8
  weights survive into the exported model.
* Where MegEngine produces an 8/16-bit quantized value, the float value is
  rounded onto the grid: y = DequantizeLinear(QuantizeLinear(x, s, z), s, z)
  = s * (clip(round(x / s) + z, qmin, qmax) - z).
* Where MegEngine computes on the stored integers and rounds halves away from
  zero (``std::round``, e.g. int8 average pooling, whose sums divided by the
  window size hit .5 often), the integers are recovered exactly
  (Cast(QuantizeLinear(x))) and :func:`round_half_away` rounds them.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from frontends.megengine.converter import OprContext
from frontends.megengine.dtypes import MgeDType

__all__ = [
    "dequantize",
    "dequantized_constant",
    "round_to_grid",
    "constant_of",
    "stored_integers",
    "round_half_away",
]


def _qparams(ctx: OprContext, dt: MgeDType, with_zero_point: bool) -> list[Value]:
    try:
        dt.check_quant_params()
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    assert dt.scale is not None and dt.storage is not None
    out = [ctx.constant(np.float32(dt.scale), "scale")]
    if with_zero_point:
        out.append(ctx.constant(np.asarray(dt.zero_point, dtype=dt.storage), "zero_point"))
    return out


def dequantize(ctx: OprContext, q: Value, dt: MgeDType) -> Value:
    """DequantizeLinear of stored integers of quantized type ``dt`` (float32 result)."""
    return ctx.emit1("DequantizeLinear", [q, *_qparams(ctx, dt, with_zero_point=dt.has_qdq)])


def dequantized_constant(ctx: OprContext, stored: np.ndarray, dt: MgeDType, suffix: str) -> Value:
    """DequantizeLinear of the stored integers of a quantized constant."""
    return dequantize(ctx, ctx.constant(stored, suffix), dt)


def constant_of(ctx: OprContext, stored: np.ndarray, dt: MgeDType, suffix: str) -> Value:
    """The Kiln value of a stored MegEngine constant (dequantized when quantized)."""
    if dt.is_quantized:
        return dequantized_constant(ctx, stored, dt, suffix)
    return ctx.constant(stored, suffix)


def round_to_grid(ctx: OprContext, x: Value, dt: MgeDType) -> Value:
    """x rounded to the grid of 8/16-bit quantized type ``dt`` (QuantizeLinear then DequantizeLinear)."""
    if not x.type.dtype.is_float:
        raise ctx.fail(f"cannot quantize a {x.type.dtype.short} value to {dt}")
    params = _qparams(ctx, dt, with_zero_point=True)
    q = ctx.emit1("QuantizeLinear", [x, *params])
    return ctx.emit1("DequantizeLinear", [q, *params])


def stored_integers(ctx: OprContext, x: Value, dt: MgeDType) -> Value:
    """The stored integers q of an on-grid quantized value, exactly, as float32 (q - zero_point)."""
    params = _qparams(ctx, dt, with_zero_point=True)
    q = ctx.emit1("Cast", [ctx.emit1("QuantizeLinear", [x, *params])], {"to": int(DType.FLOAT32)})
    if dt.zero_point:
        q = ctx.emit1("Sub", [q, ctx.constant(np.float32(dt.zero_point), "zero_point_f")])
    return q


def round_half_away(ctx: OprContext, v: Value) -> Value:
    """round(v) with halves away from zero (C's round).

    sign(v) * floor(|v| + 1/2) = floor(relu(v) + 1/2) - floor(relu(-v) + 1/2): at most one
    of relu(v), relu(-v) is non-zero, and floor(1/2) = 0.
    """
    half = ctx.constant(np.float32(0.5), "half")
    up = ctx.emit1("Floor", [ctx.emit1("Add", [ctx.emit1("Relu", [v]), half])])
    down = ctx.emit1("Floor", [ctx.emit1("Add", [ctx.emit1("Relu", [ctx.emit1("Neg", [v])]), half])])
    return ctx.emit1("Sub", [up, down])
