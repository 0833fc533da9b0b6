"""kiln::WeightOnlyMatMul lowered with the dequantization fused into the matrix product.

One TE reduction over k for every leading index r of A [..., K]; the weight is dequantized inside
the reduction, never materialised::

    Y[r, n] = Σ_k A[r, k] · ((float(Q[k, n]) - float(z[k // bs, n])) · s[k // bs, n])   (+ bias[n])

The library's parameters hold the levels Qᵀ [K, N], the float32 scales [n_blocks, N] (fp16 ones
widened, exactly) and the zero points. 8-bit levels and zero points are int8 tables. 4-bit ones
are packed two per byte along the reduction axis, low nibble first, in two's complement
(:func:`pack_nibbles`)::

    P[j, n] = (Q[2j, n] & 15) | (Q[2j + 1, n] & 15) << 4      P: int8 [ceil(K / 2), N]
    v = int32(P[k // 2, n]);  Q[2j, n] = (v << 28) >> 28 (arithmetic);  16 · Q[2j + 1, n] = v & -16

and the zero points likewise along the blocks, Zp: int8 [ceil(n_blocks / 2), N] (an odd count
padded with a 0 nibble). An odd k's weight is float(16 (Q - z)) · (s / 16): scaling by a power of
two is exact both ways, so it is the same float32 as (Q - z) · s (``v >> 4`` would be one op
less, but LLVM narrows it to an emulated byte shift of five). A symmetric grid needs no
subtraction. Packing along k (not n) keeps a vector of W one contiguous byte load of lanes
consecutive columns with a constant shift, so the n-vectorized schedule below is unchanged.
Each weight is then computed as :func:`compiler.ops.weight_only.dequantize_levels` computes it
(an exact difference of integers, one rounding for the product), so the result differs from the
op's reference only by the order of the float32 sums (the packed library's outputs equal the
int8-table library's bit for bit on BERT and ViT-Tiny int4w). Measured: see the end.

CPU schedule (the kernel's own, ``kiln.scheduled = "weight-only-matmul"``): Kiln's generic matmul
rule wants a product of two plainly indexed operands, and its row-reduction rule, which does take
the fused function, dequantizes every weight once per row of A (ViT-Tiny int4w: 172 ms against
19 ms in fp32). So the register tile of the generic matmul rule is applied here to the fused
block: rows r tiled by ``ti`` and columns n by ``tv`` vectors (:func:`pick_matmul_tile`), loops
``[n_o, r_o] (fused, parallel), k, r_i (unrolled), n_i (vectorized)`` with the accumulators in a
tile buffer of global scope under 1 KiB (a stack array; a ``local`` one, or a bigger one, is a
workspace alloc/free call pair per tile) and the bias added on write-back; a dequantized vector
of W serves all ``ti`` rows (ViT-Tiny int4w then runs within 1.4x of the fp32 library's time on
one thread, measured on a loaded 2-core machine: medians 27-46 ms against 31-39 ms). The kernel
takes A as [rows, K] (a Relax reshape around the call), so a row tile never straddles a leading
dimension (that gives the write-back a variable extent).

Packed levels: with >= :data:`PANEL_MIN_ROWS` rows, W is a stage of its own decoded under each
column tile, ``n_o (parallel): W_panel[K, tv·vec] = decode; r_o: [the tile above on W_panel]``
(one decode per weight for all rows; the panel is a workspace buffer per column tile, and
:data:`PANEL_SPARE_REGISTERS` stay out of the tile's budget). Fewer rows (a GEMV) decode inside
the reduction: k split by 2 and the pair unrolled below each column vector
(``k_o, n_io, k_i, r_i, n_ii``), one byte load serving both nibbles, :data:`DECODE_REGISTERS`
out of the budget. Either way an even K makes each nibble's shift a constant. N no vector width
divides keeps the function unscheduled for the generic schedule (its reduction rule). CUDA: the
function (decode inlined) goes to dlight's rules like the other unscheduled ones (the pipeline
refuses any kernel left without a thread binding).

Measured with ``--quantize int4w`` against the same code storing a byte per 4-bit level:
BERT-mini's library constants 612 KB -> 415 KB (model.so 804 -> 614 KB), ViT-Tiny's 6.98 MB ->
4.47 MB (7.24 -> 4.76 MB); one thread, AVX2, loaded 2-core machine, interleaved medians of
thread CPU time: BERT 1.65 -> 1.30 ms, ViT-Tiny 76 -> 68 ms. Kernels alone: [32, 512] x [512, 128]
143 -> 72 us, ViT fc1 [197, 192] x [192, 768] 0.93 -> 1.08 ms, fc2 0.95 -> 0.75 ms, a
[1, 1024] GEMV 0.14 -> 0.22 ms (its decode is per weight, not amortized over rows).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.tvm.kernels.kernel import Kernel, mark_scheduled, simd_isa
from backends.tvm.lowering.table import LowerContext, lowers
from backends.tvm.schedule_matmul import pick_matmul_tile
from backends.tvm.schedule_nest import PARALLEL_MIN_WORK, vec_width
from compiler.ir.graph import Graph, Node
from compiler.ops.weight_only import block_count

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["weight_only_matmul_te", "schedule_weight_only", "pack_nibbles"]

RULE = "weight-only-matmul"
# Vector registers the nibble decode of a column vector holds (packed bytes, zero point, scale, the
# two weights, a broadcast of A), kept out of the tile's budget: a 16-register AVX2 tile of 2x4
# accumulators spills them (ViT-Tiny fc1 shape: 1.7 ms against 1.35 ms with an 8x1 tile).
DECODE_REGISTERS = 6
PANEL_MIN_ROWS = 4  # from this many rows of A, packed levels are decoded once per column panel
# Registers kept out of a panel kernel's tile: ViT-Tiny's fc1 with a full 6x2 AVX2 tile spills
# around the predicated last row tile (1.72 ms), a 5x2 one does not (1.08 ms; int8 tables 0.93).
PANEL_SPARE_REGISTERS = 2


def _const_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    for port, what in ((1, "levels"), (2, "scales"), (3, "zero points"), (4, "bias")):
        v = ins[port] if port < len(ins) else None
        if v is not None and v.const is None:
            return f"{what} (input {port}) must be a constant for --target"
    return None


def pack_nibbles(t: np.ndarray) -> np.ndarray:
    """Signed 4-bit ``t`` [R, C] -> int8 [ceil(R / 2), C]: P[j] = (t[2j] & 15) | (t[2j + 1] & 15) << 4
    (an odd R padded with a 0 nibble)."""
    v = np.asarray(t).astype(np.int16)
    if v.size and (int(v.min()) < -8 or int(v.max()) > 7):
        raise ValueError(f"4-bit values must lie in [-8, 7], got [{int(v.min())}, {int(v.max())}]")
    if v.shape[0] % 2:
        v = np.concatenate([v, np.zeros((1, *v.shape[1:]), v.dtype)])
    u = (v & 15).astype(np.uint8)
    return np.ascontiguousarray((u[0::2] | (u[1::2] << 4)).view(np.int8))


def _nibble(p: Any, i: Any, col: Any) -> Any:
    """Signed nibble i of column col of a table packed by :func:`pack_nibbles` as an int32, times
    16 when i is odd: (v << 28) >> 28 or v & -16 for v = int32(P[i // 2, col]) (a high nibble
    scaled, not shifted down: LLVM narrows ``v >> 4`` to an emulated byte shift of five ops)."""
    from tvm import tirx

    v = p[i // 2, col].astype("int32")
    return tirx.Select(i % 2 == 0, (v << 28) >> 28, v & -16)  # a constant choice once k is unrolled


def weight_only_matmul_te(
    x: Any,
    q: Any,
    s: Any,
    z: Any | None,
    bias: Any | None,
    block_size: int,
    packed: bool = False,
    panel: bool = False,
) -> Any:
    """The fused TE compute: x [..., K] float32, s [n_blocks, N] float32, bias [N] float32 or None;
    q [K, N] int8 and z [n_blocks, N] int8 or None, or with ``packed`` the int8 nibble tables
    q [ceil(K / 2), N] and z [ceil(n_blocks / 2), N] or None (module docstring); Y [..., N]."""
    from tvm import te, tirx

    k_dim = int(x.shape[-1])
    lead = [int(d) for d in x.shape[:-1]]
    n = int(q.shape[1])
    k = te.reduce_axis((0, k_dim), "k")

    def weight(kk: Any, col: Any) -> Any:
        if packed:
            level = _nibble(q, kk, col)  # 16 Q for odd k
            if z is not None:
                zero = _nibble(z, kk // block_size, col)
                zero = tirx.Select(kk // block_size % 2 == 0, zero, zero >> 4)  # exact: 16 z >> 4
                level = level - tirx.Select(kk % 2 == 0, zero, zero << 4)
            step = tirx.Select(kk % 2 == 0, tirx.const(1.0, "float32"), tirx.const(0.0625, "float32"))
            return level.astype("float32") * (s[kk // block_size, col] * step)
        level = q[kk, col].astype("float32")
        if z is not None:
            level = level - z[kk // block_size, col].astype("float32")
        return level * s[kk // block_size, col]

    if panel:  # W as its own stage, for the schedule to decode one column panel for all rows
        w = te.compute((k_dim, n), weight, name="weight_only_dequantize")
        weight = lambda kk, col: w[kk, col]  # noqa: E731
    y = te.compute(
        (*lead, n),
        lambda *idx: te.sum(x[(*idx[:-1], k)] * weight(k, idx[-1]), axis=k),
        name="weight_only_matmul",
    )
    if bias is None:
        return y
    return te.compute((*lead, n), lambda *idx: y[idx] + bias[idx[-1]], name="weight_only_bias")


def schedule_weight_only(
    func: Any, rows: int, n: int, target: TargetSpec, k_pairs: bool = False, panel: bool = False
) -> Any | None:
    """The register-tiled CPU schedule of the module docstring; None when no vector width divides N.
    ``k_pairs``: split k by 2 and unroll the pair (packed levels, even K); ``panel``: the function
    has the ``weight_only_dequantize`` stage, decoded under each column tile."""
    from tvm import s_tir

    lanes = target.lanes
    vec = vec_width(n, lanes)
    if vec is None:
        return None
    sch = s_tir.Schedule(func)
    w_block = sch.get_sblock("weight_only_dequantize") if panel else None
    inline_decode = k_pairs and not panel
    spare = DECODE_REGISTERS if inline_decode else PANEL_SPARE_REGISTERS if panel else 0
    registers = (32 if lanes >= 16 or target.is_arm else 16) - spare
    tile = pick_matmul_tile(rows, n // vec, registers, vec)  # ti * tv * vec fits the stack
    block = sch.get_sblock("weight_only_matmul")
    *lead, col, k = sch.get_loops(block)
    row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
    r_o, r_i = sch.split(row, [None, tile.ti])
    n_o, n_i = sch.split(col, [None, tile.tv * vec])
    k_i = None
    if inline_decode:
        k, k_i = sch.split(k, [None, 2])
        sch.reorder(n_o, r_o, k, k_i, r_i, n_i)
    else:
        sch.reorder(n_o, r_o, k, r_i, n_i)
    local = sch.cache_write(block, 0, "global")  # not "local": see the module docstring
    for consumer in sch.get_consumers(local):  # the bias, added on write-back
        sch.reverse_compute_inline(consumer)
    sch.reverse_compute_at(local, r_o)
    if w_block is not None:
        sch.compute_at(w_block, n_o)  # W[:, column tile], decoded once for all row tiles
        wk, wn = sch.get_loops(w_block)[-2:]
        if k_pairs:
            wk, wk2 = sch.split(wk, [None, 2])
            sch.reorder(wk, wk2, wn)
            sch.unroll(wk2)
        _, wv = sch.split(wn, [None, vec])
        sch.vectorize(wv)
        outer = n_o
    else:
        outer = sch.fuse(n_o, r_o)
    if rows * n * 4 > PARALLEL_MIN_WORK and target.num_cores > 1:
        sch.parallel(outer)
    n_io, n_ii = sch.split(n_i, [None, vec])
    sch.vectorize(n_ii)
    if tile.ti > 1:
        sch.unroll(r_i)
    if tile.tv > 1:
        sch.unroll(n_io)
    if k_i is not None:  # per vector of columns: decode both nibbles, serve the ti rows with each
        sch.reorder(n_io, k_i, r_i, n_ii)
        sch.unroll(k_i)
    tail = list(sch.get_loops(local))[2 if panel else 1 :]  # the write-back below r_o
    if tail:
        *rest, last = tail
        if len(rest) > 1:
            rest = [sch.fuse(*rest)]
        _, wv = sch.split(last, [None, vec])
        sch.vectorize(wv)
        for lp in rest:
            sch.unroll(lp)
    sch.decompose_reduction(block, k)
    return sch.mod["main"]


def _kernel(
    ctx: LowerContext, x_shape: tuple[int, ...], n: int, block_size: int, zero: bool, bias: bool, packed: bool
) -> Kernel | None:
    """The scheduled CPU kernel (args x, levels, s[, z][, bias], out), or None (see the docstring)."""
    from tvm import te

    k = x_shape[-1]
    nb = block_count(k, block_size)
    x = te.placeholder(x_shape, "float32", "x")
    if packed:
        q = te.placeholder(((k + 1) // 2, n), "int8", "levels")
        z = te.placeholder(((nb + 1) // 2, n), "int8", "zero_points") if zero else None
    else:
        q = te.placeholder((k, n), "int8", "levels")
        z = te.placeholder((nb, n), "int8", "zero_points") if zero else None
    s = te.placeholder((nb, n), "float32", "scales")
    b = te.placeholder((n,), "float32", "bias") if bias else None
    rows = int(np.prod(x_shape[:-1]))
    panel = packed and rows >= PANEL_MIN_ROWS
    y = weight_only_matmul_te(x, q, s, z, b, block_size, packed, panel)
    args = [t for t in (x, q, s, z, b) if t is not None]
    func = te.create_prim_func([*args, y])
    func = schedule_weight_only(func, rows, n, ctx.target, packed and k % 2 == 0, panel)
    if func is None:
        return None
    key = f"{x_shape}|{n}|{block_size}|{zero}|{bias}|{packed}|{ctx.target.lanes}|{ctx.target.num_cores}"
    name = f"kiln_weight_only_matmul_{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    func = mark_scheduled(func.with_attr("global_symbol", name), RULE, "matmul", simd_isa(ctx.target))
    return Kernel(name=name, func=func, out_shape=(*x_shape[:-1], n), out_dtype="float32")


@lowers("kiln::WeightOnlyMatMul", check=_const_reason)
def _weight_only_matmul(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    bs = int(node.attrs.block_size)
    packed = int(node.attrs.bits) == 4
    q = ctx.require_const(node, 1, "levels").astype(np.int8)
    s = ctx.require_const(node, 2, "scales").astype(np.float32)
    z, bias = ctx.input_const(node, 3), ctx.input_const(node, 4)
    n = int(q.shape[0])
    table = pack_nibbles if packed else np.ascontiguousarray
    args = [
        ins[0],
        ctx.const(table(q.T)),
        ctx.const(np.ascontiguousarray(s.T)),
        None if z is None else ctx.const(table(z.T.astype(np.int8))),
        None if bias is None else ctx.const(np.ascontiguousarray(bias, np.float32)),
    ]
    x_shape = tuple(int(d) for d in ctx.in_type(node, 0).static_shape)
    rows, k = int(np.prod(x_shape[:-1])), x_shape[-1]
    kernel = None
    if ctx.target.is_cpu:  # on [rows, K]: a row tile never straddles a leading dimension
        kernel = _kernel(ctx, (rows, k), n, bs, z is not None, bias is not None, packed)
    if kernel is not None:
        from tvm.relax import op

        flat = len(x_shape) == 2
        args[0] = ins[0] if flat else ctx.emit(op.reshape(ins[0], (rows, k)))
        y = ctx.call_kernel(kernel, [a for a in args if a is not None])
        return [y if flat else ctx.emit(op.reshape(y, (*x_shape[:-1], n)))]
    y = ctx.bb.emit_te(weight_only_matmul_te, *args, bs, packed, primfunc_name_hint="kiln_weight_only_matmul")
    return [y]
