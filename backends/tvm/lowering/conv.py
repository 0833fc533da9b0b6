"""Convolutions: Conv and kiln::FusedConv (fp32) and kiln::QConv (int8 integer kernels).

Blocked convs (``layout`` = NCHW{b}c, chosen by the choose-layout pass) run as
Kiln's scheduled NCHWc kernels with bias, residual and activation fused into
the epilogue and weights packed at compile time. NCHW convs (grouped convs the
kernels do not cover) fall back to Relax's conv2d under the generic schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from backends.tvm.lowering.elementwise import activation, dequantize, quantize
from backends.tvm.lowering.table import LowerContext, const_inputs, lowers
from backends.tvm.lowering.tensor import layout_block
from compiler.backend import all_of
from compiler.errors import ConversionError
from compiler.ir.graph import Graph, Node
from compiler.ops.qconv import (
    linear_requant,
    qconv_multiplier,
    qconv_requant_bounds,
    qconv_requant_multiplier,
)
from compiler.ops.shapes import resolve_pads, window_params

if TYPE_CHECKING:
    from backends.tvm.kernels.conv_spec import Conv2dSpec
    from backends.tvm.kernels.qconv_spec import QConv2dSpec

__all__ = ["linear_requantize"]


def _op() -> Any:
    from tvm import relax

    return relax.op


def _geometry(ctx: LowerContext, node: Node, in_hw: tuple[int, int], kernel: tuple[int, int]) -> Any:
    a = node.attrs
    s, d, p = window_params(2, kernel, a.strides, a.dilations, a.pads)
    pads = resolve_pads(a.auto_pad, in_hw, kernel, s, d, p)
    return (int(s[0]), int(s[1])), (int(d[0]), int(d[1])), tuple(int(v) for v in pads)


def _conv_fields(ctx: LowerContext, node: Node, w: np.ndarray) -> dict[str, Any]:
    """Spec fields shared by the fp32 and int8 kernels."""
    x_shape = [int(v) for v in (ctx.in_type(node, 0).shape or ())]
    out_shape = ctx.out_shape(node)
    groups = int(node.attrs.group)
    kernel = (int(w.shape[2]), int(w.shape[3]))
    strides, dil, pads = _geometry(ctx, node, (x_shape[2], x_shape[3]), kernel)
    return {
        "batch": x_shape[0],
        "in_channels": int(w.shape[1]) * groups,
        "in_h": x_shape[2],
        "in_w": x_shape[3],
        "out_channels": int(w.shape[0]),
        "kernel": kernel,
        "strides": strides,
        "pads": (pads[0], pads[1], pads[2], pads[3]),
        "dilations": dil,
        "groups": groups,
        "in_block": layout_block(getattr(node.attrs, "layout", "NCHW")),
        "out_block": out_shape[4] if len(out_shape) == 5 else 0,
    }


def _trim(w: np.ndarray, fields: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
    """Drop the taps that only ever read padding (``conv_geometry.trim_dead_taps``: exact)."""
    from backends.tvm.kernels.conv_geometry import trim_dead_taps

    hw = (fields["in_h"], fields["in_w"])
    w2, pads, dil = trim_dead_taps(w, hw, fields["strides"], fields["pads"], fields["dilations"])
    if w2 is w:
        return w, fields
    kernel = (int(w2.shape[2]), int(w2.shape[3]))
    return w2, {**fields, "kernel": kernel, "pads": pads, "dilations": dil}


def _act(node: Node) -> tuple[str, float, float]:
    a = node.attrs
    return (getattr(a, "activation", "none"), float(getattr(a, "alpha", 0.0)), float(getattr(a, "beta", 0.0)))


def _conv_inputs(
    ctx: LowerContext, node: Node, ins: list[Any], w_dtype: type[np.generic], *, const_bias: bool
) -> tuple[np.ndarray, np.ndarray | None, Any | None]:
    """(constant weight as ``w_dtype``, constant bias or None, residual value or None).

    :func:`_conv_reason` checked the weight (and, with ``const_bias``, the bias) are constants.
    """
    w = ctx.require_const(node, 1, "weight").astype(w_dtype)
    has_bias = len(ins) > 2 and ins[2] is not None
    b = ctx.input_const(node, 2) if has_bias else None
    assert b is not None or not (const_bias and has_bias), node.describe()
    return w, b, ins[3] if len(ins) > 3 else None


def _conv2d_reason(graph: Graph, node: Node) -> str | None:
    w = graph.inputs_of(node)[1]
    if w is None or w.type.rank != 4:
        return "only 2-D convolutions lower to TVM"
    return None


def _const_bias_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if len(ins) > 2 and ins[2] is not None and ins[2].const is None:
        return "a non-constant conv bias has no TVM lowering"
    return None


def _conv_transpose_reason(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    if x is None or x.type.rank != 4:
        return "only 2-D ConvTranspose lowers to TVM"
    return None


_WEIGHT = const_inputs((1, "weight"))


def _conv_spec(node: Node, fields: dict[str, Any], residual: bool) -> Conv2dSpec:
    """The fp32 conv spec: ``fields`` (:func:`_conv_fields`) plus the node's fused activation."""
    from backends.tvm.kernels.conv_spec import Conv2dSpec

    act, alpha, beta = _act(node)
    return Conv2dSpec(**fields, activation=act, alpha=alpha, beta=beta, residual=residual)


