"""Depthwise (groups == in_channels == out_channels) fp32 conv2d in NCHW[b]c layout.

``y[n, c, oh, ow, b] = act(bias[c, b] (+ res[n, c, oh, ow, b])
    + sum_{kh, kw} xp[n, c, oh*sh + kh*dh, ow*sw + kw*dw, b] * W[c, kh, kw, b])``
with ``xp`` the zero-padded input (a separate parallel stage, absent when pads are 0).

Schedule: split ``ow -> (wo, wi)``, order ``[n*c*oh] (parallel), wo, kh, kw, wi, b``; the
``wi * ceil(b/lanes)`` accumulators stay in registers (a global-scope stack buffer, unrolled), ``b``
is vectorized, the small window loops are unrolled, and the epilogue is computed at ``wo``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backends.tvm.kernels.conv2d_nchwc import pad_stage, schedule_pad
from backends.tvm.kernels.conv_spec import Conv2dSpec
from backends.tvm.kernels.epilogue import epilogue_stage
from backends.tvm.kernels.kernel import Kernel, mark_scheduled, simd_isa
from backends.tvm.schedule_nest import fits_stack

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["pick_depthwise_tile", "depthwise_nchwc_compute", "depthwise_nchwc_kernel"]

_UNROLL_WINDOW = 25  # unroll kh*kw up to 5x5


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pick_depthwise_tile(spec: Conv2dSpec, target: TargetSpec) -> int:
    """Output columns per register tile: most accumulators within the register file, least waste.

    Scores ``min(acc, 8) * useful`` where ``acc = wi * ceil(b/lanes)`` (8 independent FMA chains
    hide latency on two pipes) and ``useful`` is the non-padded share of a non-divisible split; the
    ``wi * b`` accumulators stay under TVM's stack limit (:func:`fits_stack`).
    """
    regs = 32 if target.lanes >= 16 or target.is_arm else 16
    vpb = _ceil_div(spec.out_block, target.lanes)
    ow = spec.out_w
    best = (-1.0, 1)
    for wi in range(1, min(ow, 16) + 1):
        acc = wi * vpb
        if 2 * acc + 2 > regs or (wi > 1 and not fits_stack(wi * spec.out_block)):
            continue
        useful = ow / (_ceil_div(ow, wi) * wi)
        score = min(acc, 8) * useful + 0.001 * acc
        if score > best[0] + 1e-9:
            best = (score, wi)
    return best[1]


def depthwise_nchwc_compute(spec: Conv2dSpec) -> Any:
    """The unscheduled PrimFunc ``(data, weight, bias[, residual], out)``."""
    from tvm import te

    kh, kw = spec.kernel
    sh, sw = spec.strides
    dh, dw = spec.dilations
    data = te.placeholder(spec.data_shape, "float32", name="data")
    weight = te.placeholder(spec.weight_shape, "float32", name="weight")
    bias = te.placeholder((spec.out_chunks, spec.out_block), "float32", name="bias")
    residual = te.placeholder(spec.out_shape, "float32", name="residual") if spec.residual else None
    xp = pad_stage(data, spec.pads)
    rkh = te.reduce_axis((0, kh), name="kh")
    rkw = te.reduce_axis((0, kw), name="kw")
    conv = te.compute(
        spec.out_shape,
        lambda n, c, y, x, b: te.sum(
            xp[n, c, y * sh + rkh * dh, x * sw + rkw * dw, b] * weight[c, rkh, rkw, b], axis=[rkh, rkw]
        ),
        name="conv",
    )
    out = epilogue_stage(conv, bias, residual, spec.activation, spec.alpha, spec.beta)
    args = [data, weight, bias] + ([residual] if residual is not None else []) + [out]
    return te.create_prim_func(args)


def _schedule(func: Any, spec: Conv2dSpec, wi: int) -> Any:
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    schedule_pad(sch)
    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    n, c, y, x, b, rkh, rkw = sch.get_loops(conv)
    xo, xi = sch.split(x, [None, wi])
    sch.reorder(n, c, y, xo, rkh, rkw, xi, b)
    sch.parallel(sch.fuse(n, c, y))
    # global, not "local": TVM serves every local buffer from the workspace pool (a call per tile);
    # a global one under 1 KiB is a stack array that LLVM keeps in registers
    sch.reverse_compute_at(epi, xo)
    sch.vectorize(b)
    sch.unroll(xi)
    if spec.kernel[0] * spec.kernel[1] <= _UNROLL_WINDOW:
        sch.unroll(rkw)
        sch.unroll(rkh)
    ep_loops = sch.get_loops(epi)[2:]  # below the parallel loop and wo
    sch.vectorize(ep_loops[-1])
    for loop in ep_loops[:-1]:
        sch.unroll(loop)
    init = sch.decompose_reduction(conv, rkh)
    init_loops = sch.get_loops(init)[2:]
    sch.vectorize(init_loops[-1])
    for loop in init_loops[:-1]:
        sch.unroll(loop)
    return sch.mod["main"]


def depthwise_nchwc_kernel(spec: Conv2dSpec, target: TargetSpec, tile_w: int | None = None) -> Kernel:
    """The scheduled depthwise kernel; ``tile_w`` overrides the analytic output-column tile."""
    if not spec.is_depthwise or spec.in_block != spec.out_block:
        raise NotImplementedError(
            "depthwise_nchwc needs groups == in_channels == out_channels, in_block == out_block"
        )
    wi = tile_w or pick_depthwise_tile(spec, target)
    func = _schedule(depthwise_nchwc_compute(spec), spec, wi)
    name = f"kiln_dwconv2d_nchwc_{spec.key()}"
    func = mark_scheduled(
        func.with_attr("global_symbol", name), "depthwise_nchwc", "depthwise_conv", simd_isa(target)
    )
    return Kernel(name=name, func=func, out_shape=spec.out_shape, out_dtype="float32")
