"""Convolutions: ConvBias, Convolution and ConvolutionBackwardFilter.

ConvBias computes dst = nonline(conv(src, filter) + bias + z) and maps onto
``kiln::FusedConv`` (IDENTITY/RELU/SIGMOID/H_SWISH -> none/relu/sigmoid/hard_swish,
z -> the residual input). Filters are converted to OIHW (group filters
``[G, OC/G, IC/G, FH, FW]`` are merged; NCHW44, NCHW44_DOT and NCHW88 dense,
group, channel-wise and hybrid filters are un-blocked as listed in
:mod:`frontends.megengine.layouts`; ``mode=CONVOLUTION`` flips them spatially);
blocked activations, biases and z are converted to NCHW around the conv and the
result back. Padding is symmetric: pads = (ph, pw, ph, pw).

ConvolutionBackwardFilter (the weight gradient) is itself a convolution:
dW[o, c, i, j] = sum_{n, y, x} src_pad[n, c, y*s + i*d, x*s + j*d] * diff[n, o, y, x],
i.e. conv(src^T, diff^T) with the roles of stride and dilation swapped, cropped
to the filter size: src^T = [C, N, H, W], diff^T = [O, N, OH, OW].
"""

from __future__ import annotations

from typing import Any

from compiler.ir.graph import Value
from compiler.ops.fused import KILN
from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.dtypes import FLOAT32, MgeDType
from frontends.megengine.enums import enum_name
from frontends.megengine.layouts import BLOCK, Step, blocked_to_nchw, filter_steps, nchw_to_blocked, relayout
from frontends.megengine.model import MgeOpr
from schemas.megengine.generated import params_generated as P

__all__ = ["ACTIVATIONS"]

ACTIVATIONS = {"IDENTITY": "none", "RELU": "relu", "SIGMOID": "sigmoid", "H_SWISH": "hard_swish"}
"""ConvBias nonlineMode -> kiln::FusedConv activation."""

_ACT_OPS = {"relu": "Relu", "sigmoid": "Sigmoid", "hard_swish": "HardSwish"}


def _format(p: Any) -> str:
    return enum_name(P.ConvolutionFormat, p.Format())


def _check(opr: MgeOpr, cls: type) -> str | None:
    for prm in opr.params:
        if prm.member == f"param_{cls.__name__}":
            fmt = _format(prm.read(cls))
            return None if fmt in BLOCK else f"{opr.family} format {fmt}"
    return None


def _geometry(p: Any) -> dict[str, Any]:
    ph, pw = int(p.PadH()), int(p.PadW())
    return {
        "pads": (ph, pw, ph, pw),
        "strides": (int(p.StrideH()), int(p.StrideW())),
        "dilations": (int(p.DilateH()), int(p.DilateW())),
    }


def _out_dtype(ctx: OprContext) -> MgeDType:
    """The declared output dtype, else MegEngine's default: int32 accumulators for quantized inputs."""
    x, w = ctx.dtype(0), ctx.dtype(1)
    if x.is_quantized and w.is_quantized and x.scale is not None and w.scale is not None:
        return ctx.out_dtype(MgeDType("QuantizedS32", x.scale * w.scale))
    return ctx.out_dtype(x if not x.is_quantized else FLOAT32)


def _prepare(ctx: OprContext, p: Any) -> tuple[Value, Value, int, dict[str, Any]]:
    """(NCHW input, OIHW filter, channel block, conv attrs)."""
    fmt = _format(p)
    block = BLOCK.get(fmt)
    if block is None:
        raise ctx.fail(f"format {fmt} is not supported")
    x, w = ctx.value(0), ctx.value(1)
    blocked_input = block > 1 and x.type.rank == 5
    if blocked_input:
        x = blocked_to_nchw(ctx, x, block)
    group = enum_name(P.ConvolutionV0Sparse, p.Sparse()) == "GROUP"
    steps, groups = filter_steps(ctx, ctx.shape(w), fmt, group, blocked_input)
    if enum_name(P.ConvolutionV0Mode, p.Mode()) == "CONVOLUTION":
        steps = [*steps, ("flip", (2, 3))]
    attrs = _geometry(p)
    attrs["group"] = groups
    return x, relayout(ctx, w, steps), block, attrs


