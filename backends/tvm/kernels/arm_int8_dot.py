"""aarch64 int8 dot products for kiln::QConv, swapped in by manual tensorize: SDOT (armv8.2-a ``dotprod``)
and, without dotprod, widening NEON multiplies with pairwise accumulation (:func:`neon_body`).

SDOT is signed x signed (``usdot`` needs i8mm), so the uint8 activations are shifted to int8 first:

* ``x_s = x - 128`` (a bit flip of the top bit, done in the padding stage: spatial padding becomes
  ``x_zero - 128``), hence ``sum x * w = sum x_s * w + 128 * sum(w)``;
* ``wsum[oc] = 128 * sum(w[oc])`` is reduced from the packed weights inside the kernel
  (``C - sdot(0, W, bcast(-128))``; about ``1 / (OH * OW)`` of the conv's work) and the epilogue adds
  it to the accumulator, so the bias folding of the other paths stays (``qconv_spec.pack_qbias``
  is unchanged and target-independent);
* one SDOT is ``C[o] += sum_{p<4} A[p] * W[o, p]`` for 4 output channels:
  ``sdot(<4 x i32> C[0:4], <16 x i8> W[0:4, 0:4], <16 x i8> bcast32(A[0:4]))``. Exact: every
  product is at most ``2^14`` in magnitude, every sum is int32 (wrapping int32 sums of the shifted
  terms give the same final int32 as the unshifted ones).
"""

from __future__ import annotations

from typing import Any

from backends.tvm.kernels.x86_int8_dot import region_min, replace_block_body

__all__ = [
    "SDOT_SHIFT",
    "shifted_pad",
    "weight_sum",
    "sdot_body",
    "tensorize_sdot",
    "schedule_weight_sum",
    "neon_body",
    "tensorize_neon",
]

SDOT_SHIFT = 128  # uint8 activation -> int8: x - 128


def shifted_pad(data: Any, spec: Any) -> Any:
    """TE stage ``pad``: ``int8(x - 128)`` inside, ``int8(x_zero - 128)`` in the spatial padding."""
    from tvm import te, tirx

    n_, icc_, ih_, iw_, ib = spec.data_shape
    pt, pl, pb, pr = spec.pads
    zero = tirx.const(spec.x_zero - SDOT_SHIFT, "int8")

    def body(n: Any, c: Any, h: Any, w: Any, b: Any) -> Any:
        shifted = tirx.Cast("int8", data[n, c, h - pt, w - pl, b].astype("int32") - SDOT_SHIFT)
        if not any(spec.pads):
            return shifted
        inside = tirx.all(h >= pt, h < pt + ih_, w >= pl, w < pl + iw_)
        return tirx.if_then_else(inside, shifted, zero)

    return te.compute((n_, icc_, ih_ + pt + pb, iw_ + pl + pr, ib), body, name="pad")


def weight_sum(weight: Any, spec: Any) -> Any:
    """TE stage ``wsum[oc, bo] = sum_{icc, kh, kw, g, p} 128 * W[oc, icc, kh, kw, g, bo, p]`` (int32)."""
    from tvm import te

    _, icc_, kh_, kw_, g_, ob, _ = spec.weight_shape
    ric = te.reduce_axis((0, icc_), name="wicc")
    rkh = te.reduce_axis((0, kh_), name="wkh")
    rkw = te.reduce_axis((0, kw_), name="wkw")
    rg = te.reduce_axis((0, g_), name="wg")
    rp = te.reduce_axis((0, 4), name="wp")
    return te.compute(
        (spec.out_chunks, ob),
        lambda oc, bo: te.sum(
            weight[oc, ric, rkh, rkw, rg, bo, rp].astype("int32") * SDOT_SHIFT, axis=[ric, rkh, rkw, rg, rp]
        ),
        name="wsum",
    )


def _ramp(indices: list[Any], lanes: int) -> list[Any]:
    from tvm import tirx

    return [*indices[:-1], tirx.Ramp(indices[-1], 1, lanes)]


