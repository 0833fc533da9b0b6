"""Kiln's fp32 conv2d kernels for CUDA on NCHW data: implicit GEMM (groups 1) and depthwise.

Implicit GEMM, per batch image: ``C[oc, p] = sum_k W[k, oc] * A[k, p]`` with ``p = (oh, ow)`` (M = OH*OW
per image, N = OC, K = IC*KH*KW) where ``A`` is the im2col of the zero-padded input,
``A[k, oh, ow] = x[ic, oh*sh + kh*dh - pt, ow*sw + kw*dw - pl]`` for ``k = (ic*KH + kh)*KW + kw``
(zero outside the image and for ``k >= K``). ``A`` is never materialized in global memory: each thread
block computes its ``[BK, pixel tile]`` slice of it straight into shared memory, next to the ``[BK, oc
tile]`` weight slice, and every thread accumulates a ``tn x tw`` register tile. The epilogue
``y = act(C + bias[oc] (+ residual))`` runs on the registers before the single store.

Layouts: data, residual and output NCHW; weights pre-transposed and K-padded to ``[Kp, OC]``
(:func:`pack_cuda_weight`, ``Kp`` a multiple of the k tile); bias ``[OC]``. Depthwise: weights
``[C, KH, KW]``, one thread per output element with the zero padding inlined.

:func:`schedule_implicit_gemm` is shared with the int8 kernel (:mod:`backends.tvm.kernels.cuda_qconv2d`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.tvm.cuda_build import SCHEDULED_ATTR
from backends.tvm.kernels.conv_geometry import ceil_div, check_weight_shape, depthwise_weight
from backends.tvm.kernels.epilogue import ACTIVATIONS, activation_expr
from backends.tvm.kernels.kernel import Kernel, mark_scheduled

if TYPE_CHECKING:
    from backends.tvm.kernels.conv_geometry import ConvGeometry
    from backends.tvm.kernels.conv_spec import Conv2dSpec
    from backends.tvm.target import TargetSpec

__all__ = [
    "GemmTile",
    "gemm_tile",
    "cuda_conv2d_kernel",
    "cuda_conv2d_compute",
    "cuda_conv_supported",
    "pack_cuda_weight",
    "schedule_implicit_gemm",
    "schedule_depthwise",
    "input_pos",
    "im2col_pos",
    "mark_cuda_scheduled",
    "DEPTHWISE_THREADS",
]

DEPTHWISE_THREADS = 128


def _pow2_at_least(v: int) -> int:
    p = 1
    while p < v:
        p *= 2
    return p


@dataclass(frozen=True)
class GemmTile:
    """Block tile ``(t_oc*tn) oc x t_oh rows x (t_ow*tw) cols``; each thread owns ``tn x tw`` outputs."""

    t_oc: int  # threads along oc
    tn: int  # oc per thread
    t_oh: int  # threads along oh (one row each)
    t_ow: int  # threads along ow
    tw: int  # ow per thread
    bk: int  # k tile (shared-memory depth)

    @property
    def threads(self) -> int:
        """Threads per block."""
        return self.t_oc * self.t_oh * self.t_ow


def gemm_tile(out_channels: int, out_h: int, out_w: int, bk: int = 8) -> GemmTile:
    """A block tile of about 64 oc x 64 pixels, shrunk to small outputs; 16 accumulators per thread."""
    tn = 4 if out_channels >= 32 else 2 if out_channels >= 8 else 1
    t_oc = max(1, min(16, _pow2_at_least(out_channels) // tn))
    ow_span = min(32, _pow2_at_least(out_w))
    tw = 4 if ow_span >= 16 else 2 if ow_span >= 4 else 1
    t_ow = max(1, ow_span // tw)
    t_oh = max(1, min(_pow2_at_least(out_h), 64 // (t_ow * tw)))
    while t_oc * t_oh * t_ow > 256:
        t_oh = max(1, t_oh // 2) if t_oh > 1 else t_oh
        if t_oc * t_oh * t_ow > 256 and t_oh == 1:
            t_oc //= 2
    while t_oc * t_oh * t_ow < 32:  # tiny outputs: at least a warp, as long as there is work for it
        if t_oc * tn < out_channels:
            t_oc *= 2
        elif t_oh < out_h:
            t_oh *= 2
        elif t_ow * tw < out_w:
            t_ow *= 2
        else:
            break
    return GemmTile(t_oc, tn, t_oh, t_ow, tw, bk)


def cuda_conv_supported(spec: Conv2dSpec) -> bool:
    """True for specs the CUDA kernels build: NCHW (blocks 0), groups 1 or depthwise, valid shapes."""
    if spec.in_block or spec.out_block or spec.activation not in ACTIVATIONS:
        return False
    if min(spec.batch, spec.in_channels, spec.out_channels, spec.in_h, spec.in_w) < 1:
        return False
    if min(*spec.kernel, *spec.strides, *spec.dilations) < 1 or min(spec.pads) < 0:
        return False
    if spec.out_h < 1 or spec.out_w < 1:
        return False
    return spec.groups == 1 or spec.is_depthwise


def _k_padded(spec: Conv2dSpec, bk: int) -> int:
    k = spec.in_channels * spec.kernel[0] * spec.kernel[1]
    return ceil_div(k, bk) * bk


def input_pos(spec: ConvGeometry, oh: Any, ow: Any, kh: Any, kw: Any) -> tuple[Any, Any]:
    """Input (row, col) tap ``(kh, kw)`` of output ``(oh, ow)`` reads: ``o*s + k*d - pad_begin``."""
    (sh, sw), (dh, dw) = spec.strides, spec.dilations
    return oh * sh + kh * dh - spec.pads[0], ow * sw + kw * dw - spec.pads[1]


def im2col_pos(spec: ConvGeometry, k: Any, oh: Any, ow: Any) -> tuple[Any, Any, Any]:
    """(channel index ``k // (KH*KW)``, input row, input col) of im2col row ``k`` at output (oh, ow)."""
    kh_, kw_ = spec.kernel
    c, r = k // (kh_ * kw_), k % (kh_ * kw_)
    ih, iw = input_pos(spec, oh, ow, r // kw_, r % kw_)
    return c, ih, iw


def pack_cuda_weight(w: np.ndarray, spec: Conv2dSpec, bk: int = 8) -> np.ndarray:
    """OIHW float32 -> ``[Kp, OC]`` (general; rows ``k >= IC*KH*KW`` zero) or ``[C, KH, KW]`` (depthwise)."""
    w = np.asarray(w, dtype=np.float32)
    if spec.is_depthwise:
        return depthwise_weight(w, spec)
    check_weight_shape(w, spec)
    kh, kw = spec.kernel
    full = np.zeros((_k_padded(spec, bk), spec.out_channels), np.float32)
    full[: spec.in_channels * kh * kw] = w.reshape(spec.out_channels, -1).T
    return full


def _in_window(spec: Any, ih: Any, iw: Any) -> Any:
    from tvm import tirx

    return tirx.all(ih >= 0, ih < spec.in_h, iw >= 0, iw < spec.in_w)


def _epilogue(conv: Any, bias: Any, res: Any | None, spec: Conv2dSpec) -> Any:
    from tvm import te

    def body(n: Any, oc: Any, oh: Any, ow: Any) -> Any:
        v = conv[n, oc, oh, ow] + bias[oc]
        if res is not None:
            v = v + res[n, oc, oh, ow]
        return activation_expr(v, spec.activation, spec.alpha, spec.beta)

    return te.compute(conv.shape, body, name="epilogue")


def cuda_conv2d_compute(spec: Conv2dSpec, bk: int = 8) -> list[Any]:
    """The TE tensors in PrimFunc order: data, weight, bias, [residual], output (unscheduled math)."""
    from tvm import te, tirx

    n_, ic_, oc_ = spec.batch, spec.in_channels, spec.out_channels
    kh_, kw_ = spec.kernel
    out_shape = (n_, oc_, spec.out_h, spec.out_w)
    data = te.placeholder((n_, ic_, spec.in_h, spec.in_w), "float32", name="data")
    bias = te.placeholder((oc_,), "float32", name="bias")
    res = te.placeholder(out_shape, "float32", name="residual") if spec.residual else None
    zero = tirx.const(0.0, "float32")
    if spec.is_depthwise:
        weight = te.placeholder((oc_, kh_, kw_), "float32", name="weight")
        rkh = te.reduce_axis((0, kh_), name="kh")
        rkw = te.reduce_axis((0, kw_), name="kw")

        def dw_body(n: Any, c: Any, oh: Any, ow: Any) -> Any:
            ih, iw = input_pos(spec, oh, ow, rkh, rkw)
            x = tirx.if_then_else(_in_window(spec, ih, iw), data[n, c, ih, iw], zero)
            return te.sum(x * weight[c, rkh, rkw], axis=[rkh, rkw])

        conv = te.compute(out_shape, dw_body, name="conv")
    else:
        k_real, kp = ic_ * kh_ * kw_, _k_padded(spec, bk)
        weight = te.placeholder((kp, oc_), "float32", name="weight")

        def a_body(n: Any, k: Any, oh: Any, ow: Any) -> Any:
            ic, ih, iw = im2col_pos(spec, k, oh, ow)
            ok = tirx.all(k < k_real, _in_window(spec, ih, iw))
            return tirx.if_then_else(ok, data[n, ic, ih, iw], zero)

        im2col = te.compute((n_, kp, spec.out_h, spec.out_w), a_body, name="im2col")
        rk = te.reduce_axis((0, kp), name="k")
        conv = te.compute(
            out_shape,
            lambda n, oc, oh, ow: te.sum(im2col[n, rk, oh, ow] * weight[rk, oc], axis=rk),
            name="conv",
        )
    out = _epilogue(conv, bias, res, spec)
    return [data, weight, bias, *([res] if res is not None else []), out]


def _cooperative_fetch(sch: Any, block: Any, n_outer: int, threads: int) -> None:
    """Spread a shared-memory fill over the block's threads: fuse its own loops, bind the inner split."""
    loops = sch.get_loops(block)[n_outer:]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")


def schedule_implicit_gemm(sch: Any, tile: GemmTile, a_block: str, w_buffer: str) -> None:
    """Schedule ``conv[n, oc, oh, ow] = sum_k a_block[n, k, oh, ow] (*) w_buffer[k, oc]`` + ``epilogue``.

    Grid: blockIdx.x over (n, oh tiles, ow tiles), blockIdx.y over oc tiles; threadIdx.x over the
    block tile's (oc, oh, ow) thread grid. Per k tile both operands are filled into shared memory
    by all threads (``__syncthreads`` inserted by lowering), then each thread runs the unrolled
    ``bk x tn x tw`` multiply-accumulate on local accumulators; the epilogue reads those registers.
    """
    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    a_blk = sch.get_sblock(a_block)
    n, oc, oh, ow, k = sch.get_loops(conv)
    oc_b, oc_t, oc_i = sch.split(oc, [None, tile.t_oc, tile.tn])
    oh_b, oh_t = sch.split(oh, [None, tile.t_oh])
    ow_b, ow_t, ow_i = sch.split(ow, [None, tile.t_ow, tile.tw])
    k_o, k_i = sch.split(k, [None, tile.bk])
    sch.reorder(oc_b, n, oh_b, ow_b, oc_t, oh_t, ow_t, k_o, k_i, oc_i, ow_i)
    sch.bind(oc_b, "blockIdx.y")
    sch.bind(sch.fuse(n, oh_b, ow_b), "blockIdx.x")
    tx = sch.fuse(oc_t, oh_t, ow_t)
    sch.bind(tx, "threadIdx.x")
    reads = [r.source.name for r in sch.get(conv).reads]
    w_shared = sch.cache_read(conv, reads.index(w_buffer), "shared")
    sch.compute_at(w_shared, k_o)
    sch.set_scope(a_blk, 0, "shared")
    sch.compute_at(a_blk, k_o)
    n_outer = 4  # oc_b, (n, oh_b, ow_b), threads, k_o
    _cooperative_fetch(sch, w_shared, n_outer, tile.threads)
    _cooperative_fetch(sch, a_blk, n_outer, tile.threads)
    sch.set_scope(conv, 0, "local")
    sch.reverse_compute_at(epi, tx)
    sch.unroll(k_i)
    sch.unroll(oc_i)
    sch.unroll(ow_i)
    sch.decompose_reduction(conv, k_o)


def schedule_depthwise(sch: Any) -> None:
    """One thread per ``conv`` output (``DEPTHWISE_THREADS`` a block), taps unrolled, ``epilogue`` inlined."""
    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    n, c, oh, ow, kh, kw = sch.get_loops(conv)
    bx, tx = sch.split(sch.fuse(n, c, oh, ow), [None, DEPTHWISE_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(conv, 0, "local")
    sch.reverse_compute_at(epi, tx)
    sch.unroll(kh)
    sch.unroll(kw)
    sch.decompose_reduction(conv, kh)


def mark_cuda_scheduled(func: Any, rule: str, name: str, op_class: str, isa: str = "cuda") -> Any:
    """``func`` named ``name`` with Kiln's kernel attributes and ``tirx.is_scheduled`` (dlight skips it)."""
    func = mark_scheduled(func.with_attr("global_symbol", name), rule, op_class, isa)
    return func.with_attr(SCHEDULED_ATTR, True)


def cuda_conv2d_kernel(spec: Conv2dSpec, target: TargetSpec) -> Kernel:
    """The scheduled CUDA kernel for an NCHW fp32 conv (groups 1: implicit GEMM; depthwise: direct)."""
    from tvm import s_tir, te

    if not cuda_conv_supported(spec):
        raise NotImplementedError(f"no CUDA conv2d kernel for {spec}")
    args = cuda_conv2d_compute(spec)
    sch = s_tir.Schedule(te.create_prim_func(args))
    kh, kw = spec.kernel
    if spec.is_depthwise:
        schedule_depthwise(sch)
        kind = "dw"
    else:
        schedule_implicit_gemm(sch, gemm_tile(spec.out_channels, spec.out_h, spec.out_w), "im2col", "weight")
        kind = "gemm"
    name = f"kiln_cuda_conv2d_{kind}{kh}x{kw}s{spec.strides[0]}_{spec.key()}"
    op_class = "depthwise_conv" if spec.is_depthwise else "conv"
    func = mark_cuda_scheduled(sch.mod["main"], "cuda_conv2d", name, op_class)
    out_shape = (spec.batch, spec.out_channels, spec.out_h, spec.out_w)
    return Kernel(name=name, func=func, out_shape=out_shape, out_dtype="float32")
