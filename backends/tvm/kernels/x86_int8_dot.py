"""x86 int8 dot-product bodies and the manual tensorize that swaps them into a blockized sub-nest.

``sch.tensorize`` segfaults in TVM 0.27, so :func:`manual_tensorize` takes the block that ``blockize``
made over an inner ``(ob, p)`` (VNNI) or ``(ob, h, p2)`` (AVX2) nest and replaces its body, through
``sch.state.replace``, with vector statements built from ``tvm.tirx`` constructors:

* ``vnni``: ``C[0:ob] = vpdpbusd(C[0:ob], bcast32(A[0:4]), W[0:ob, 0:4])``, i.e.
  ``C[o] += sum_{p<4} u8(A[p]) * s8(W[o, p])`` exactly (int32 accumulate, no intermediate saturation);
* ``avx2``: per 4 output channels, ``C[2o + h] += sum_{p2<2} u16(A[2h+p2]) * s16(W[o, 2h+p2])`` with one
  ``pmaddwd`` on zero-extended activations and sign-extended weights (products and pair sums fit exactly;
  the two partial sums per channel are added in the epilogue).

:func:`rint_f64_to_i32` is the requantize epilogue's rounding convert: ``int32(round_half_even(v))`` in
one ``vcvtpd2dq`` (8 lanes, embedded round-to-nearest-even) or AVX ``vcvtpd2dq`` (4 lanes) instead of a
round then a truncating convert; ``v`` must already lie in int32's range.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "manual_tensorize",
    "vnni_body",
    "avx2_body",
    "region_min",
    "replace_block_body",
    "rint_f64_to_i32",
    "RINT_F64_LANES",
]

# lanes -> the x86 intrinsic converting float64 lanes to int32 with round-half-even
RINT_F64_LANES = {8: "llvm.x86.avx512.mask.cvtpd2dq.512", 4: "llvm.x86.avx.cvt.pd2dq.256"}
_ROUND_NEAREST_SAE = 8  # _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC


def _vec_index(indices: list[Any], lanes: int) -> list[Any]:
    """``indices`` with the last one turned into a contiguous ramp of ``lanes`` (flattened across dims)."""
    from tvm import tirx

    return [*indices[:-1], tirx.Ramp(indices[-1], 1, lanes)]


def region_min(block: Any, buf: Any, writes: bool = False) -> list[Any]:
    """The first index of ``buf``'s read (or write) region in ``block``."""
    regions = block.writes if writes else block.reads
    for r in regions:
        if r.source.same_as(buf):
            return [rng.min for rng in r.region]
    raise ValueError(f"buffer {buf.name} not accessed by block {block.name_hint}")