def _per_channel_bias(ctx: OprContext, b: Value, oc: int, block: int) -> Value | None:
    """The bias as a [OC] vector when it broadcasts per output channel, else None."""
    shape = ctx.shape(b)
    steps: list[Step]
    if block == 1 and shape in ((1, oc, 1, 1), (oc,)):
        steps = [("reshape", (oc,))]
    elif block > 1 and shape == (1, oc // block, 1, 1, block):
        steps = [("transpose", (0, 1, 4, 2, 3)), ("reshape", (oc,))]
    else:
        return None
    return relayout(ctx, b, steps)


@converter("ConvBias", check=lambda opr: _check(opr, P.ConvBias))
def conv_bias(ctx: OprContext) -> list[Var | None]:
    """dst = nonline(conv(src, filter) + bias + z) as kiln::FusedConv."""
    ctx.need_inputs(2, 4)
    p = ctx.param(P.ConvBias)
    mode = enum_name(P.ConvBiasV0NonlineMode, p.NonlineMode())
    act = ACTIVATIONS.get(mode)
    if act is None:
        raise ctx.fail(f"nonlineMode {mode} is not supported")
    out_dtype = _out_dtype(ctx)
    x, w, block, attrs = _prepare(ctx, p)
    oc = ctx.shape(w)[0]
    bias = _per_channel_bias(ctx, ctx.value(2), oc, block) if len(ctx.inputs) > 2 else None
    if len(ctx.inputs) > 2 and bias is None:
        # A bias that is not per channel: unfused conv, then MegEngine's broadcasting adds.
        y = ctx.emit1("Conv", [x, w], attrs, final=True)
        y = nchw_to_blocked(ctx, y, block) if block > 1 else y
        for extra in ctx.inputs[2:]:
            y = ctx.emit1("Add", [y, extra.value])
        if act != "none":
            y = ctx.emit1(_ACT_OPS[act], [y])
        return [Var(y, out_dtype)]
    z = ctx.value(3) if len(ctx.inputs) > 3 else None
    if z is not None and block > 1:
        z = blocked_to_nchw(ctx, z, block)
    y = ctx.emit1("FusedConv", [x, w, bias, z], {**attrs, "activation": act}, domain=KILN, final=True)
    return [Var(nchw_to_blocked(ctx, y, block) if block > 1 else y, out_dtype)]


@converter("Convolution", check=lambda opr: _check(opr, P.Convolution))
def convolution(ctx: OprContext) -> list[Var | None]:
    """dst = conv(src, filter)."""
    ctx.need_inputs(2, 2)
    p = ctx.param(P.Convolution)
    out_dtype = _out_dtype(ctx)
    x, w, block, attrs = _prepare(ctx, p)
    y = ctx.emit1("Conv", [x, w], attrs, final=True)
    return [Var(nchw_to_blocked(ctx, y, block) if block > 1 else y, out_dtype)]


@converter("ConvolutionBackwardFilter", check=lambda opr: _check(opr, P.Convolution))
def convolution_backward_filter(ctx: OprContext) -> list[Var | None]:
    """grad = dW of conv(src, W) for output gradient diff (inputs: src, diff, filter)."""
    ctx.need_inputs(3, 3)
    p = ctx.param(P.Convolution)
    if _format(p) != "NCHW" or enum_name(P.ConvolutionV0Sparse, p.Sparse()) != "DENSE":
        raise ctx.fail("only dense NCHW weight gradients are supported")
    src, diff, w = ctx.value(0), ctx.value(1), ctx.value(2)
    o, c, kh, kw = ctx.shape(w)
    ph, pw = int(p.PadH()), int(p.PadW())
    geo = {
        "pads": (ph, pw, ph, pw),
        "strides": (int(p.DilateH()), int(p.DilateW())),
        "dilations": (int(p.StrideH()), int(p.StrideW())),
    }
    src_t = ctx.emit1("Transpose", [src], {"perm": (1, 0, 2, 3)})
    diff_t = ctx.emit1("Transpose", [diff], {"perm": (1, 0, 2, 3)})
    g = ctx.emit1("Conv", [src_t, diff_t], geo, final=True)  # [C, O, >=KH, >=KW]
    g = ctx.emit1(
        "Slice", [g, ctx.ints([0, 0], "starts"), ctx.ints([kh, kw], "ends"), ctx.ints([2, 3], "axes")]
    )
    g = ctx.emit1("Transpose", [g], {"perm": (1, 0, 2, 3)})
    if enum_name(P.ConvolutionV0Mode, p.Mode()) == "CONVOLUTION":
        g = relayout(ctx, g, [("flip", (2, 3))])
    if ctx.shape(g) != (o, c, kh, kw):
        raise ctx.fail(
            f"weight gradient shape {list(ctx.shape(g))} does not match the filter {[o, c, kh, kw]}"
        )
    return [Var(g, ctx.out_dtype(FLOAT32))]