def _qconv_spec(ctx: LowerContext, node: Node, fields: dict[str, Any], residual: bool) -> QConv2dSpec:
    """The kiln::QConv spec: ``fields`` plus the node's zero points, scales, activation and residual grid."""
    from backends.tvm.kernels.qconv_spec import QConv2dSpec

    a = node.attrs
    act, alpha, beta = _act(node)
    return QConv2dSpec(
        **fields,
        in_dtype=ctx.in_type(node, 0).dtype.numpy.name,
        out_dtype=a.out_dtype,
        x_zero=int(a.x_zero),
        y_scale=float(a.y_scale),
        y_zero=int(a.y_zero),
        activation=act,
        alpha=alpha,
        beta=beta,
        residual=residual,
        r_scale=float(a.r_scale),
        r_zero=int(a.r_zero),
        r_dtype=ctx.in_type(node, 3).dtype.numpy.name if residual else "uint8",
    )


@lowers("Conv", "kiln::FusedConv", check=all_of(_WEIGHT, _const_bias_reason, _conv2d_reason))
def _conv(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    if ctx.target.kind == "cuda":
        from backends.tvm.lowering.cuda_conv import cuda_conv

        if (out := cuda_conv(ctx, node, ins)) is not None:
            return out
    w, b, residual = _conv_inputs(ctx, node, ins, np.float32, const_bias=True)
    w, fields = _trim(w, _conv_fields(ctx, node, w))
    act, alpha, beta = _act(node)
    if fields["in_block"]:
        from backends.tvm.kernels.conv_spec import conv2d_kernel, pack_bias, pack_weight

        spec = _conv_spec(node, fields, residual is not None)
        args = [ins[0], ctx.const(pack_weight(w, spec)), ctx.const(pack_bias(b, spec))]
        if residual is not None:
            args.append(residual)
        return [ctx.call_kernel(conv2d_kernel(spec, ctx.target), args)]
    op = _op()
    t, l_, bo, r = fields["pads"]
    y = ctx.emit(
        op.nn.conv2d(
            ins[0],
            ctx.const(w),
            fields["strides"],
            (t, l_, bo, r),
            fields["dilations"],
            fields["groups"],
        )
    )
    if b is not None:
        y = ctx.emit(op.add(y, ctx.const(b.astype(np.float32).reshape(1, -1, 1, 1))))
    if residual is not None:
        y = ctx.emit(op.add(y, residual))
    return [activation(ctx, y, act, alpha, beta, "float32")]


@lowers("kiln::QConv", check=all_of(_WEIGHT, _conv2d_reason))
def _qconv(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    if ctx.target.kind == "cuda":
        from backends.tvm.lowering.cuda_conv import cuda_qconv

        if (out := cuda_qconv(ctx, node, ins)) is not None:
            return out
    a = node.attrs
    w, b, residual = _conv_inputs(ctx, node, ins, np.int8, const_bias=False)
    w, fields = _trim(w, _conv_fields(ctx, node, w))
    w_scales = np.broadcast_to(np.asarray(a.w_scales, np.float32), (w.shape[0],))
    act, alpha, beta = _act(node)
    if fields["in_block"]:
        from backends.tvm.kernels.conv2d_int8 import qconv2d_kernel
        from backends.tvm.kernels.qconv_spec import pack_multiplier, pack_qbias, pack_qweight

        spec = _qconv_spec(ctx, node, fields, residual is not None)
        bias = None if b is None else b.astype(np.int32)
        args = [
            ins[0],
            ctx.const(pack_qweight(w, spec)),
            ctx.const(pack_qbias(bias, w, spec)),
            ctx.const(pack_multiplier(float(a.x_scale), w_scales, spec)),
        ]
        if residual is not None:
            args.append(residual)
        return [ctx.call_kernel(qconv2d_kernel(spec, ctx.target), args)]
    # NCHW fallback: the same integer math through Relax ops (int32 conv, float requantize)
    op = _op()
    x = ctx.emit(op.subtract(op.astype(ins[0], "int32"), ctx.scalar(int(a.x_zero), "int32")))
    t, l_, bo, r = fields["pads"]
    acc = ctx.emit(
        op.nn.conv2d(
            x,
            ctx.const(w.astype(np.int32)),
            fields["strides"],
            (t, l_, bo, r),
            fields["dilations"],
            fields["groups"],
            out_dtype="int32",
        )
    )
    if b is not None:
        acc = ctx.emit(op.add(acc, ctx.const(b.astype(np.int32).reshape(1, -1, 1, 1))))
    if linear_requant(a, residual is not None):
        return [_linear_requant(ctx, node, acc, int(w.shape[0]))]
    mult = np.broadcast_to(qconv_multiplier(float(a.x_scale), tuple(a.w_scales)), (w.shape[0],))
    real = ctx.emit(op.multiply(op.astype(acc, "float32"), ctx.const(mult.reshape(1, -1, 1, 1))))
    if residual is not None:
        rr = dequantize(ctx, residual, np.array(a.r_scale, np.float32), np.array(a.r_zero, np.int32))
        real = ctx.emit(op.add(real, rr))
    real = activation(ctx, real, act, alpha, beta, "float32")
    if a.out_dtype == "float32":
        return [real]
    return [quantize(ctx, real, np.array(a.y_scale, np.float32), np.array(a.y_zero, np.int32), a.out_dtype)]


def _linear_requant(ctx: LowerContext, node: Node, acc: Any, channels: int) -> Any:
    """kiln::QConv's linear requantize on the int32 NCHW ``acc``."""
    a = node.attrs
    m = qconv_requant_multiplier(float(a.x_scale), tuple(a.w_scales), float(a.y_scale))
    m = np.ascontiguousarray(np.broadcast_to(m, (channels,)).reshape(1, -1, 1, 1))
    bounds = qconv_requant_bounds(a.activation, float(a.alpha), float(a.beta), float(a.y_scale))
    return linear_requantize(ctx, acc, m, bounds, int(a.y_zero), a.out_dtype)


def linear_requantize(
    ctx: LowerContext, acc: Any, m: np.ndarray, bounds: tuple[float, float], y_zero: int, out_dtype: str
) -> Any:
    """:func:`compiler.ops.qconv.linear_requantize` in float64 Relax ops on the int32 ``acc`` (``m``
    broadcasts to it): ``clip(round_half_even(clip(acc * m, lo, hi)) + y_zero, qmin, qmax)``."""
    op = _op()
    v = op.multiply(op.astype(acc, "float64"), ctx.const(np.asarray(m, np.float64)))
    lo, hi = bounds
    if not np.isinf(lo):
        v = op.maximum(v, ctx.const(np.array(lo)))
    if not np.isinf(hi):
        v = op.minimum(v, ctx.const(np.array(hi)))
    info = np.iinfo(out_dtype)
    q = op.add(op.round(v), ctx.const(np.array(float(y_zero))))
    q = op.minimum(op.maximum(q, ctx.const(np.array(float(info.min)))), ctx.const(np.array(float(info.max))))
    return ctx.emit(op.astype(q, out_dtype))


@lowers("ConvTranspose", check=all_of(_WEIGHT, _conv_transpose_reason))
def _conv_transpose(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from compiler.ops.conv import conv_transpose_geometry

    a = node.attrs
    w = ctx.require_const(node, 1, "weight").astype(np.float32)
    x_shape = [int(v) for v in (ctx.in_type(node, 0).shape or ())]
    kernel = (int(w.shape[2]), int(w.shape[3]))
    strides, dil, pads = _geometry(ctx, node, (x_shape[2], x_shape[3]), kernel)
    out_sp, begin = conv_transpose_geometry(a, x_shape[2:], kernel, strides, dil, pads)
    if begin is None:
        raise ConversionError(f"{node.describe()}: ConvTranspose pads are not static")
    adj = list(a.output_padding) or [0, 0]
    end = []
    for i in range(2):
        natural = strides[i] * (x_shape[2 + i] - 1) + dil[i] * (kernel[i] - 1) + 1 + adj[i]
        end.append(natural - begin[i] - int(out_sp[i]))
    if any(e < 0 for e in end):
        raise ConversionError(f"{node.describe()}: ConvTranspose output_shape beyond the natural size")
    y = ctx.emit(
        _op().nn.conv2d_transpose(
            ins[0],
            ctx.const(w),
            strides,
            (begin[0], begin[1], end[0], end[1]),
            (adj[0], adj[1]),
            dil,
            int(a.group),
        )
    )
    b = ctx.input_const(node, 2) if len(ins) > 2 and ins[2] is not None else None
    if b is not None:
        y = ctx.emit(_op().add(y, ctx.const(b.astype(np.float32).reshape(1, -1, 1, 1))))
    return [y]
