"""Generic CPU schedule rules for reductions: matmul-like blocks and contiguous row reductions.

**matmul** (``[batch.., i, j] += A[.., i, k] * B[.., k, j]``, plain indices, one reduction axis
innermost): a register tile of ``ti`` rows x ``tv`` vectors of ``j`` (:func:`pick_matmul_tile`),
loops ``[batch, j_o, i_o] (fused, parallel when large), k, i_i (unrolled), j_i (vectors unrolled,
lanes vectorized)`` with the accumulators in a per-tile buffer of global scope: TVM serves a
``local`` buffer from the workspace pool (an alloc/free call pair per tile) but puts a global one
under 1 KiB on the stack, where LLVM keeps it in registers. ``j_o`` outside ``i_o`` keeps one
``K x tv*lanes`` panel of B hot for every row tile. The epilogue the function computes on the
product (bias, activation, residual: the injective consumers FuseOps put in the same function) is
reverse-inlined into the tile's write-back (when it has the same iteration domain), so the
product never goes to memory. A ``j`` extent no vector width divides is padded (``pad_einsum``)
to one that is, and so is an ``i`` extent the row tile does not divide: a predicated row tile
costs a branch per row in the ``k`` loop (197x192x768 on Zen 4: 140 GFLOP/s predicated, 212
padded, onnxruntime 213); the epilogue then runs in the unpad copy.

**row reduction** (the innermost loop is a reduction over a contiguous axis, e.g. LayerNorm's
mean over the hidden axis): the axis is split by the vector width and rfactored, so the partial
sums accumulate in one vector (in registers) and are added up once per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.tvm.schedule_nest import (
    PARALLEL_MIN_WORK,
    TVM_ERRORS,
    Nest,
    as_int,
    contiguous_in,
    fits_stack,
    is_plain_indexed,
    vec_width,
)

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["schedule_matmul", "schedule_row_reduction", "pick_matmul_tile", "MatmulTile"]

_MAX_ROWS = 12
_MAX_VECTORS = 4
_GEMV_ROWS = 4  # fewer rows than this: the row tile cannot hide the FMA latency ...
_GEMV_VECTORS = 8  # ... so the tile may take up to this many vectors of j instead


def _registers(target: TargetSpec) -> int:
    """Vector registers: 32 on AVX-512 and aarch64, 16 on AVX2."""
    return 32 if target.lanes >= 16 or target.is_arm else 16


@dataclass(frozen=True)
class MatmulTile:
    """``ti`` rows x ``tv`` vectors of ``lanes`` columns."""

    ti: int
    tv: int


def pick_matmul_tile(rows: int, vectors: int, registers: int, vec: int | None = None) -> MatmulTile:
    """The tile maximizing modelled FMAs per cycle (two FMA pipes, latency 4, two loads a cycle).

    Per ``k`` a tile issues ``ti*tv`` FMAs, ``tv`` loads of B and ``ti`` broadcasts of A; cycles
    ``max(acc/2, loads/2, 4) + 1``; rows padded up to a multiple of a non-divisible ``ti`` are
    wasted, and the padding copies cost about 10% (x0.9). The accumulators, the B vectors and one
    broadcast must fit in ``registers``. ``tv`` is at most 4, or 8 below 4 rows (a GEMV-like
    product: one row of 4 vectors leaves 3 of every 4 FMA slots idle). Given the vector width
    ``vec``, the ``ti*tv*vec`` accumulators must also fit TVM's stack limit
    (:func:`~backends.tvm.schedule_nest.fits_stack`; a bigger tile buffer is a workspace call pair
    per tile, measured slower than the next smaller tile); a 1-element tile always qualifies.
    """
    best: tuple[float, MatmulTile] | None = None
    max_vectors = _GEMV_VECTORS if rows < _GEMV_ROWS else _MAX_VECTORS
    for tv in range(1, max_vectors + 1):
        if vectors % tv:
            continue
        for ti in range(1, min(rows, _MAX_ROWS) + 1):
            acc = ti * tv
            if acc + tv + 1 > registers or (vec is not None and acc > 1 and not fits_stack(acc * vec)):
                continue
            tiles = -(-rows // ti)
            useful = rows / (tiles * ti)
            score = acc * useful / (max(acc / 2.0, (ti + tv) / 2.0, 4.0) + 1.0)
            if rows % ti:
                score *= 0.9
            key = score + tv * 1e-3 - ti * 1e-4  # ties: wider vectors, then fewer rows
            if best is None or key > best[0] + 1e-9:
                best = (key, MatmulTile(ti, tv))
    assert best is not None
    return best[1]


def _matmul_nest(sch: Any, name: str) -> Nest:
    nest = Nest(sch, sch.get_sblock(name))
    if not (nest.simple and nest.kinds.count("R") == 1 and nest.kinds[-1] == "R" and len(nest.loops) >= 3):
        raise ValueError("not matmul-like")
    if not is_plain_indexed(nest.block) or len(nest.block.reads) != 2:
        raise ValueError("not matmul-like")
    if not contiguous_in(nest.block, nest.iter_vars[-2]):
        raise ValueError("j axis not contiguous")
    return nest


def _pad(sch: Any, name: str, nest: Nest, rows: int | None, cols: int | None) -> Nest:
    """Pad the matmul block's ``i`` extent to ``rows`` and ``j`` to ``cols`` (None: unchanged) with
    ``pad_einsum`` (zero-padded operand copies and an unpad copy of the product), then fuse the
    function's epilogue into that unpad copy; the matmul nest after padding."""
    padding = [int(e or 1) for e in nest.extents]  # the block's iter vars, in loop order
    if rows is not None:
        padding[-3] = rows
    if cols is not None:
        padding[-2] = cols
    sch.pad_einsum(sch.get_sblock(name), padding)
    unpad = sch.get_consumers(sch.get_sblock(name))
    if len(unpad) == 1:
        _fuse_epilogue(sch, unpad[0])
    return _matmul_nest(sch, name)


