"""Kiln's int8 dense kernel (kiln::QGemm, constant weight) for x86 and aarch64: u8/s8 x s8 -> int32 ->
fused requantize (or float-out) epilogue, on a weight packed at compile time.

``acc[m, c, j] = sum_{g, p} xs[m, 4g + p] * Wp[c, g, j, p]`` (int32; ``xs = x + s`` and the packing of
:mod:`backends.tvm.kernels.qdense_spec`), ``y[m, n] = epilogue(acc[m, n // B, n % B] + fbias[n])``.
The dot paths reuse the int8 conv's intrinsic bodies:

* ``vnni``: ``vpdpbusd`` over each (4-row group of K, block of B columns), manual tensorize
  (:func:`backends.tvm.kernels.x86_int8_dot.vnni_body`);
* ``avx2``: u8 widened to int16 in the loop (the weight is packed as int16), ``pmaddwd`` into two
  int32 partial sums per column (``acc[m, c, j, h]``, added in the epilogue)
  (:func:`~backends.tvm.kernels.x86_int8_dot.avx2_body`);
* ``sdot`` (aarch64 ``dotprod``): SDOT on ``x - 128`` (int8), the ``128 * sum(W)`` term folded into
  ``fbias`` at compile time (:func:`backends.tvm.kernels.arm_int8_dot.sdot_body`);
* ``neon``: the ``avx2`` accumulator layout with widening NEON multiplies and ``sadalp``;
* ``plain``: int32 math vectorized over the column block.

Schedule: a register tile of ``row_tile`` rows x ``tn`` column blocks (accumulators in a small
stack buffer under TVM's 1 KiB stack limit, unrolled; a "local"-scope or bigger buffer would come
from TVM's workspace pool, one allocation per tile), the K groups outside it, the (column tile, row
tile) loop parallel when the work is large, and the epilogue computed inside that loop, vectorized
over the column block.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from backends.tvm.kernels.kernel import INT8_DOT_ISA, Kernel, mark_scheduled
from backends.tvm.kernels.qdense_spec import QUANT_RANGES, QDenseSpec
from backends.tvm.schedule_nest import fits_stack

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["qdense_kind", "qdense_spec", "qdense_kernel", "column_tile"]

_PAIRS = {"avx2": 2, "neon": 2}  # int32 partial sums per output column
_VEC_BYTES = {"vnni": 64, "avx2": 32, "sdot": 16, "neon": 16}
_BUDGET = {"vnni": 24, "avx2": 12, "sdot": 24, "neon": 16}  # accumulator registers of the tile
_BLOCK = {"vnni": 16, "avx2": 8, "sdot": 16, "neon": 8}
_MAX_ROWS = 8
_PARALLEL_MIN_OPS = 1 << 21  # below ~10 us of work the parallel launch costs more than it saves


def qdense_kind(target: TargetSpec) -> str:
    """The dot path of ``target``: "vnni", "avx2", "sdot", "neon" or "plain"."""
    if target.is_arm:
        return "sdot" if target.int8_dot == "dotprod" else "neon"
    if target.is_cpu and target.int8_dot in ("vnni", "avx2"):
        return target.int8_dot
    return "plain"


def _regs_per_block(kind: str, block: int) -> int:
    return max(1, block * 4 * _PAIRS.get(kind, 1) // _VEC_BYTES.get(kind, 32))


def column_tile(kind: str, block: int, chunks: int) -> int:
    """``tn``: column blocks per register tile (dividing ``chunks``; room left for >= 2 rows)."""
    regs, budget = _regs_per_block(kind, block), _BUDGET.get(kind, 8)
    return next(t for t in (4, 3, 2, 1) if chunks % t == 0 and (2 * t * regs <= budget or t == 1))


def _row_tile(kind: str, block: int, tn: int, m: int) -> int:
    """Rows per tile: as many as the accumulator budget and the stack allow, preferring a divisor of
    ``m`` (else the rows are padded up to a multiple of the tile).

    The tile's int32 accumulators must pass :func:`~backends.tvm.schedule_nest.fits_stack`: a bigger
    tile buffer is a workspace alloc/free per tile that LLVM cannot keep in registers (VNNI, 4 blocks:
    5 rows 5-15% slower than 3). When the stack is the bound (VNNI) the tile ``t`` maximizes
    ``m / (ceil(m/t) t) * t / (t + 1)`` (padded rows wasted; one weight load per ``t`` rows), so 3
    padded rows beat 2 dividing ones (128x768x768: 435 vs 490 us); otherwise the largest divisor above
    half of the budget's rows is taken.
    """
    per_row = tn * block * _PAIRS.get(kind, 1)
    stack_rows = next((t for t in range(_MAX_ROWS, 0, -1) if fits_stack(t * per_row)), 1)
    regs = _BUDGET.get(kind, 8) // (tn * _regs_per_block(kind, block))
    most = max(1, min(_MAX_ROWS, regs, stack_rows, m))
    if stack_rows < min(_MAX_ROWS, regs):
        return max(range(1, most + 1), key=lambda t: (m / (-(-m // t) * t) * t / (t + 1), t))
    return next((t for t in range(most, most // 2, -1) if m % t == 0), most)


def qdense_spec(
    m: int, k: int, n: int, target: TargetSpec, in_dtype: str, x_zero: int, out_dtype: str, y_zero: int
) -> QDenseSpec:
    """The spec (dot path, block and row tile) for ``[m, k] x [k, n]`` on ``target``."""
    kind = qdense_kind(target)
    block = _BLOCK.get(kind, target.lanes)
    spec = QDenseSpec(m, k, n, kind, block, 1, in_dtype, x_zero, out_dtype, y_zero)
    tn = column_tile(kind, block, spec.chunks)
    return replace(spec, row_tile=_row_tile(kind, block, tn, m))


def _compute(spec: QDenseSpec) -> list[Any]:
    """TE tensors in PrimFunc order: data, weight, bias, multiplier, output."""
    from tvm import te, tirx

    bsz, pairs = spec.block, _PAIRS.get(spec.kind, 1)
    data = te.placeholder((spec.m, spec.k), spec.in_dtype, name="data")
    weight = te.placeholder(spec.weight_shape, spec.weight_dtype, name="weight")
    bias = te.placeholder(spec.column_shape, "int32", name="bias")
    mult = te.placeholder(spec.column_shape, spec.mult_dtype, name="multiplier")
    src = data
    if spec.needs_pad:
        zero = tirx.const(0, spec.dot_dtype)

        def pad_body(m: Any, k: Any) -> Any:
            v = tirx.Cast(spec.dot_dtype, data[m, k].astype("int32") + spec.shift)
            return tirx.if_then_else(tirx.all(m < spec.m, k < spec.k), v, zero)

        src = te.compute((spec.rows, spec.k_groups * 4), pad_body, name="pad")
    rg = te.reduce_axis((0, spec.k_groups), name="g")
    rp = te.reduce_axis((0, 4 // pairs), name="p")
    if pairs == 2:  # acc[m, c, j, h]: column j's partial sum over p = 2h, 2h + 1 of each group of 4

        def acc_body(m: Any, c: Any, j: Any, h: Any) -> Any:
            p = h * 2 + rp
            return te.sum(
                src[m, rg * 4 + p].astype("int32") * weight[c, rg, j, p].astype("int32"), axis=[rg, rp]
            )

        acc = te.compute((spec.rows, spec.chunks, bsz, 2), acc_body, name="acc")
    else:

        def acc_body1(m: Any, c: Any, j: Any) -> Any:
            return te.sum(
                src[m, rg * 4 + rp].astype("int32") * weight[c, rg, j, rp].astype("int32"), axis=[rg, rp]
            )

        acc = te.compute((spec.rows, spec.chunks, bsz), acc_body1, name="acc")

    def epi_body(m: Any, n: Any) -> Any:
        c, j = n // bsz, n % bsz
        a = acc[m, c, j, 0] + acc[m, c, j, 1] if pairs == 2 else acc[m, c, j]
        a = a + bias[n]
        if spec.out_dtype == "float32":
            return tirx.Cast("float32", a) * mult[n]
        qmin, qmax = QUANT_RANGES[spec.out_dtype]
        q = tirx.nearbyint(tirx.Cast("float64", a) * mult[n]) + tirx.const(float(spec.y_zero), "float64")
        q = te.max(te.min(q, tirx.const(float(qmax), "float64")), tirx.const(float(qmin), "float64"))
        return tirx.Cast(spec.out_dtype, q)

    out = te.compute(spec.out_shape, epi_body, name="epilogue")
    return [data, weight, bias, mult, out]


def _schedule_pad(sch: Any, spec: QDenseSpec) -> None:
    m, k = sch.get_loops(sch.get_sblock("pad"))
    width = next(w for w in (64, 32, 16, 8, 4) if (spec.k_groups * 4) % w == 0)
    _, ki = sch.split(k, [None, width])
    sch.vectorize(ki)


def _schedule(sch: Any, spec: QDenseSpec, target: TargetSpec) -> None:
    from backends.tvm.kernels.arm_int8_dot import tensorize_neon, tensorize_sdot
    from backends.tvm.kernels.x86_int8_dot import manual_tensorize

    kind, tm = spec.kind, spec.row_tile
    tn = column_tile(kind, spec.block, spec.chunks)
    acc = sch.get_sblock("acc")
    epi = sch.get_sblock("epilogue")
    # the epilogue's loops lead and the product is computed at its tile (compute_at solves the acc
    # region from the epilogue's n // B, n % B reads; reverse_compute_at cannot)
    em, en = sch.get_loops(epi)
    emo, emi = sch.split(em, [None, tm])
    eno, eni = sch.split(en, [None, tn * spec.block])
    sch.reorder(eno, emo, emi, eni)
    outer = sch.fuse(eno, emo)
    tiles = (spec.rows // tm) * (spec.chunks // tn)
    if target.num_cores > 1 and tiles > 1 and 2 * spec.m * spec.n * spec.k >= _PARALLEL_MIN_OPS:
        sch.parallel(outer)
    sch.compute_at(acc, outer, preserve_unit_loops=True)
    # no "local" scope: TVM serves a local buffer from the workspace pool (a call per tile) but keeps a
    # small global one on the stack
    loops = sch.get_loops(acc)
    pairs = kind in _PAIRS
    mi, ci, j = loops[1:4]
    h = loops[4] if pairs else None
    g, p = loops[-2:]
    if pairs:
        sch.reorder(g, mi, ci, j, h, p)
    elif kind == "plain":
        sch.reorder(g, mi, ci, p, j)
    else:
        sch.reorder(g, mi, ci, j, p)
    sch.unroll(mi)
    sch.unroll(ci)
    if kind == "plain":
        sch.unroll(p)
        sch.vectorize(j)
    init = sch.decompose_reduction(acc, g)
    sch.vectorize(sch.get_loops(init)[-1])
    if spec.n % (tn * spec.block) == 0:
        sch.vectorize(sch.split(eni, [None, spec.block])[1])
    data = "pad" if spec.needs_pad else "data"
    if kind in ("vnni", "avx2"):
        manual_tensorize(sch, sch.blockize(j), data, "weight", kind, spec.block)
    elif kind == "sdot":
        tensorize_sdot(sch, sch.blockize(j), data, "weight", spec.block)
    elif kind == "neon":
        tensorize_neon(sch, sch.blockize(j), data, "weight", spec.block)


def qdense_kernel(spec: QDenseSpec, target: TargetSpec) -> Kernel:
    """The scheduled int8 dense kernel (args ``data [M, K], Wp, fbias, multiplier``, out ``[M, N]``)."""
    from tvm import s_tir, te

    spec.validate()
    sch = s_tir.Schedule(te.create_prim_func(_compute(spec)))
    if spec.needs_pad:
        _schedule_pad(sch, spec)
    _schedule(sch, spec, target)
    name = f"kiln_qdense_{spec.kind}_{spec.key()}"
    func = sch.mod["main"].with_attr("global_symbol", name)
    isa = INT8_DOT_ISA.get(spec.kind, "generic")
    return Kernel(
        name, mark_scheduled(func, f"qdense_{spec.kind}", "dense", isa), spec.out_shape, spec.out_dtype
    )