def vnni_body(
    c_buf: Any, c_idx: list[Any], a_buf: Any, a_idx: list[Any], w_buf: Any, w_idx: list[Any], ob: int
) -> Any:
    """``C[o] += sum_p A[p] * W[o, p]`` for ``o < ob`` with ``vpdpbusd`` (512/256/128-bit pieces)."""
    from tvm import tirx

    a_u8 = tirx.BufferLoad(a_buf, _vec_index(a_idx, 4))
    a_bcast_src = tirx.reinterpret("int32", a_u8)
    stmts = []
    start = 0
    while start < ob:
        lanes = next(n for n in (16, 8, 4) if (ob - start) % n == 0 and n <= ob - start)
        name = {
            16: "llvm.x86.avx512.vpdpbusd.512",
            8: "llvm.x86.avx512.vpdpbusd.256",
            4: "llvm.x86.avx512.vpdpbusd.128",
        }
        c_i = [*c_idx[:-1], c_idx[-1] + start]
        w_i = [*w_idx[:-2], w_idx[-2] + start, w_idx[-1]]
        c_load = tirx.BufferLoad(c_buf, _vec_index(c_i, lanes))
        w_load = tirx.BufferLoad(w_buf, _vec_index(w_i, 4 * lanes))
        # LLVM 22 types both byte operands as <4*lanes x i8>
        a8 = tirx.reinterpret(f"int8x{4 * lanes}", tirx.Broadcast(a_bcast_src, lanes))
        val = tirx.call_llvm_pure_intrin(f"int32x{lanes}", name[lanes], c_load, a8, w_load)
        stmts.append(tirx.BufferStore(c_buf, val, _vec_index(c_i, lanes)))
        start += lanes
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def avx2_body(
    c_buf: Any, c_idx: list[Any], a_buf: Any, a_idx: list[Any], w_buf: Any, w_idx: list[Any], ob: int
) -> Any:
    """``C[2o + h] += sum_{p2} A[2h+p2] * W[o, 2h+p2]`` for ``o < ob`` (``ob % 4 == 0``) with ``pmaddwd``."""
    from tvm import tirx

    a_u8 = tirx.BufferLoad(a_buf, _vec_index(a_idx, 4))
    a32 = tirx.reinterpret("int32", a_u8)
    a_rep = tirx.reinterpret("uint8x16", tirx.Broadcast(a32, 4))
    a16 = tirx.Cast("int16x16", a_rep)
    stmts = []
    for q in range(ob // 4):
        # C last index: 2*o + h (flat partial sums); W indices: [..., o, p]
        c_i = [*c_idx[:-1], c_idx[-1] + 8 * q]
        w_i = [*w_idx[:-2], w_idx[-2] + 4 * q, w_idx[-1]]
        w16 = tirx.Cast("int16x16", tirx.BufferLoad(w_buf, _vec_index(w_i, 16)))
        c_load = tirx.BufferLoad(c_buf, _vec_index(c_i, 8))
        prod = tirx.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", w16, a16)
        stmts.append(tirx.BufferStore(c_buf, c_load + prod, _vec_index(c_i, 8)))
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def manual_tensorize(
    sch: Any, block_rv: Any, data_buf_name: str, weight_buf_name: str, kind: str, ob: int
) -> None:
    """Replace the body of the blockized dot block ``block_rv`` with the ``kind`` ("vnni"/"avx2") body.

    The block writes the accumulator (region min = first output element of the block), reads the
    4 activation bytes of ``data_buf_name`` and the ``4 * ob`` weight bytes of ``weight_buf_name``.
    """
    block = sch.get(block_rv)
    c_buf = block.writes[0].source
    a_buf = next(r.source for r in block.reads if r.source.name == data_buf_name)
    w_buf = next(r.source for r in block.reads if r.source.name == weight_buf_name)
    c_idx = region_min(block, c_buf, writes=True)
    a_idx = region_min(block, a_buf)
    w_idx = region_min(block, w_buf)
    build = vnni_body if kind == "vnni" else avx2_body
    replace_block_body(sch, block_rv, build(c_buf, c_idx, a_buf, a_idx, w_buf, w_idx, ob))


def replace_block_body(sch: Any, block_rv: Any, body: Any) -> None:
    """Swap the body of ``block_rv`` (iter vars, regions and annotations kept) via ``sch.state.replace``."""
    from tvm.s_tir.stmt import SBlock

    block = sch.get(block_rv)
    new_block = SBlock(
        block.iter_vars,
        block.reads,
        block.writes,
        block.name_hint,
        body,
        None,
        block.alloc_buffers,
        block.match_buffers,
        block.annotations,
    )
    sch.state.replace(sch.get_sref(block_rv), new_block, {block: new_block})


def rint_f64_to_i32(v: Any, lanes: int) -> Any:
    """``int32(round_half_even(v))`` for a ``float64x{lanes}`` ``v`` (lanes in :data:`RINT_F64_LANES`).

    8 lanes: AVX-512 ``vcvtpd2dq`` with embedded round-to-nearest-even (all lanes, no passthrough);
    4 lanes: AVX ``vcvtpd2dq`` (MXCSR's rounding, round-to-nearest-even unless a caller changed it, as
    ``nearbyint`` assumes too). Exact for every ``v`` inside int32's range.
    """
    from tvm import tirx

    name = RINT_F64_LANES[lanes]
    if lanes == 8:
        zero = tirx.Broadcast(tirx.const(0, "int32"), 8)
        mask, rounding = tirx.const(-1, "int8"), tirx.const(_ROUND_NEAREST_SAE, "int32")
        return tirx.call_llvm_pure_intrin("int32x8", name, v, zero, mask, rounding)
    return tirx.call_llvm_pure_intrin(f"int32x{lanes}", name, v)
