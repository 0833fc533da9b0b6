"""Resize (2-D, NCHW, NHWC, NCHW44 or NCHW88) to the output size given as the second input [OH, OW].

MegEngine's source coordinates, with scale = out / in per axis:

* LINEAR: c = (i + 1/2) / scale - 1/2, clamped to the border: ONNX Resize
  ``linear`` with ``half_pixel`` coordinates;
* NEAREST: c = min(floor(i / scale), in - 1): ONNX ``nearest`` with
  ``asymmetric`` coordinates and ``floor`` rounding.

Blocked NCHW44/NCHW88 inputs ``[N, C/b, H, W, b]`` (what MegEngine's
``enable_nchw44``/``enable_nchw88`` make of an NCHW Resize) are resized per
channel like NCHW: converted to NCHW around the resize and back. Other
interpolation modes are not imported.
"""

from __future__ import annotations

from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.enums import enum_name
from frontends.megengine.layouts import blocked_to_nchw, nchw_to_blocked
from frontends.megengine.model import MgeOpr
from schemas.megengine.generated import params_generated as P

__all__: list[str] = []

_MODES = {
    "LINEAR": {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
    "NEAREST": {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
}


_FORMATS = {"NCHW": 1, "NHWC": 1, "NCHW44": 4, "NCHW88": 8}
"""Formats Kiln imports, with their channel block."""


def _check(opr: MgeOpr) -> str | None:
    for prm in opr.params:
        if prm.member == "param_Resize":
            p = prm.read(P.Resize)
            mode = enum_name(P.WarpPerspectiveV1InterpolationMode, p.Imode())
            fmt = enum_name(P.ConvolutionFormat, p.Format())
            if mode not in _MODES:
                return f"Resize {mode}"
            return None if fmt in _FORMATS else f"Resize format {fmt}"
    return None


@converter("Resize", check=_check)
def resize(ctx: OprContext) -> list[Var | None]:
    """y = x resized to [OH, OW] (linear or nearest)."""
    ctx.need_inputs(2, 2)
    p = ctx.param(P.Resize)
    attrs = _MODES[enum_name(P.WarpPerspectiveV1InterpolationMode, p.Imode())]
    fmt = enum_name(P.ConvolutionFormat, p.Format())
    nhwc, block = fmt == "NHWC", _FORMATS.get(fmt)
    if block is None:
        raise ctx.fail(f"format {fmt} is not supported")
    size = [int(v) for v in ctx.require_const(1, "the output size").reshape(-1)]
    x = ctx.value(0)
    if block > 1:
        x = blocked_to_nchw(ctx, x, block)
    if len(size) != 2 or x.type.rank != 4:
        raise ctx.fail(f"expects a 4-D input and a 2-element size, got {x.type} and {size}")
    if nhwc:
        x = ctx.emit1("Transpose", [x], {"perm": (0, 3, 1, 2)})
    n, c = ctx.shape(x)[:2]
    y = ctx.emit1("Resize", [x, None, None, ctx.ints([n, c, *size], "sizes")], attrs, final=True)
    if nhwc:
        y = ctx.emit1("Transpose", [y], {"perm": (0, 2, 3, 1)})
    if block > 1:
        y = nchw_to_blocked(ctx, y, block)
    return [Var(y, ctx.out_dtype(ctx.dtype(0)))]
