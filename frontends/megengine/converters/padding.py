"""Padding: per-axis front/back offsets (up to 7 axes) -> ONNX Pad.

Modes: CONSTANT (padding_val), REPLICATE -> ``edge``, REFLECT -> ``reflect``.
"""

from __future__ import annotations

import numpy as np

from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.enums import enum_name
from schemas.megengine.generated import params_generated as P

__all__: list[str] = []

_MODES = {"CONSTANT": "constant", "REPLICATE": "edge", "REFLECT": "reflect"}


@converter("Padding")
def padding(ctx: OprContext) -> list[Var | None]:
    """y = x padded by (front, back) offsets per axis."""
    ctx.need_inputs(1, 1)
    p = ctx.param(P.Padding)
    x = ctx.value(0)
    rank = len(ctx.shape(x))
    front = [int(getattr(p, f"FrontOffsetDim{i}")()) for i in range(7)]
    back = [int(getattr(p, f"BackOffsetDim{i}")()) for i in range(7)]
    if any(front[rank:]) or any(back[rank:]):
        raise ctx.fail(f"pads axes beyond the input's rank {rank}")
    mode = _MODES[enum_name(P.PaddingPaddingMode, p.PaddingMode())]
    pads = ctx.ints(front[:rank] + back[:rank], "pads")
    ins = [x, pads]
    if mode == "constant":
        ins.append(ctx.constant(np.asarray(p.PaddingVal(), dtype=x.type.dtype.numpy), "value"))
    y = ctx.emit1("Pad", ins, {"mode": mode}, final=True)
    return [Var(y, ctx.out_dtype(ctx.dtype(0)))]