def sdot_body(c_buf: Any, c_idx: list[Any], a_word: Any | None, w_buf: Any, w_idx: list[Any], ob: int) -> Any:
    """``C[o] += sum_{p<4} a[p] * W[o, p]`` for ``o < ob`` (``ob % 4 == 0``): ``ob / 4`` SDOTs.

    ``a_word`` is the int32 holding the 4 int8 activations ``a[0:4]`` (broadcast to all 4 lanes);
    ``None`` means ``a[p] = 128``: ``C[o] -= sdot(0, W[o], -128)`` (128 is no int8).
    """
    from tvm import tirx

    neg = a_word is None
    word = tirx.const(-0x7F7F7F80, "int32") if neg else a_word  # 0x80808080: four int8 -128
    a8 = tirx.reinterpret("int8x16", tirx.Broadcast(word, 4))
    stmts = []
    for q in range(ob // 4):
        c_i = [*c_idx[:-1], c_idx[-1] + 4 * q]
        w_i = [*w_idx[:-2], w_idx[-2] + 4 * q, w_idx[-1]]
        c_load = tirx.BufferLoad(c_buf, _ramp(c_i, 4))
        w_load = tirx.BufferLoad(w_buf, _ramp(w_i, 16))
        if neg:
            zero = tirx.Broadcast(tirx.const(0, "int32"), 4)
            val = c_load - tirx.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.sdot", zero, w_load, a8)
        else:
            val = tirx.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.sdot", c_load, w_load, a8)
        stmts.append(tirx.BufferStore(c_buf, val, _ramp(c_i, 4)))
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def tensorize_sdot(sch: Any, block_rv: Any, data_buf_name: str | None, weight_buf_name: str, ob: int) -> None:
    """Replace the body of the blockized ``(bo, p)`` dot block with :func:`sdot_body`.

    ``data_buf_name`` names the int8 activation buffer (4 bytes read per block); ``None`` means
    activations of 128 (the weight-sum stage).
    """
    from tvm import tirx

    block = sch.get(block_rv)
    c_buf = block.writes[0].source
    w_buf = next(r.source for r in block.reads if r.source.name == weight_buf_name)
    a_word = None
    if data_buf_name is not None:
        a_buf = next(r.source for r in block.reads if r.source.name == data_buf_name)
        a_word = tirx.reinterpret("int32", tirx.BufferLoad(a_buf, _ramp(region_min(block, a_buf), 4)))
    body = sdot_body(
        c_buf, region_min(block, c_buf, writes=True), a_word, w_buf, region_min(block, w_buf), ob
    )
    replace_block_body(sch, block_rv, body)


def schedule_weight_sum(sch: Any, ob: int) -> None:
    """``wsum``: one SDOT against -128 per (4-channel group, 4 output channels)."""
    blk = sch.get_sblock("wsum")
    oc, bo, icc, kh, kw, g, p = sch.get_loops(blk)
    sch.reorder(oc, icc, kh, kw, g, bo, p)
    init = sch.decompose_reduction(blk, icc)
    sch.vectorize(sch.get_loops(init)[-1])
    tensorize_sdot(sch, sch.blockize(bo), None, "weight", ob)


def neon_body(
    c_buf: Any, c_idx: list[Any], a_buf: Any, a_idx: list[Any], w_buf: Any, w_idx: list[Any], ob: int
) -> Any:
    """``C[2o + h] += sum_{p2<2} A[2h+p2] * W[o, 2h+p2]`` for ``o < ob`` (``ob % 4 == 0``), plain NEON.

    Per 2 output channels: 8 weight bytes sign-extended and the 4 activation bytes (twice)
    zero-extended to int16x8, one int16 multiply (exact: ``|u8 * s8| <= 32640``) and one pairwise
    widening add into int32x4 (``saddlp``, fused with the add into ``sadalp``).
    """
    from tvm import tirx

    a32 = tirx.reinterpret("int32", tirx.BufferLoad(a_buf, _ramp(a_idx, 4)))
    a16 = tirx.Cast("int16x8", tirx.reinterpret("uint8x8", tirx.Broadcast(a32, 2)))
    stmts = []
    for half in range(ob // 2):
        c_i = [*c_idx[:-1], c_idx[-1] + 4 * half]
        w_i = [*w_idx[:-2], w_idx[-2] + 2 * half, w_idx[-1]]
        w16 = tirx.Cast("int16x8", tirx.BufferLoad(w_buf, _ramp(w_i, 8)))
        pairs = tirx.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.saddlp", w16 * a16)
        c_load = tirx.BufferLoad(c_buf, _ramp(c_i, 4))
        stmts.append(tirx.BufferStore(c_buf, c_load + pairs, _ramp(c_i, 4)))
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def tensorize_neon(sch: Any, block_rv: Any, data_buf_name: str, weight_buf_name: str, ob: int) -> None:
    """Replace the body of the blockized ``(bo, h, p2)`` block (``avx2`` layout) with :func:`neon_body`."""
    block = sch.get(block_rv)
    c_buf = block.writes[0].source
    a_buf = next(r.source for r in block.reads if r.source.name == data_buf_name)
    w_buf = next(r.source for r in block.reads if r.source.name == weight_buf_name)
    body = neon_body(
        c_buf, region_min(block, c_buf, writes=True), a_buf, region_min(block, a_buf), w_buf,
        region_min(block, w_buf), ob,
    )  # fmt: skip
    replace_block_body(sch, block_rv, body)