def _domain(block: Any) -> list[int | None]:
    return [as_int(iv.dom.extent) for iv in block.iter_vars]


def _fuse_epilogue(sch: Any, write_back: Any) -> None:
    """Reverse-inline the injective consumer chain of ``write_back`` into it, while each consumer is
    spatial and reads no other block of the function (parameters only)."""
    while True:
        consumers = sch.get_consumers(write_back)
        if len(consumers) != 1:
            return
        cons = consumers[0]
        if any(int(iv.iter_type) != 0 for iv in sch.get(cons).iter_vars) or len(sch.get_producers(cons)) != 1:
            return
        if _domain(sch.get(cons)) != _domain(sch.get(write_back)):
            return  # e.g. pad_einsum's unpad: TVM 0.27 would inline it and write out of bounds
        trial = sch.copy()
        try:
            trial.reverse_compute_inline(trial.get_sblock(sch.get(cons).name_hint))
        except TVM_ERRORS:
            return
        sch.reverse_compute_inline(cons)


def schedule_matmul(sch: Any, name: str, target: TargetSpec) -> None:
    """The matmul rule (see the module docstring); raises when ``name`` is not matmul-like."""
    lanes = target.lanes
    nest = _matmul_nest(sch, name)
    j_ext, i_ext = nest.extents[-2] or 1, nest.extents[-3] or 1
    cols = None
    vec = vec_width(j_ext, lanes)
    if vec is None:  # pad j to whole vectors
        vec = lanes if j_ext >= lanes else max(4, lanes // 2)
        cols = -(-j_ext // vec) * vec
    tile = pick_matmul_tile(i_ext, (cols or j_ext) // vec, _registers(target), vec)
    rows = -(-i_ext // tile.ti) * tile.ti if i_ext % tile.ti else None
    if rows is not None or cols is not None:
        nest = _pad(sch, name, nest, rows, cols)
    block = sch.get_sblock(name)
    *batch, i, j, k = nest.loops
    i_o, i_i = sch.split(i, [None, tile.ti])
    j_o, j_i = sch.split(j, [None, tile.tv * vec])
    sch.reorder(*batch, j_o, i_o, k, i_i, j_i)
    local = sch.cache_write(block, 0, "global")  # not "local": see the module docstring
    _fuse_epilogue(sch, local)
    sch.reverse_compute_at(local, i_o)
    outer = sch.fuse(*batch, j_o, i_o)
    if nest.work > PARALLEL_MIN_WORK and target.num_cores > 1:
        sch.parallel(outer)
    j_io, j_ii = sch.split(j_i, [None, vec])
    sch.vectorize(j_ii)
    if tile.ti > 1:
        sch.unroll(i_i)
    if tile.tv > 1:
        sch.unroll(j_io)
    tail = list(sch.get_loops(local))[1:]  # below the fused outer loop: [.., rows, cols]
    if tail:
        _, wv = sch.split(tail[-1], [None, vec])
        sch.vectorize(wv)
        for lp in tail[:-1]:
            sch.unroll(lp)
    sch.decompose_reduction(block, k)
    _schedule_pads(sch, lanes)


def _schedule_pads(sch: Any, lanes: int) -> None:
    """Vectorize (when possible) the copies ``pad_einsum`` added around the matmul."""
    root = sch.get_sblock("root")
    for b in sch.get_child_blocks(root):
        blk = sch.get(b)
        if not blk.name_hint.endswith(("_pad", "_unpad")) or any(int(iv.iter_type) for iv in blk.iter_vars):
            continue
        loops = sch.get_loops(b)
        if not loops:
            continue
        ext = as_int(sch.get(loops[-1]).extent)
        w = vec_width(ext, lanes)
        if w is not None and contiguous_in(blk, Nest(sch, b).iter_vars[-1]):
            _, v = sch.split(loops[-1], [None, w])
            sch.vectorize(v)


def schedule_row_reduction(sch: Any, name: str, target: TargetSpec) -> None:
    """The row-reduction rule (see the module docstring); raises when it does not apply."""
    lanes = target.lanes
    block = sch.get_sblock(name)
    nest = Nest(sch, block)
    if not nest.simple or nest.kinds[-1] != "R" or "S" not in nest.kinds:
        raise ValueError("innermost loop is not a reduction")
    if nest.kinds != sorted(nest.kinds, key=lambda kd: kd == "R"):
        raise ValueError("reduction loops are not innermost")
    if not contiguous_in(nest.block, nest.iter_vars[-1], writes=False):
        raise ValueError("reduction axis is not contiguous")
    width = vec_width(nest.extents[-1], lanes)
    if width is None:
        raise ValueError("reduction extent is not a multiple of the vector width")
    spatial = [lp for lp, kd in zip(nest.loops, nest.kinds, strict=True) if kd == "S"]
    _, ri = sch.split(nest.loops[-1], [None, width])
    rf = sch.rfactor(ri, len(spatial))
    outer = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    if nest.work > PARALLEL_MIN_WORK and target.num_cores > 1:
        sch.parallel(outer)
    sch.compute_at(rf, outer)
    # the partial-sum vector stays in the default (global) scope: a stack array, no workspace call
    rf_nest = Nest(sch, rf)  # below ``outer``: ri (spatial in rf) and the reduction loops, any order
    below = list(zip(rf_nest.loops, rf_nest.kinds, rf_nest.extents, strict=True))[1:]
    ri_rf = [lp for lp, kd, e in below if kd == "S" and e == width]
    red = [lp for lp, kd, _ in below if kd == "R"]
    if len(ri_rf) != 1 or not red:
        raise ValueError("unexpected rfactor loop nest")
    sch.reorder(*red, ri_rf[0])
    sch.vectorize(ri_rf[0])
    init = sch.decompose_reduction(rf, red[0])
    sch.vectorize(sch.get_loops(init)[-1])
