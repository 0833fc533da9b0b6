"""Convolutions on CUDA targets (NCHW): Kiln's implicit-GEMM / depthwise kernels, ``__dp4a`` for int8.

``Conv`` / ``kiln::FusedConv`` (fp32) run as :func:`cuda_conv2d_kernel` with bias, residual and
activation fused; ``kiln::QConv`` with uint8 activations runs as :func:`cuda_qconv2d_kernel` (requantize
fused). Both return None for what the kernels do not cover (grouped non-depthwise convs, int8
activations, blocked layouts): the caller then emits its Relax fallback.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.conv import _act, _conv_fields
from backends.tvm.lowering.table import LowerContext
from compiler.errors import ConversionError
from compiler.ir.graph import Node

__all__ = ["cuda_conv", "cuda_qconv"]


def cuda_conv(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any] | None:
    """An fp32 conv as Kiln's CUDA kernel, or None (the caller's Relax conv2d fallback)."""
    from backends.tvm.kernels.conv_spec import Conv2dSpec
    from backends.tvm.kernels.cuda_conv2d import cuda_conv2d_kernel, cuda_conv_supported, pack_cuda_weight

    w = ctx.require_const(node, 1, "weight").astype(np.float32)
    has_bias = len(ins) > 2 and ins[2] is not None
    b = ctx.input_const(node, 2) if has_bias else None
    if has_bias and b is None:
        raise ConversionError(f"{node.describe()}: a non-constant conv bias has no TVM lowering")
    residual = ins[3] if len(ins) > 3 else None
    fields = _conv_fields(ctx, node, w)
    act, alpha, beta = _act(node)
    spec = Conv2dSpec(**fields, activation=act, alpha=alpha, beta=beta, residual=residual is not None)
    if not cuda_conv_supported(spec):
        return None
    bias = np.zeros(spec.out_channels, np.float32) if b is None else b.astype(np.float32).reshape(-1)
    args = [ins[0], ctx.const(pack_cuda_weight(w, spec)), ctx.const(bias)]
    if residual is not None:
        args.append(residual)
    return [ctx.call_kernel(cuda_conv2d_kernel(spec, ctx.target), args)]


def cuda_qconv(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any] | None:
    """A kiln::QConv as Kiln's CUDA int8 kernel (``__dp4a``), or None (the caller's Relax fallback)."""
    from backends.tvm.kernels.cuda_qconv2d import (
        cuda_qconv2d_kernel,
        cuda_qconv_spec_ok,
        pack_cuda_multiplier,
        pack_cuda_qbias,
        pack_cuda_qweight,
    )
    from backends.tvm.kernels.qconv_spec import QConv2dSpec

    a = node.attrs
    w = ctx.require_const(node, 1, "weight").astype(np.int8)
    b = ctx.input_const(node, 2) if len(ins) > 2 and ins[2] is not None else None
    residual = ins[3] if len(ins) > 3 else None
    fields = _conv_fields(ctx, node, w)
    if fields["in_block"] or fields["out_block"]:
        return None
    fields.update(in_block=4, out_block=4)  # NCHW data, packed to 4-channel words inside the kernel
    act, alpha, beta = _act(node)
    r_dt = ctx.in_type(node, 3).dtype.numpy.name if residual is not None else "uint8"
    spec = QConv2dSpec(
        **fields,
        in_dtype=ctx.in_type(node, 0).dtype.numpy.name,
        out_dtype=a.out_dtype,
        x_zero=int(a.x_zero),
        y_scale=float(a.y_scale),
        y_zero=int(a.y_zero),
        activation=act,
        alpha=alpha,
        beta=beta,
        residual=residual is not None,
        r_scale=float(a.r_scale),
        r_zero=int(a.r_zero),
        r_dtype=r_dt,
    )
    if not cuda_qconv_spec_ok(spec):
        return None
    w_scales = np.broadcast_to(np.asarray(a.w_scales, np.float32), (w.shape[0],))
    bias = None if b is None else b.astype(np.int32)
    args = [
        ins[0],
        ctx.const(pack_cuda_qweight(w, spec)),
        ctx.const(pack_cuda_qbias(bias, w, spec)),
        ctx.const(pack_cuda_multiplier(float(a.x_scale), w_scales, spec)),
    ]
    if residual is not None:
        args.append(residual)
    return [ctx.call_kernel(cuda_qconv2d_kernel(spec, ctx.target), args)]
