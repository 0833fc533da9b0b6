"""Kiln's int8 conv2d kernels for CUDA (kiln::QConv on NCHW uint8 data): ``__dp4a`` implicit GEMM.

Math (see :mod:`backends.tvm.kernels.qconv_spec`): ``acc = sum (x_q - x_zero) * w_q + bias_q`` exactly in
int32, then the float32 requantize epilogue. ``__dp4a`` multiplies signed bytes, so the kernel feeds it
``x_q - 128`` (the uint8 byte with its top bit flipped, read as int8) and folds the shift into the bias:
``sum (x - x_zero) w = sum (x - 128) w + (128 - x_zero) * sum w``; spatial padding is ``x_zero - 128``.

General convs (groups 1): the im2col stage packs 4 input channels into one int32 (NCHW4c, little endian:
byte ``p`` = channel ``4*c4 + p``) straight into shared memory per k tile; weights are pre-packed to the
same 4-channel words, ``[K4p, OC]`` int32 with ``k4 = (c4*KH + kh)*KW + kw`` (:func:`pack_cuda_qweight`);
the shared implicit-GEMM schedule of :mod:`backends.tvm.kernels.cuda_conv2d` runs it with each update
``acc = __dp4a(a, w, acc)``. Depthwise convs: one thread per output, plain int32 math.

The linear requantize (``spec.linear_requant``) is float64: ``v = __dmul_rn(double(acc), M[oc])``,
the activation bounds, ``rint(v) + y_zero`` and the clamp, with ``M`` a float64 multiplier operand. The
other epilogues are float32 and their products use ``__fmul_rn``. Neither product is ever contracted into
an FMA, so the float rounding is the reference's. ``gpu=False`` builds the same compute for LLVM
(``__dp4a`` emulated on bytes, plain multiplies) to validate the math on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.tvm.kernels.conv_geometry import ceil_div, check_weight_shape, depthwise_weight
from backends.tvm.kernels.cuda_conv2d import (
    gemm_tile,
    im2col_pos,
    input_pos,
    mark_cuda_scheduled,
    schedule_depthwise,
    schedule_implicit_gemm,
)
from backends.tvm.kernels.epilogue import activation_expr
from backends.tvm.kernels.kernel import Kernel
from backends.tvm.kernels.qconv_spec import (
    QUANT_RANGES,
    QConv2dSpec,
    linear_requant_expr,
    pack_multiplier,
    pack_qbias,
)

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = [
    "cuda_qconv2d_kernel",
    "cuda_qconv2d_compute",
    "cuda_qconv_spec_ok",
    "pack_cuda_qweight",
    "pack_cuda_qbias",
    "pack_cuda_multiplier",
    "QCONV_BK",
]

QCONV_BK = 8  # k tile in 4-channel words (32 input channels x taps per shared-memory stage)


def cuda_qconv_spec_ok(spec: QConv2dSpec) -> bool:
    """True for specs the CUDA int8 kernels build (``in_block`` 4: NCHW data packed to NCHW4c words)."""
    try:
        spec.validate()
    except ValueError:
        return False
    return spec.in_block == 4 and (spec.groups == 1 or spec.is_depthwise)


def _k4(spec: QConv2dSpec) -> int:
    return ceil_div(spec.in_channels, 4) * spec.kernel[0] * spec.kernel[1]


def pack_cuda_qweight(w_q: np.ndarray, spec: QConv2dSpec, bk: int = QCONV_BK) -> np.ndarray:
    """OIHW int8 -> ``[K4p, OC]`` int32 words of 4 input channels, or ``[C, KH, KW]`` int8 (depthwise).

    ``word[k4, oc]`` holds bytes ``W[oc, 4*c4 + p, kh, kw]`` (p = 0..3, zero past IC) for
    ``k4 = (c4*KH + kh)*KW + kw``; rows ``k4 >= K4`` are zero.
    """
    w = np.asarray(w_q)
    if w.dtype != np.int8:
        raise ValueError(f"weights must be int8, got {w.dtype}")
    if spec.is_depthwise:
        return depthwise_weight(w, spec)
    check_weight_shape(w, spec)
    kh, kw = spec.kernel
    c4 = ceil_div(spec.in_channels, 4)
    full = np.zeros((spec.out_channels, c4 * 4, kh, kw), np.int8)
    full[:, : spec.in_channels] = w
    # o, c4, p, kh, kw -> c4, kh, kw, o, p
    words = full.reshape(spec.out_channels, c4, 4, kh, kw).transpose(1, 3, 4, 0, 2)
    packed = np.zeros((ceil_div(_k4(spec), bk) * bk, spec.out_channels, 4), np.int8)
    packed[: _k4(spec)] = words.reshape(-1, spec.out_channels, 4)
    return np.ascontiguousarray(packed).view("<i4")[..., 0].astype(np.int32)


def pack_cuda_qbias(bias_q: np.ndarray | None, w_q: np.ndarray, spec: QConv2dSpec) -> np.ndarray:
    """int32 ``[OC]``: ``bias_q - x_zero*sum(w)``, plus ``128*sum(w)`` for the dp4a (general) kernel."""
    folded = pack_qbias(bias_q, w_q, spec).reshape(-1)[: spec.out_channels].astype(np.int64)
    if not spec.is_depthwise:
        w = np.asarray(w_q).astype(np.int64)
        folded = folded + 128 * w.reshape(w.shape[0], -1).sum(axis=1)
    info = np.iinfo(np.int32)
    if folded.min(initial=0) < info.min or folded.max(initial=0) > info.max:
        raise ValueError("folded int8 conv bias overflows int32")
    return folded.astype(np.int32)


def pack_cuda_multiplier(x_scale: float, w_scale: np.ndarray, spec: QConv2dSpec) -> np.ndarray:
    """``[OC]`` of :func:`pack_multiplier`: float64 ``M[oc]`` (linear requantize) or float32 ``m[oc]``."""
    return np.ascontiguousarray(pack_multiplier(x_scale, w_scale, spec).reshape(-1)[: spec.out_channels])


def _f32(v: float) -> Any:
    from tvm import tirx

    return tirx.const(float(v), "float32")


def _multiply(gpu: bool, dtype: str = "float32") -> Callable[[Any, Any], Any]:
    """``a * b`` rounded on its own: ``__fmul_rn``/``__dmul_rn`` on CUDA, ``llvm.arithmetic.fence`` else."""
    from tvm import tirx

    if gpu:
        name = "__fmul_rn" if dtype == "float32" else "__dmul_rn"
        return lambda a, b: tirx.call_pure_extern(dtype, name, a, b)
    return lambda a, b: tirx.call_llvm_pure_intrin(dtype, "llvm.arithmetic.fence", a * b)


def _dp4a(a: Any, b: Any, acc: Any, gpu: bool) -> Any:
    """``acc + sum_p sbyte_p(a) * sbyte_p(b)`` (``__dp4a`` on CUDA, byte arithmetic elsewhere)."""
    from tvm import tirx

    if gpu:
        return tirx.call_pure_extern("int32", "__dp4a", a, b, acc)

    def byte(v: Any, p: int) -> Any:
        return tirx.Cast("int32", tirx.Cast("int8", (v >> (8 * p)) & 255))

    total = acc
    for p in range(4):
        total = total + byte(a, p) * byte(b, p)
    return total


def _requantize(acc: Any, bias: Any, mult: Any, res: Any | None, spec: QConv2dSpec, gpu: bool) -> Any:
    """The kiln::QConv epilogue on int32 ``acc`` (same op order as the CPU kernel)."""
    from tvm import te, tirx

    if spec.linear_requant:
        return linear_requant_expr(
            _multiply(gpu, "float64")(tirx.Cast("float64", acc + bias), mult), spec, spec.out_dtype
        )
    mul = _multiply(gpu)
    real = mul(tirx.Cast("float32", acc + bias), mult)
    if res is not None:
        r = tirx.Cast("int32", res) - tirx.const(spec.r_zero, "int32")
        real = real + mul(tirx.Cast("float32", r), _f32(spec.r_scale))
    if spec.activation in ("hard_sigmoid", "hard_swish"):
        alpha, beta = (spec.alpha, spec.beta) if spec.activation == "hard_sigmoid" else (1.0 / 6.0, 0.5)
        gate = te.max(_f32(0.0), te.min(_f32(1.0), mul(real, _f32(alpha)) + _f32(beta)))
        real = gate if spec.activation == "hard_sigmoid" else real * gate
    else:
        real = activation_expr(real, spec.activation, spec.alpha, spec.beta)
    if spec.out_dtype == "float32":
        return real
    qmin, qmax = QUANT_RANGES[spec.out_dtype]
    q = tirx.nearbyint(real / _f32(spec.y_scale)) + _f32(spec.y_zero)
    return tirx.Cast(spec.out_dtype, te.max(te.min(q, _f32(qmax)), _f32(qmin)))


def cuda_qconv2d_compute(spec: QConv2dSpec, gpu: bool = True, bk: int = QCONV_BK) -> list[Any]:
    """TE tensors in PrimFunc order: data, weight, bias, multiplier, [residual], output."""
    from tvm import te, tirx

    n_, ic_, oc_ = spec.batch, spec.in_channels, spec.out_channels
    kh_, kw_ = spec.kernel
    out_shape = (n_, oc_, spec.out_h, spec.out_w)
    data = te.placeholder((n_, ic_, spec.in_h, spec.in_w), "uint8", name="data")
    bias = te.placeholder((oc_,), "int32", name="bias")
    mult = te.placeholder((oc_,), spec.mult_dtype, name="multiplier")
    res = te.placeholder(out_shape, spec.r_dtype, name="residual") if spec.residual else None
    xz = tirx.const(spec.x_zero, "uint8")

    def pixel(n: Any, c: Any, ih: Any, iw: Any, channel_ok: Any = True) -> Any:
        ok = tirx.all(channel_ok, ih >= 0, ih < spec.in_h, iw >= 0, iw < spec.in_w)
        return tirx.if_then_else(ok, data[n, c, ih, iw], xz)

    if spec.is_depthwise:
        weight = te.placeholder((oc_, kh_, kw_), "int8", name="weight")
        rkh = te.reduce_axis((0, kh_), name="kh")
        rkw = te.reduce_axis((0, kw_), name="kw")

        def dw_body(n: Any, c: Any, oh: Any, ow: Any) -> Any:
            x = pixel(n, c, *input_pos(spec, oh, ow, rkh, rkw))
            return te.sum(x.astype("int32") * weight[c, rkh, rkw].astype("int32"), axis=[rkh, rkw])

        conv = te.compute(out_shape, dw_body, name="conv")
    else:
        kp = ceil_div(_k4(spec), bk) * bk
        weight = te.placeholder((kp, oc_), "int32", name="weight")

        def a_body(n: Any, k: Any, oh: Any, ow: Any) -> Any:
            c4, ih, iw = im2col_pos(spec, k, oh, ow)
            word, flip = tirx.const(0, "uint32"), tirx.const(128, "uint32")
            for p in range(4):
                v = pixel(n, c4 * 4 + p, ih, iw, c4 * 4 + p < ic_).astype("uint32") ^ flip
                word = word | (v << tirx.const(8 * p, "uint32"))
            return tirx.Cast("int32", word)

        im2col = te.compute((n_, kp, spec.out_h, spec.out_w), a_body, name="im2col")
        rk = te.reduce_axis((0, kp), name="k")
        zero = tirx.const(0, "int32")
        conv = te.compute(
            out_shape,
            lambda n, oc, oh, ow: te.sum(_dp4a(im2col[n, rk, oh, ow], weight[rk, oc], zero, gpu), axis=rk),
            name="conv",
        )

    def epi(n: Any, oc: Any, oh: Any, ow: Any) -> Any:
        r = res[n, oc, oh, ow] if res is not None else None
        return _requantize(conv[n, oc, oh, ow], bias[oc], mult[oc], r, spec, gpu)

    out = te.compute(out_shape, epi, name="epilogue")
    return [data, weight, bias, mult, *([res] if res is not None else []), out]


def _accumulate_in_dp4a(sch: Any) -> None:
    """Rewrite the update ``acc = acc + __dp4a(a, w, 0)`` into ``acc = __dp4a(a, w, acc)``."""
    from tvm import tirx

    from backends.tvm.kernels.x86_int8_dot import replace_block_body

    block_rv = sch.get_sblock("conv_update")
    store = sch.get(block_rv).body
    call = store.value.b
    acc = tirx.BufferLoad(store.buffer, store.indices)
    new_value = tirx.call_pure_extern("int32", "__dp4a", call.args[1], call.args[2], acc)  # args[0]: the name
    replace_block_body(sch, block_rv, tirx.BufferStore(store.buffer, new_value, store.indices))


def cuda_qconv2d_kernel(spec: QConv2dSpec, target: TargetSpec) -> Kernel:
    """The scheduled CUDA int8 conv for ``spec`` (NCHW uint8 in, NCHW ``out_dtype`` out)."""
    from tvm import s_tir, te

    if not cuda_qconv_spec_ok(spec):
        raise NotImplementedError(f"no CUDA int8 conv2d kernel for {spec}")
    sch = s_tir.Schedule(te.create_prim_func(cuda_qconv2d_compute(spec, gpu=True)))
    kh, kw = spec.kernel
    if spec.is_depthwise:
        schedule_depthwise(sch)
        kind = "dw"
    else:
        tile = gemm_tile(spec.out_channels, spec.out_h, spec.out_w, QCONV_BK)
        schedule_implicit_gemm(sch, tile, "im2col", "weight")
        _accumulate_in_dp4a(sch)
        kind = "dp4a"
    name = f"kiln_cuda_qconv2d_{kind}{kh}x{kw}s{spec.strides[0]}_{spec.key()}"
    if spec.is_depthwise:
        func = mark_cuda_scheduled(sch.mod["main"], "cuda_qconv2d", name, "depthwise_conv", "cuda")
    else:
        func = mark_cuda_scheduled(sch.mod["main"], "cuda_qconv2d", name, "conv", "dp4a")
    out_shape = (spec.batch, spec.out_channels, spec.out_h, spec.out_w)
    return Kernel(name=name, func=func, out_shape=out_shape, out_dtype=spec.out_dtype)
