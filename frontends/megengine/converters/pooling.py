"""Pooling: MAX_ -> MaxPool, AVERAGE -> AveragePool(count_include_pad=1),
AVERAGE_COUNT_EXCLUDE_PADDING -> AveragePool(count_include_pad=0).

Windows, strides and symmetric pads map 1:1 (MegEngine's output size is
floor((H + 2p - w) / s) + 1, ONNX's with ceil_mode=0). NCHW44/NCHW88 inputs are
converted to NCHW around the pool and back.

Average pooling of symmetric 8/16-bit quantized values is computed like
MegEngine's integer kernel: the mean of the stored integers, rounded half away
from zero (exact; the float mean would break .5 ties at random), times the scale.
"""

from __future__ import annotations

import numpy as np

from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.enums import enum_name
from frontends.megengine.layouts import BLOCK, blocked_to_nchw, nchw_to_blocked
from frontends.megengine.model import MgeOpr
from frontends.megengine.quant import round_half_away, stored_integers
from schemas.megengine.generated import params_generated as P

__all__: list[str] = []

_MODES = {
    "MAX_": ("MaxPool", {}),
    "AVERAGE": ("AveragePool", {"count_include_pad": 1}),
    "AVERAGE_COUNT_EXCLUDE_PADDING": ("AveragePool", {"count_include_pad": 0}),
}


def _check(opr: MgeOpr) -> str | None:
    for prm in opr.params:
        if prm.member == "param_Pooling":
            fmt = enum_name(P.ConvolutionFormat, prm.read(P.Pooling).Format())
            return None if fmt in BLOCK else f"Pooling format {fmt}"
    return None


@converter("Pooling", check=_check)
def pooling(ctx: OprContext) -> list[Var | None]:
    """y = pool(x) over (window_h, window_w) windows."""
    ctx.need_inputs(1, 1)
    p = ctx.param(P.Pooling)
    fmt = enum_name(P.ConvolutionFormat, p.Format())
    block = BLOCK.get(fmt)
    if block is None:
        raise ctx.fail(f"format {fmt} is not supported")
    op, extra = _MODES[enum_name(P.PoolingV0Mode, p.Mode())]
    x = ctx.value(0)
    if block > 1:
        x = blocked_to_nchw(ctx, x, block)
    ph, pw = int(p.PadH()), int(p.PadW())
    attrs = {
        "kernel_shape": (int(p.WindowH()), int(p.WindowW())),
        "strides": (int(p.StrideH()), int(p.StrideW())),
        "pads": (ph, pw, ph, pw),
        **extra,
    }
    dt = ctx.dtype(0)
    if op == "AveragePool" and dt.has_qdq and not dt.zero_point and dt.scale is not None:
        y = ctx.emit1(op, [stored_integers(ctx, x, dt)], attrs, final=True)
        y = ctx.emit1("Mul", [round_half_away(ctx, y), ctx.constant(np.float32(dt.scale), "scale_f")])
    else:
        y = ctx.emit1(op, [x], attrs, final=True)
    return [Var(nchw_to_blocked(ctx, y, block) if block > 1 else y, ctx.out_dtype(ctx.dtype(0)))]
