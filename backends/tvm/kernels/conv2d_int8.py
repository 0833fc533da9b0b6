"""Kiln's int8 conv2d kernel (kiln::QConv) for x86 and aarch64: u8 x s8 -> int32 -> fused requantize epilogue.

The integer part is exact: ``conv = sum x_q * w_q`` over (in-chunk, kh, kw, 4-channel group, p) in int32,
zero-point folded into the packed bias (see :mod:`backends.tvm.kernels.qconv_spec` for the math and layouts).
Four dot paths, picked by ``target.int8_dot``:

* ``vnni``: ``vpdpbusd`` (AVX-512 VNNI) over each (4-channel group, output block), manual tensorize; the
  accumulator starts at the packed bias (:func:`_seed_with_bias`), so the epilogue adds none;
* ``avx2``: zero-extended u8 and sign-extended s8 to int16, ``pmaddwd`` into two int32 partial sums per
  output channel (``conv[..., ob, 2]``), summed in the epilogue; exact for all u8/s8 values;
* ``sdot`` (aarch64 ``dotprod``): SDOT on activations shifted to int8 (``x - 128``, in the padding stage),
  ``128 * sum(w)`` (reduced from the weights in the kernel) added in the epilogue, manual tensorize
  (:mod:`backends.tvm.kernels.arm_int8_dot`);
* ``neon`` (aarch64 without dotprod): the ``avx2`` accumulator layout with NEON bodies: u8 and s8 widened
  to int16, exact int16 products (``|u8 * s8| <= 32640``), pairwise-added into int32 (``sadalp``);
* anything else: plain int32 math vectorized over the output block.

Depthwise convs use plain int32 math vectorized over the channel block on every target (memory bound),
with the spatial zero padding inlined into the taps (``x_zero`` outside the image) instead of a padded
copy of the input.

Every int32 accumulator tile is a buffer of global scope under ``STACK_BYTES`` (1 KiB): TVM puts it on
the stack, where LLVM keeps it in registers; a ``local`` buffer, or one of 1 KiB or more, would come from
the workspace pool, a ``TVMBackendAllocWorkspace``/``FreeWorkspace`` pair around every tile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backends.tvm.kernels.arm_int8_dot import (
    schedule_weight_sum,
    shifted_pad,
    tensorize_neon,
    tensorize_sdot,
    weight_sum,
)
from backends.tvm.kernels.epilogue import activation_expr
from backends.tvm.kernels.kernel import INT8_DOT_ISA, Kernel, mark_scheduled, simd_isa
from backends.tvm.kernels.qconv_spec import QUANT_RANGES, QConv2dSpec, linear_requant_expr
from backends.tvm.schedule_nest import fits_stack

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["qconv2d_kernel", "dot_kind", "qconv2d_name"]


def dot_kind(spec: QConv2dSpec, target: TargetSpec) -> str:
    """The dot path the kernel uses: "vnni", "avx2", "sdot", "neon", "plain" or "depthwise"."""
    if spec.is_depthwise:
        return "depthwise"
    if target.is_arm and target.int8_dot == "dotprod" and spec.out_block % 4 == 0:
        return "sdot"
    if target.is_arm and spec.out_block % 4 == 0:
        return "neon"
    x86 = target.is_cpu and not target.is_arm
    if x86 and target.int8_dot == "vnni" and spec.out_block % 4 == 0:
        return "vnni"
    if x86 and target.int8_dot in ("vnni", "avx2") and spec.out_block % 4 == 0:
        return "avx2"
    return "plain"


def qconv2d_name(spec: QConv2dSpec, target: TargetSpec) -> str:
    """Deterministic symbol name: shape summary, dot path and spec hash."""
    kh, kw = spec.kernel
    kind = "dw" if spec.is_depthwise else "conv"
    return f"kiln_qconv2d_{kind}{kh}x{kw}s{spec.strides[0]}_{dot_kind(spec, target)}_{spec.key()}"


def _fence(x: Any) -> Any:
    """``x`` behind ``llvm.arithmetic.fence``: rounded on its own, never fused into a neighbouring FMA.

    The call carries ``x``'s own (scalar or vector) type: TVM's vectorizer cannot widen an LLVM intrinsic
    call, so vector epilogues build the fence on whole vectors (see :func:`_vector_epilogue`).
    """
    from tvm import tirx

    return tirx.call_llvm_pure_intrin(str(x.ty), "llvm.arithmetic.fence", x)


def _f32(v: float) -> Any:
    from tvm import tirx

    return tirx.const(float(v), "float32")


def _activation(x: Any, spec: QConv2dSpec) -> Any:
    """ONNX activation math; hard_sigmoid/hard_swish fence ``alpha*x`` so it rounds before ``+ beta``."""
    from tvm import te

    if spec.activation in ("hard_sigmoid", "hard_swish"):
        alpha, beta = (spec.alpha, spec.beta) if spec.activation == "hard_sigmoid" else (1.0 / 6.0, 0.5)
        gate = te.max(_f32(0.0), te.min(_f32(1.0), _fence(x * _f32(alpha)) + _f32(beta)))
        return gate if spec.activation == "hard_sigmoid" else x * gate
    return activation_expr(x, spec.activation, spec.alpha, spec.beta)


def _needs_fence(spec: QConv2dSpec) -> bool:
    """Whether the epilogue holds a fenced product (then it is vectorized by hand)."""
    return spec.residual or spec.activation in ("hard_sigmoid", "hard_swish")


def _epilogue_value(acc: Any, bias: Any, mult: Any, res: Any, spec: QConv2dSpec, lanes: int) -> Any:
    """The requantize epilogue on loaded values (all scalars, or all ``lanes``-wide vectors).

    The linear form (``spec.linear_requant``) is ``acc * M`` in float64 (:func:`linear_requant_expr`); the
    others are float32 (``acc * m``, residual, activation, ``/ y_scale``), as in the module docstring of
    :mod:`backends.tvm.kernels.qconv_spec`.
    """
    from tvm import te, tirx

    def dt(base: str) -> str:
        return base if lanes == 1 else f"{base}x{lanes}"

    if spec.linear_requant:
        return linear_requant_expr(tirx.Cast(dt("float64"), acc + bias) * mult, spec, dt(spec.out_dtype))
    real = tirx.Cast(dt("float32"), acc + bias) * mult
    if res is not None:
        r = tirx.Cast(dt("int32"), res) - tirx.const(spec.r_zero, "int32")
        # fences keep LLVM from contracting a*b + c*d into an FMA (the reference rounds each product)
        real = _fence(real) + _fence(tirx.Cast(dt("float32"), r) * _f32(spec.r_scale))
    real = _activation(real, spec)
    if spec.out_dtype == "float32":
        return real
    qmin, qmax = QUANT_RANGES[spec.out_dtype]
    q = tirx.nearbyint(real / _f32(spec.y_scale)) + _f32(spec.y_zero)
    return tirx.Cast(dt(spec.out_dtype), te.max(te.min(q, _f32(qmax)), _f32(qmin)))


def _compute(spec: QConv2dSpec, kind: str) -> tuple[list[Any], Any]:
    """TE tensors (args in PrimFunc order) and the conv stage."""
    from tvm import te, tirx

    n_, icc_, ih_, iw_, ib = spec.data_shape
    occ_, ob = spec.out_chunks, spec.out_block
    kh_, kw_ = spec.kernel
    sh, sw = spec.strides
    dh, dw = spec.dilations
    pt, pl, pb, pr = spec.pads
    data = te.placeholder(spec.data_shape, spec.in_dtype, name="data")
    weight = te.placeholder(spec.weight_shape, "int8", name="weight")
    bias = te.placeholder((occ_, ob), "int32", name="bias")
    mult = te.placeholder((occ_, ob), spec.mult_dtype, name="multiplier")
    res = te.placeholder(spec.out_shape, spec.r_dtype, name="residual") if spec.residual else None

    if kind == "sdot":
        padded = shifted_pad(data, spec)
    elif any(spec.pads):
        zero = tirx.const(spec.x_zero, spec.in_dtype)

        def pad_body(n: Any, c: Any, h: Any, w: Any, b: Any) -> Any:
            inside = tirx.all(h >= pt, h < pt + ih_, w >= pl, w < pl + iw_)
            return tirx.if_then_else(inside, data[n, c, h - pt, w - pl, b], zero)

        padded = te.compute((n_, icc_, ih_ + pt + pb, iw_ + pl + pr, ib), pad_body, name="pad")
    else:
        padded = data

    rkh = te.reduce_axis((0, kh_), name="kh")
    rkw = te.reduce_axis((0, kw_), name="kw")
    out_hw = (spec.out_h, spec.out_w)
    if kind == "depthwise":
        conv = te.compute(
            (n_, occ_, *out_hw, ob),
            lambda n, c, oh, ow, b: te.sum(
                padded[n, c, oh * sh + rkh * dh, ow * sw + rkw * dw, b].astype("int32")
                * weight[c, rkh, rkw, b].astype("int32"),
                axis=[rkh, rkw],
            ),
            name="conv",
        )
    elif kind in ("avx2", "neon"):
        # j = 2*bo + h: two int32 partial sums per output channel (channel pairs 2h, 2h+1 of each group)
        ric = te.reduce_axis((0, icc_), name="icc")
        rg = te.reduce_axis((0, ib // 4), name="g")
        rp = te.reduce_axis((0, 2), name="p")
        conv = te.compute(
            (n_, occ_, *out_hw, 2 * ob),
            lambda n, oc, oh, ow, j: te.sum(
                padded[n, ric, oh * sh + rkh * dh, ow * sw + rkw * dw, rg * 4 + (j % 2) * 2 + rp].astype(
                    "int32"
                )
                * weight[oc, ric, rkh, rkw, rg, j // 2, (j % 2) * 2 + rp].astype("int32"),
                axis=[ric, rkh, rkw, rg, rp],
            ),
            name="conv",
        )
    else:
        ric = te.reduce_axis((0, icc_), name="icc")
        rg = te.reduce_axis((0, ib // 4), name="g")
        rp = te.reduce_axis((0, 4), name="p")
        conv = te.compute(
            (n_, occ_, *out_hw, ob),
            lambda n, oc, oh, ow, bo: te.sum(
                padded[n, ric, oh * sh + rkh * dh, ow * sw + rkw * dw, rg * 4 + rp].astype("int32")
                * weight[oc, ric, rkh, rkw, rg, bo, rp].astype("int32"),
                axis=[ric, rkh, rkw, rg, rp],
            ),
            name="conv",
        )

    # sdot: sum x*w = sum (x - 128)*w + 128*sum(w), the second term from the weights in the kernel
    wsum = weight_sum(weight, spec) if kind == "sdot" else None

    def epi_body(n: Any, oc: Any, oh: Any, ow: Any, bo: Any) -> Any:
        if kind in ("avx2", "neon"):
            acc = conv[n, oc, oh, ow, bo * 2] + conv[n, oc, oh, ow, bo * 2 + 1]
        elif wsum is not None:
            acc = wsum[oc, bo] + conv[n, oc, oh, ow, bo]  # wsum first: its stage then precedes the conv
        else:
            acc = conv[n, oc, oh, ow, bo]
        r = res[n, oc, oh, ow, bo] if res is not None else None
        b = tirx.const(0, "int32") if kind == "vnni" else bias[oc, bo]  # vnni: the bias seeds the sum
        return _epilogue_value(acc, b, mult[oc, bo], r, spec, 1)

    out = te.compute(spec.out_shape, epi_body, name="epilogue")
    args = [data, weight, bias, mult, *([res] if res is not None else []), out]
    return args, conv


def _linear_halves(load: Any, spec: QConv2dSpec, kind: str) -> Any:
    """The linear requantize on ``out_block`` lanes as float64 halves of (at most) 8 lanes each.

    Each half is ``v = float64(acc + bias) * M`` clamped once to ``[L, H]`` (:attr:`QConv2dSpec.
    requant_clamp`) and rounded to int32 by one rounding convert (:func:`rint_f64_to_i32`; halves of
    other widths: :func:`linear_requant_expr` to int32); the int32 halves are joined into one
    ``out_block``-wide vector, ``y_zero`` is added in int32 and the sum narrowed to the output dtype
    once: one packed store. ``L, H`` lie in ``[qmin - y_zero, qmax - y_zero]``, so nothing overflows.
    """
    from tvm import te, tirx

    from backends.tvm.kernels.x86_int8_dot import RINT_F64_LANES, rint_f64_to_i32

    lanes = spec.out_block
    half = 8 if lanes > 8 and lanes % 8 == 0 else lanes
    lo, hi = spec.requant_clamp
    parts = []
    for h in range(0, lanes, half):
        if kind in ("avx2", "neon"):
            acc = load("conv", half, 2, 2 * h) + load("conv", half, 2, 2 * h + 1)
        else:
            acc = load("conv", half, 1, h)
        if kind == "sdot":
            acc = load("wsum", half, 1, h) + acc
        real = tirx.Cast(f"float64x{half}", acc + load("bias", half, 1, h)) * load("multiplier", half, 1, h)
        if half in RINT_F64_LANES:
            clamped = te.min(te.max(real, tirx.const(lo, "float64")), tirx.const(hi, "float64"))
            parts.append(rint_f64_to_i32(clamped, half) + tirx.const(spec.y_zero, "int32"))
        else:
            parts.append(linear_requant_expr(real, spec, f"int32x{half}"))
    whole = (
        parts[0] if len(parts) == 1 else tirx.Shuffle(parts, [tirx.const(i, "int32") for i in range(lanes)])
    )
    return tirx.Cast(f"{spec.out_dtype}x{lanes}", whole)


def _vectorize_epilogue(sch: Any, spec: QConv2dSpec, kind: str, wide: bool) -> None:
    """Vectorize the epilogue over the output block.

    TVM's vectorizer scalarizes LLVM intrinsic calls (the fences), which leaves the whole epilogue scalar;
    fenced epilogues are therefore written by hand on ``out_block``-wide vectors (same ops, same order).
    On AVX-512 targets (``wide``) the linear requantize is also written by hand (:func:`_linear_halves`)
    with its pixel loops unrolled: left as a loop, LLVM may re-vectorize the float64 epilogue across pixels
    (gathers, byte-wise stores; 3.6x slower on yunet's 16-channel 1x1 convs). Narrower targets keep TVM's
    vectorizer (the hand-written form measured slower on AVX2).
    """
    from tvm import tirx

    from backends.tvm.kernels.x86_int8_dot import region_min, replace_block_body

    loops = sch.get_loops(sch.get_sblock("epilogue"))
    inner = loops[-1]
    linear = wide and spec.linear_requant
    if not _needs_fence(spec) and not linear:
        sch.vectorize(inner)
        return
    if linear:
        for loop in loops[2:-1]:  # the pixel loops inside the (fused, output-width tile) loops
            sch.unroll(loop)
    block_rv = sch.blockize(inner)
    block = sch.get(block_rv)
    lanes = spec.out_block
    reads = {r.source.name: r.source for r in block.reads}
    reads["conv"] = next(buf for name, buf in reads.items() if name.startswith("conv"))  # conv_local

    def load(name: str, n: int, stride: int = 1, offset: int = 0) -> Any:
        if name == "bias" and name not in reads:  # vnni: the accumulator starts at the bias
            return tirx.Broadcast(tirx.const(0, "int32"), n)
        buf = reads[name]
        idx = region_min(block, buf)
        return tirx.BufferLoad(buf, [*idx[:-1], tirx.Ramp(idx[-1] + offset, stride, n)])

    if linear:
        value = _linear_halves(load, spec, kind)
    else:
        acc = (
            load("conv", lanes, 2) + load("conv", lanes, 2, 1)
            if kind in ("avx2", "neon")
            else load("conv", lanes)
        )
        if kind == "sdot":
            acc = load("wsum", lanes) + acc
        res = load("residual", lanes) if spec.residual else None
        value = _epilogue_value(acc, load("bias", lanes), load("multiplier", lanes), res, spec, lanes)
    out = block.writes[0].source
    o_idx = region_min(block, out, writes=True)
    store = tirx.BufferStore(out, value, [*o_idx[:-1], tirx.Ramp(o_idx[-1], 1, lanes)])
    replace_block_body(sch, block_rv, store)


def _tile(spec: QConv2dSpec, kind: str) -> tuple[int, int]:
    """Register tile ``(ow_inner, oc_chunks_inner)``; accumulators = ow_inner * oc_inner * vectors/block."""
    pairs = 2 if kind in ("avx2", "neon") else 1  # int32 partial sums per output channel
    vec_bytes = {"vnni": 64, "sdot": 16, "neon": 16}.get(kind, 32)
    regs_per_block = max(1, (spec.out_block * 4 * pairs) // vec_bytes)
    budget = {"vnni": 24, "avx2": 12, "sdot": 20, "neon": 16}.get(kind, 8)
    oc_in = 2 if spec.out_chunks % 2 == 0 and 2 * regs_per_block * 2 <= budget else 1
    ow_max = max(1, budget // (oc_in * regs_per_block))
    # the int32 accumulator tile is a global buffer under STACK_BYTES: a stack array LLVM keeps in
    # registers; a bigger one (or a "local" one) is a workspace alloc/free call pair around every tile
    pixel = oc_in * spec.out_block * pairs
    while ow_max > 1 and not fits_stack(ow_max * pixel):
        ow_max -= 1
    ow = spec.out_w
    divisors = [d for d in range(1, min(ow, ow_max) + 1) if ow % d == 0]
    best = max(divisors)
    if best * 2 <= min(ow, ow_max):  # poor divisor: use a predicated split
        best = min(ow, ow_max)
    return best, oc_in


def _schedule_pad(sch: Any) -> None:
    pad = sch.get_sblock("pad")
    n, c, h, w, b = sch.get_loops(pad)
    sch.parallel(sch.fuse(n, c, h))
    sch.vectorize(b)


def _schedule_general(sch: Any, spec: QConv2dSpec, kind: str, wide: bool) -> None:
    from backends.tvm.kernels.x86_int8_dot import manual_tensorize

    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    ow_t, oc_t = _tile(spec, kind)
    loops = sch.get_loops(conv)
    if kind in ("avx2", "neon"):
        n, oc, oh, ow, j, icc, kh, kw, g, p = loops
        bo, h = sch.split(j, [None, 2])
    else:
        n, oc, oh, ow, bo, icc, kh, kw, g, p = loops
        h = None
    oco, oci = sch.split(oc, [None, oc_t])
    owo, owi = sch.split(ow, [None, ow_t])
    if kind in ("avx2", "neon"):
        sch.reorder(n, oco, oh, owo, icc, kh, kw, g, oci, owi, bo, h, p)
    elif kind == "vnni":
        sch.reorder(n, oco, oh, owo, icc, kh, kw, g, oci, owi, bo, p)
    else:
        sch.reorder(n, oco, oh, owo, icc, kh, kw, g, oci, owi, p, bo)
    sch.parallel(sch.fuse(n, oco, oh))
    sch.reverse_compute_at(epi, owo)
    # the accumulator tile keeps the global scope: a stack array (module docstring), no workspace call
    sch.unroll(oci)
    sch.unroll(owi)
    if kind == "plain":
        sch.unroll(p)
        sch.vectorize(bo)
    init = sch.decompose_reduction(conv, icc)
    if kind == "vnni":
        _seed_with_bias(sch, sch.blockize(sch.get_loops(init)[-1]), spec.out_block)
    else:
        sch.vectorize(sch.get_loops(init)[-1])
    _vectorize_epilogue(sch, spec, kind, wide)
    if kind in ("vnni", "avx2"):
        dot = sch.blockize(bo)
        manual_tensorize(sch, dot, "pad" if any(spec.pads) else "data", "weight", kind, spec.out_block)
    if kind == "neon":
        tensorize_neon(sch, sch.blockize(bo), "pad" if any(spec.pads) else "data", "weight", spec.out_block)


def _seed_with_bias(sch: Any, block_rv: Any, ob: int) -> None:
    """The blockized accumulator init ``C[..., 0:ob] = 0`` becomes ``C[..., 0:ob] = bias[oc, 0:ob]``.

    ``sum + bias = (bias + x_0 w_0) + x_1 w_1 + ...`` exactly in int32, so the epilogue adds no bias;
    and a non-zero init is not merged by LLVM into a ``memset`` call per output tile.
    """
    from tvm import ir, tirx
    from tvm.s_tir.stmt import SBlock

    from backends.tvm.kernels.x86_int8_dot import region_min

    block = sch.get(block_rv)
    acc = block.writes[0].source
    idx = region_min(block, acc, writes=True)
    bias = next(b for b in sch.mod["main"].params if b.name == "bias")
    src = tirx.BufferLoad(bias, [idx[1], tirx.Ramp(0, 1, ob)])
    body = tirx.BufferStore(acc, src, [*idx[:-1], tirx.Ramp(idx[-1], 1, ob)])
    reads = [tirx.BufferRegion(bias, [ir.Range.from_min_extent(idx[1], 1), ir.Range.from_min_extent(0, ob)])]
    new_block = SBlock(
        block.iter_vars, reads, block.writes, block.name_hint, body, None,
        block.alloc_buffers, block.match_buffers, block.annotations,
    )  # fmt: skip
    sch.state.replace(sch.get_sref(block_rv), new_block, {block: new_block})


def _schedule_sdot(sch: Any, spec: QConv2dSpec, wide: bool) -> None:
    """The VNNI nest with SDOT bodies; the epilogue's loops lead (it also reads the root ``wsum`` stage,
    which ``reverse_compute_at`` would refuse) and the conv is computed at its output-width tile."""
    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    ow_t, oc_t = _tile(spec, "sdot")
    n, oc, oh, ow, bo = sch.get_loops(epi)
    oco, oci = sch.split(oc, [None, oc_t])
    owo, owi = sch.split(ow, [None, ow_t])
    sch.reorder(n, oco, oh, owo, oci, owi, bo)
    sch.parallel(sch.fuse(n, oco, oh))
    sch.compute_at(conv, owo, preserve_unit_loops=True)
    _, _, oci, _, owi, bo, icc, kh, kw, g, p = sch.get_loops(conv)[-11:]  # owo, n, oc, oh, ow, bo, ...
    sch.reorder(icc, kh, kw, g, oci, owi, bo, p)
    sch.unroll(oci)
    sch.unroll(owi)
    init = sch.decompose_reduction(conv, icc)
    sch.vectorize(sch.get_loops(init)[-1])
    _vectorize_epilogue(sch, spec, "sdot", wide)
    tensorize_sdot(sch, sch.blockize(bo), "pad", "weight", spec.out_block)
    schedule_weight_sum(sch, spec.out_block)


def _schedule_depthwise(sch: Any, spec: QConv2dSpec, wide: bool) -> None:
    conv = sch.get_sblock("conv")
    epi = sch.get_sblock("epilogue")
    n, c, oh, ow, b, kh, kw = sch.get_loops(conv)
    ow_t = next(d for d in (8, 7, 6, 5, 4, 3, 2, 1) if spec.out_w % d == 0)
    owo, owi = sch.split(ow, [None, ow_t])
    sch.reorder(n, c, oh, owo, kh, kw, owi, b)
    sch.parallel(sch.fuse(n, c, oh))
    sch.reverse_compute_at(epi, owo)
    sch.unroll(owi)
    sch.vectorize(b)
    init = sch.decompose_reduction(conv, kh)
    sch.vectorize(sch.get_loops(init)[-1])
    _vectorize_epilogue(sch, spec, "depthwise", wide)


def qconv2d_kernel(spec: QConv2dSpec, target: TargetSpec) -> Kernel:
    """The scheduled int8 conv2d kernel for ``spec`` on ``target`` (see the module docstring)."""
    from tvm import s_tir, te

    spec.validate()
    kind = dot_kind(spec, target)
    args, _ = _compute(spec, kind)
    func = te.create_prim_func(args)
    sch = s_tir.Schedule(func)
    if kind == "depthwise" and any(spec.pads):
        sch.compute_inline(sch.get_sblock("pad"))  # no padded copy: the border taps read x_zero
    elif any(spec.pads) or kind == "sdot":
        _schedule_pad(sch)
    wide = target.lanes >= 16  # AVX-512: hand-written linear requantize epilogue
    if kind == "depthwise":
        _schedule_depthwise(sch, spec, wide)
    elif kind == "sdot":
        _schedule_sdot(sch, spec, wide)
    else:
        _schedule_general(sch, spec, kind, wide)
    name = qconv2d_name(spec, target)
    op_class = "depthwise_conv" if kind == "depthwise" else "conv"
    isa = INT8_DOT_ISA.get(kind) or simd_isa(target)  # depthwise: int32 math in the SIMD registers
    func = sch.mod["main"].with_attr("global_symbol", name)
    scheduled = mark_scheduled(func, f"qconv2d_{kind}", op_class, isa)
    return Kernel(name=name, func=scheduled, out_shape=spec.out_shape, out_dtype=spec.out_dtype)
