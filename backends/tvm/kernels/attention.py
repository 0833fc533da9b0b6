"""Fused scaled-dot-product attention fp32 kernel: ``Y = softmax(scale · Q Kᵀ + M) V`` per head.

Shapes: ``q [B, H, S, D]``, ``kt [B, H, D, Tp]`` (K transposed, the T keys zero-padded to whole
vectors, Tp), ``v [B, H, T, Dv]``, ``mask [mb, mh, ms, Tp]`` (each of mb, mh, ms is 1 or the
full extent; -inf on the padded keys), output ``[B, H, S, Dv]``. Per query row i of head (b, h):

    s_j = scale · Σ_d q_id kt_dj + M_ij,  m = max_j s_j,  e_j = exp(s_j - m),  l = Σ_j e_j,
    y_i = (Σ_j e_j v_j) / l   (0 when l = 0: a row without a finite score)

Schedule: one task per ``rows`` query rows of one head (B·H·S/rows tasks, parallel). In a task,
the scores ``[rows, Tp]`` are computed in register tiles of (rows x one vector of keys)
accumulated over D; max and sum are row reductions in vector partials; ``Σ_j e_j v_j`` is a
register tile of (rows x Dv) accumulators, vectorized over Dv, that reads each V row once for all
rows; the division by ``l`` is its write-back. Both register tiles are global-scope buffers under
1 KiB (stack arrays LLVM keeps in registers, :func:`pick_attention_rows`); the score and
probability rows (``rows · Tp`` floats each) are the task's own buffers, so they stay in L1 and
never reach memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.tvm.kernels.fast_math import fast_exp
from backends.tvm.kernels.kernel import Kernel, mark_scheduled, simd_isa, spec_key
from backends.tvm.schedule_nest import fits_stack, vec_width

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["AttentionSpec", "attention_kernel", "attention_compute", "pick_attention_rows"]

_MAX_ACCUMULATORS = 16  # vector registers the (rows x Dv) tile may hold


@dataclass(frozen=True)
class AttentionSpec:
    """One attention call: ``[B, H, S, D]`` queries over ``keys`` keys padded to ``padded_keys``."""

    batch: int
    heads: int
    queries: int
    depth: int
    keys: int
    padded_keys: int
    value_depth: int
    mask_shape: tuple[int, int, int]  # (mb, mh, ms): 1 or the full extent
    scale: float
    rows: int = 1

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """``[B, H, S, Dv]``."""
        return (self.batch, self.heads, self.queries, self.value_depth)

    def key(self) -> str:
        """A short deterministic hash of all spec fields."""
        return spec_key(self)


def pick_attention_rows(queries: int, value_depth: int, lanes: int) -> int:
    """Query rows per task: the most of 4, 3, 2 whose ``rows x Dv`` accumulators fit the
    registers and the stack (1 without a vector width dividing Dv); ``queries`` is padded to it."""
    vec = vec_width(value_depth, lanes)
    if vec is None:
        return 1
    for rows in (4, 3, 2):
        fits = rows * (value_depth // vec) <= _MAX_ACCUMULATORS and fits_stack(rows * value_depth)
        if fits and queries >= rows:
            return rows
    return 1


def attention_compute(spec: AttentionSpec) -> Any:
    """The unscheduled PrimFunc ``(q, kt, v, mask, out)``."""
    from tvm import te, tirx

    b_, h_, s_, d_, t_, dv = (
        spec.batch,
        spec.heads,
        spec.queries,
        spec.depth,
        spec.padded_keys,
        spec.value_depth,
    )
    mb, mh, ms = spec.mask_shape
    q = te.placeholder((b_, h_, s_, d_), "float32", name="q")
    kt = te.placeholder((b_, h_, d_, t_), "float32", name="kt")
    v = te.placeholder((b_, h_, spec.keys, dv), "float32", name="v")
    mask = te.placeholder((mb, mh, ms, t_), "float32", name="mask")
    zero = tirx.const(0, "int32")

    def m_at(b: Any, h: Any, i: Any, j: Any) -> Any:
        return mask[b if mb > 1 else zero, h if mh > 1 else zero, i if ms > 1 else zero, j]

    rd = te.reduce_axis((0, d_), name="rd")
    score = te.compute(
        (b_, h_, s_, t_), lambda b, h, i, j: te.sum(q[b, h, i, rd] * kt[b, h, rd, j], axis=rd), name="score"
    )
    scale = tirx.const(spec.scale, "float32")

    def biased(b: Any, h: Any, i: Any, j: Any) -> Any:
        return score[b, h, i, j] * scale + m_at(b, h, i, j)

    lanes = next(w for w in (16, 8, 4, 1) if t_ % w == 0)  # partials of the row max and sum

    def row_reduce(val: Any, combine: Any, name: str) -> Any:
        """``combine`` over the keys of ``val(b, h, i, j)``: ``lanes`` partials, then the lanes."""
        q_ = te.reduce_axis((0, t_ // lanes), name=f"{name}_q")
        rf = te.compute(
            (b_, h_, s_, lanes),
            lambda b, h, i, l: combine(val(b, h, i, q_ * lanes + l), axis=q_),
            name=f"{name}_rf",
        )
        l_ = te.reduce_axis((0, lanes), name=f"{name}_l")
        return te.compute((b_, h_, s_), lambda b, h, i: combine(rf[b, h, i, l_], axis=l_), name=name)

    row_max = row_reduce(biased, te.max, "row_max")
    prob = te.compute(
        (b_, h_, s_, t_), lambda b, h, i, j: fast_exp(biased(b, h, i, j) - row_max[b, h, i]), name="prob"
    )
    row_sum = row_reduce(lambda b, h, i, j: prob[b, h, i, j], te.sum, "row_sum")
    rj = te.reduce_axis((0, spec.keys), name="rj")
    acc = te.compute(
        (b_, h_, s_, dv), lambda b, h, i, d: te.sum(prob[b, h, i, rj] * v[b, h, rj, d], axis=rj), name="acc"
    )
    zero_f = tirx.const(0.0, "float32")
    # the sum is at least 1 (the max's own term) unless every score is -inf

    def normalized(b: Any, h: Any, i: Any, d: Any) -> Any:
        total = row_sum[b, h, i]
        return tirx.Select(total == zero_f, zero_f, acc[b, h, i, d] / total)

    out = te.compute((b_, h_, s_, dv), normalized, name="out")
    return te.create_prim_func([q, kt, v, mask, out])


def _vectorize_inner(sch: Any, block: Any, lanes: int) -> None:
    loops = sch.get_loops(block)
    ext = int(sch.get(loops[-1]).extent)
    w = vec_width(ext, lanes)
    if w is not None:
        _, vi = sch.split(loops[-1], [None, w])
        sch.vectorize(vi)


def _axes(sch: Any, block: Any) -> list[Any]:
    """The loop below the task loop that drives each of the block's iter vars (in the block's
    order; None where none does: a unit axis, whose loop compute_at drops)."""
    from tvm import s_tir, tirx

    loops = list(sch.get_loops(block))[1:]
    realize = sch.get(loops[-1]).body if loops else None
    found: list[Any] = [None] * len(sch.get(block).iter_vars)
    if not isinstance(realize, s_tir.SBlockRealize):
        return found
    for k, value in enumerate(realize.iter_values):
        used = list(tirx.analysis.undefined_vars(value))
        for lp in loops:
            if any(v.same_as(sch.get(lp).loop_var) for v in used):
                found[k] = lp
    return found


def _present(*loops: Any) -> list[Any]:
    return [lp for lp in loops if lp is not None]


def _schedule(func: Any, spec: AttentionSpec, target: TargetSpec) -> Any:
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    lanes = target.lanes
    rows = spec.rows
    out = sch.get_sblock("out")
    b, h, i, d = sch.get_loops(out)
    i_o, _ = sch.split(i, [None, rows])
    outer = sch.fuse(b, h, i_o)
    for name in ("acc", "row_sum", "row_sum_rf", "prob", "row_max", "row_max_rf", "score"):
        sch.compute_at(sch.get_sblock(name), outer)
    if target.num_cores > 1 and spec.batch * spec.heads * spec.queries // rows > 1:
        sch.parallel(outer)
    # TVM 0.27: decompose_reduction only after parallel / vectorize
    decompose: list[tuple[Any, Any]] = []
    # score [b, h, i, j; d]: (j_o, d, rows, j_v) register tile
    score = sch.get_sblock("score")
    si, sj, sd = _axes(sch, score)[2:]
    vec_t = vec_width(spec.padded_keys, lanes) or 1
    sj_o, sj_v = sch.split(sj, [None, vec_t])
    sch.reorder(sj_o, *_present(sd, si), sj_v)
    s_acc = sch.cache_write(score, 0, "global")
    sch.reverse_compute_at(s_acc, sj_o)
    if vec_t > 1:
        sch.vectorize(sj_v)
    if si is not None:
        sch.unroll(si)
    _vectorize_inner(sch, s_acc, lanes)
    decompose.append((score, sd))
    # max / sum partials [b, h, i, l; q]: the lane axis innermost, vectorized
    for name in ("row_max_rf", "row_sum_rf"):
        blk = sch.get_sblock(name)
        rl, rq = _axes(sch, blk)[3:]
        if rq is not None:
            sch.reorder(rq, rl)
        sch.vectorize(rl)
        decompose.append((blk, rq))
    _vectorize_inner(sch, sch.get_sblock("prob"), lanes)
    # acc [b, h, i, d; j]: (j, rows, Dv vectors), a (rows x Dv) accumulator tile
    acc = sch.get_sblock("acc")
    ai, ad, aj = _axes(sch, acc)[2:]
    vec_d = vec_width(spec.value_depth, lanes)
    if ad is not None:
        sch.reorder(*_present(aj, ai), ad)
        if vec_d is not None:
            ad_o, ad_v = sch.split(ad, [None, vec_d])
            sch.vectorize(ad_v)
            sch.unroll(ad_o)
    if ai is not None:
        sch.unroll(ai)
    _vectorize_inner(sch, out, lanes)
    decompose.append((acc, aj))
    for blk, loop in decompose:
        if loop is not None:  # a unit reduction keeps its init
            sch.decompose_reduction(blk, loop)
    return sch.mod["main"]


def attention_kernel(spec: AttentionSpec, target: TargetSpec) -> Kernel:
    """The scheduled attention kernel for ``spec`` (args ``q, kt, v, mask, out``)."""
    func = _schedule(attention_compute(spec), spec, target)
    name = f"kiln_attention_{spec.key()}"
    func = mark_scheduled(func.with_attr("global_symbol", name), "attention", "attention", simd_isa(target))
    return Kernel(name=name, func=func, out_shape=spec.out_shape, out_dtype="float32")
