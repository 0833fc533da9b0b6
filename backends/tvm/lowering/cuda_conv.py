"""Convolutions on CUDA targets (NCHW): Kiln's implicit-GEMM / depthwise kernels, ``__dp4a`` for int8.

``Conv`` / ``kiln::FusedConv`` (fp32) run as :func:`cuda_conv2d_kernel` with bias, residual and
activation fused; ``kiln::QConv`` with uint8 activations runs as :func:`cuda_qconv2d_kernel` (requantize
fused). Both return None for what the kernels do not cover (grouped non-depthwise convs, int8
activations, blocked layouts): the caller then emits its Relax fallback. The int8 multiplier operand is
float64 for kiln::QConv's linear requantize form and float32 otherwise (``spec.mult_dtype``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.conv import _conv_fields, _conv_inputs, _conv_spec, _qconv_spec
from backends.tvm.lowering.table import LowerContext
from compiler.ir.graph import Node

__all__ = ["cuda_conv", "cuda_qconv"]


def cuda_conv(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any] | None:
    """An fp32 conv as Kiln's CUDA kernel, or None (the caller's Relax conv2d fallback)."""
    from backends.tvm.kernels.cuda_conv2d import cuda_conv2d_kernel, cuda_conv_supported, pack_cuda_weight

    w, b, residual = _conv_inputs(ctx, node, ins, np.float32, const_bias=True)
    spec = _conv_spec(node, _conv_fields(ctx, node, w), residual is not None)
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

    a = node.attrs
    w, b, residual = _conv_inputs(ctx, node, ins, np.int8, const_bias=False)
    fields = _conv_fields(ctx, node, w)
    if fields["in_block"] or fields["out_block"]:
        return None
    fields.update(in_block=4, out_block=4)  # NCHW data, packed to 4-channel words inside the kernel
    spec = _qconv_spec(ctx, node, fields, residual is not None)
    if not cuda_qconv_spec_ok(spec):
        return None
    w_scales = np.broadcast_to(np.asarray(a.w_scales, np.float32), (w.shape[0],))
    bias = None if b is None else b.astype(np.int32)
    args = [
        ins[0],
        ctx.const(pack_cuda_qweight(w, spec)),
        ctx.const(pack_cuda_qbias(bias, w, spec)),
        ctx.const(pack_cuda_multiplier(float(a.x_scale), w_scales, spec)),  # float64 or float32
    ]
    if residual is not None:
        args.append(residual)
    return [ctx.call_kernel(cuda_qconv2d_kernel(spec, ctx.target), args)]
