"""A generic CPU schedule for the PrimFuncs Kiln does not hand-schedule.

Relax's LegalizeOps + FuseOps + FuseTIR turn every op without a Kiln kernel into a
naive, single-threaded loop nest. This module gives each such PrimFunc (those without
the ``kiln.scheduled`` attribute) a reasonable schedule and then marks it
``kiln.scheduled = "generic"``:

* injective producers with one consumer are inlined (padding, casts, elementwise
  chains); into a reduction consumer only cheap ones (no exp, tanh, ...) and only when the
  reduction then vectorizes along a contiguous axis (otherwise a materialized pad lets
  LLVM vectorize the untouched window loops, measured ~1.4x faster);
* an injective block is reverse-inlined into a spatial producer only when it is that
  producer's sole consumer (not one branch of a split or one reader of a concat);
* spatial blocks with a contiguous innermost axis: all loops fused, an inner chunk of the
  vector width split off and vectorized, the outer part parallel when the block does more
  than ~16K iterations;
* other spatial blocks: transpose-like nests tiled 16x16 (or 8, 4) for cache reuse; else
  only the loops above the innermost one fused and parallel (fusing the innermost loop
  defeats LLVM's own vectorizer, measured 7x slower on a stride-2 max pool);
* matmul-like reductions (plain indices, one reduction axis): a register tile
  ``i_o, j_o, k, i_i (unrolled), j_i (vectorized)`` with a local accumulator;
* other reductions: outer spatial loops fused and parallel, the innermost spatial axis
  vectorized inside the (serial) reduction loops when contiguous, then
  ``decompose_reduction``.

Every rule runs on a copy of the schedule; a rule that raises is logged at debug level
and dropped, so this pass never fails a compilation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tvm

    from backends.tvm.target import TargetSpec

__all__ = ["schedule_unscheduled", "schedule_primfunc", "KilnGenericSchedule", "PARALLEL_MIN_WORK"]

_log = logging.getLogger(__name__)

PARALLEL_MIN_WORK = 16384  # loop iterations below which a block stays serial
_EXPENSIVE = ("exp(", "tanh(", "sigmoid(", "log(", "sqrt(", "pow(", "erf(", "sin(", "cos(")
_TRANSPOSE_TILES = (16, 8, 4)
_TVM_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, AttributeError, AssertionError, KeyError)


def _int(x: Any) -> int | None:
    """``x`` as a Python int when it is a constant, else None."""
    from tvm import tirx

    if isinstance(x, int):
        return x
    if isinstance(x, tirx.IntImm):
        return int(x.value)
    return None


def _vec_width(extent: int | None, lanes: int) -> int | None:
    """The largest of ``lanes``, ``lanes/2`` (at least 4) that divides ``extent``."""
    if extent is None:
        return None
    for w in (lanes, lanes // 2):
        if w >= 4 and extent % w == 0:
            return w
    return None


class _Nest:
    """The loops directly binding one block's iter vars, outermost first."""

    def __init__(self, sch: Any, block: Any) -> None:
        from tvm import s_tir, tirx

        self.block = sch.get(block)
        self.loops = list(sch.get_loops(block))
        self.extents = [_int(sch.get(lp).extent) for lp in self.loops]
        self.kinds: list[str | None] = [None] * len(self.loops)
        self.iter_vars: list[Any] = [None] * len(self.loops)
        loop_vars = [sch.get(lp).loop_var for lp in self.loops]
        realize: Any = sch.get(self.loops[-1]).body if self.loops else None
        if not isinstance(realize, s_tir.SBlockRealize):
            return
        for iv, value in zip(self.block.iter_vars, realize.iter_values, strict=True):
            if not isinstance(value, tirx.Var):
                continue
            for i, lv in enumerate(loop_vars):
                if lv.same_as(value):
                    self.kinds[i] = "S" if int(iv.iter_type) == 0 else "R" if int(iv.iter_type) == 2 else None
                    self.iter_vars[i] = iv.var

    @property
    def simple(self) -> bool:
        """Every loop binds exactly one spatial or reduction iter var and has a constant extent."""
        return bool(self.loops) and all(k is not None for k in self.kinds) and None not in self.extents

    @property
    def work(self) -> int:
        """Product of the loop extents (0 when any is symbolic)."""
        w = 1
        for e in self.extents:
            if e is None:
                return 0
            w *= e
        return w


def _contiguous_in(block: Any, var: Any) -> bool:
    """True when ``var`` indexes only the last axis of the write, with stride 1, and of every
    read either the same way or not at all (so a vector along ``var`` is contiguous or a broadcast)."""
    from tvm import sym

    def coefs(region: Any) -> list[int | None]:
        out: list[int | None] = []
        for rng in region.region:
            eq = sym.detect_linear_equation(rng.min, [var])
            out.append(_int(eq[0]) if len(eq) == 2 else None)
        return out

    def ok(region: Any, allow_broadcast: bool) -> bool:
        c = coefs(region)
        if not c:
            return allow_broadcast
        if any(x != 0 for x in c[:-1]):
            return False
        return c[-1] == 1 or (allow_broadcast and c[-1] == 0)

    return all(ok(w, False) for w in block.writes) and all(ok(r, True) for r in block.reads)


def _is_plain_indexed(block: Any) -> bool:
    """True when every read/write index is a bare iter var or a constant (matmul-like access)."""
    from tvm import tirx

    for reg in list(block.reads) + list(block.writes):
        for rng in reg.region:
            if _int(rng.extent) != 1:
                return False
            if not isinstance(rng.min, tirx.Var | tirx.IntImm):
                return False
    return True


def _inline(sch: Any, name: str, reverse: bool) -> None:
    block = sch.get_sblock(name)
    if reverse:
        sch.reverse_compute_inline(block)
    else:
        sch.compute_inline(block)


def _only_consumer(sch: Any, producer: Any, name: str) -> bool:
    """True when block ``name`` is the only reader of ``producer``'s output.

    ``reverse_compute_inline`` rewrites the producer to store the consumer's result and drops
    the intermediate buffer, but TVM 0.27 does not check that no other block still reads it:
    after FuseOps/FuseTIR a split (or an unpack feeding one) has one consumer per branch, and
    reverse-inlining the first branch leaves the others reading a buffer that no longer exists
    ("Buffer ... is used before its definition" in FlattenBuffer).
    """
    return [sch.get(c).name_hint for c in sch.get_consumers(producer)] == [name]


def _inline_producers(sch: Any, lanes: int) -> Any:
    """Inline single-consumer injective blocks into their consumer (or reverse-inline into a
    spatial producer whose only consumer it is), repeating until nothing changes; returns the
    new schedule.

    Into a reduction consumer only cheap producers are inlined, and only when the consumer then
    vectorizes along a contiguous axis (a materialized pad beats an inlined condition otherwise).
    """
    changed = True
    while changed:
        changed = False
        if not _has_root(sch):
            return sch
        root = sch.get_sblock("root")
        outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)}
        for b in sch.get_child_blocks(root):
            blk = sch.get(b)
            if any(int(iv.iter_type) != 0 for iv in blk.iter_vars):
                continue
            consumers = sch.get_consumers(b)
            if blk.name_hint not in outputs and len(consumers) == 1:
                cons = sch.get(consumers[0])
                reduces = any(int(iv.iter_type) != 0 for iv in cons.iter_vars)
                if not (reduces and any(t in str(blk.body) for t in _EXPENSIVE)):
                    new = _try(sch, partial(_inline, name=blk.name_hint, reverse=False), "inline")
                    if (
                        new is not None
                        and reduces
                        and _reduction_vector_width(new, new.get_sblock(cons.name_hint), lanes) is None
                    ):
                        new = None
                    if new is not None:
                        sch, changed = new, True
                        break
            producers = sch.get_producers(b)
            if (
                len(producers) == 1
                and not any(int(iv.iter_type) != 0 for iv in sch.get(producers[0]).iter_vars)
                and _only_consumer(sch, producers[0], blk.name_hint)
            ):
                new = _try(sch, partial(_inline, name=blk.name_hint, reverse=True), "reverse-inline")
                if new is not None:
                    sch, changed = new, True
                    break
    return sch


def _has_root(sch: Any) -> bool:
    try:
        sch.get_sblock("root")
    except _TVM_ERRORS:
        return False
    return True


def _try(sch: Any, rule: Callable[[Any], None], what: str) -> Any | None:
    """Run ``rule`` on a copy of ``sch``: the changed copy, or None (logged) if it raised."""
    trial = sch.copy()
    try:
        rule(trial)
    except _TVM_ERRORS as exc:
        _log.debug("generic schedule: %s failed: %s", what, str(exc).splitlines()[0] if str(exc) else exc)
        return None
    return trial


def _parallel_keep_inner(sch: Any, loops: list[Any], extents: list[int | None]) -> None:
    """Make the loops above the innermost non-unit loop one parallel loop; the innermost stays a
    plain loop LLVM can vectorize. With a single non-unit loop, split off a parallel outer part."""
    nonunit = [i for i, e in enumerate(extents) if e != 1]
    if not nonunit:
        return
    last = nonunit[-1]
    head_work = 1
    for e in extents[:last]:
        head_work *= e or 2
    if last > 0 and head_work >= 2:
        head = loops[:last]
        sch.parallel(sch.fuse(*head) if len(head) > 1 else head[0])
        return
    ext = extents[last]
    chunk = next((c for c in (256, 128, 64, 32, 16) if ext and ext % c == 0 and ext // c >= 2), None)
    if chunk is not None:
        outer, _ = sch.split(loops[last], [None, chunk])
        sch.parallel(outer)
    else:
        sch.parallel(loops[last])


def _tile_transpose(sch: Any, nest: _Nest, parallel: bool) -> bool:
    """A transpose-like nest (a read's contiguous axis is an outer loop ``j``, not the innermost
    ``w``): tile ``j`` and ``w`` by 16, 8 or 4 so each tile reuses its cache lines.
    False when the nest does not look like that."""
    from tvm import sym

    if not nest.simple or len(nest.loops) < 2:
        return False
    j = None
    for cand in range(len(nest.loops) - 2, -1, -1):
        for r in nest.block.reads:
            if len(r.region) == 0:
                continue
            eq = sym.detect_linear_equation(r.region[-1].min, [nest.iter_vars[cand]])
            if len(eq) == 2 and _int(eq[0]) == 1:
                j = cand
                break
        if j is not None:
            break
    ej, ew = nest.extents[j] if j is not None else None, nest.extents[-1]
    t = next((t for t in _TRANSPOSE_TILES if ej and ew and ej % t == 0 and ew % t == 0), None)
    if j is None or t is None:
        return False
    loops = nest.loops
    jo, ji = sch.split(loops[j], [None, t])
    wo, wi = sch.split(loops[-1], [None, t])
    outer = [*loops[:j], jo, *loops[j + 1 : -1], wo]
    sch.reorder(*outer, ji, wi)
    if parallel:
        sch.parallel(sch.fuse(*outer))
    return True


def _schedule_spatial(sch: Any, name: str, lanes: int, num_cores: int) -> None:
    """Contiguous innermost axis: fuse all loops, vectorize an inner lanes chunk, parallel the rest
    when large. Otherwise (gathers, strided reads) only parallelize the outer loops when large."""
    block = sch.get_sblock(name)
    nest = _Nest(sch, block)
    if not nest.loops:
        return
    vec = None
    if nest.simple and nest.kinds[-1] == "S" and _contiguous_in(nest.block, nest.iter_vars[-1]):
        vec = _vec_width(nest.extents[-1], lanes)
    parallel = nest.work > PARALLEL_MIN_WORK and num_cores > 1
    if vec is None:
        if not _tile_transpose(sch, nest, parallel) and parallel:
            _parallel_keep_inner(sch, nest.loops, nest.extents)
        return
    fused = sch.fuse(*nest.loops) if len(nest.loops) > 1 else nest.loops[0]
    outer, inner = sch.split(fused, [None, vec])
    sch.vectorize(inner)
    if parallel:
        sch.parallel(outer)


def _schedule_matmul(sch: Any, name: str, lanes: int, num_cores: int) -> None:
    """``[batch.., i, j] += A[.., i, k] * B[.., k, j]``: tile i by 4 (unrolled) and j by the vector width."""
    block = sch.get_sblock(name)
    nest = _Nest(sch, block)
    if not (nest.simple and nest.kinds.count("R") == 1 and nest.kinds[-1] == "R" and len(nest.loops) >= 3):
        raise ValueError("not matmul-like")
    if not _is_plain_indexed(nest.block) or len(nest.block.reads) != 2:
        raise ValueError("not matmul-like")
    j_ext = nest.extents[-2]
    vec = _vec_width(j_ext, lanes)
    if vec is None or not _contiguous_in(nest.block, nest.iter_vars[-2]):
        raise ValueError("j axis not vectorizable")
    *batch, i, j, k = nest.loops
    i_ext = nest.extents[-3] or 1
    ti = next(t for t in (4, 2, 1) if i_ext % t == 0)
    tj = 2 if j_ext is not None and j_ext % (2 * vec) == 0 and j_ext >= 4 * vec else 1
    i_o, i_i = sch.split(i, [None, ti])
    j_o, j_i = sch.split(j, [None, tj * vec])
    sch.reorder(*batch, i_o, j_o, k, i_i, j_i)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, j_o)
    outer = sch.fuse(*batch, i_o, j_o)
    if nest.work > PARALLEL_MIN_WORK and num_cores > 1:
        sch.parallel(outer)
    j_io, j_ii = sch.split(j_i, [None, vec])
    sch.vectorize(j_ii)
    if ti > 1:
        sch.unroll(i_i)
    if tj > 1:
        sch.unroll(j_io)
    tail = list(sch.get_loops(local))[1:]  # below the fused outer loop
    if tail:
        wf = sch.fuse(*tail) if len(tail) > 1 else tail[0]
        _, wv = sch.split(wf, [None, vec])
        sch.vectorize(wv)
    sch.decompose_reduction(block, k)


def _reduction_vector_width(sch: Any, block: Any, lanes: int) -> int | None:
    """The vector width for the innermost spatial axis of a reduction block, or None when that axis
    is not contiguous (then LLVM's own vectorizer does better on the untouched nest)."""
    nest = _Nest(sch, block)
    if not nest.simple or "S" not in nest.kinds:
        return None
    i = max(j for j, kd in enumerate(nest.kinds) if kd == "S")
    if not _contiguous_in(nest.block, nest.iter_vars[i]):
        return None
    return _vec_width(nest.extents[i], lanes)


def _schedule_reduction(sch: Any, name: str, lanes: int, num_cores: int) -> None:
    """Parallel outer spatial loops and serial reduction loops. A contiguous innermost spatial axis
    is split by the vector width and vectorized inside the reduction loops; then the reduction is
    decomposed (after parallel/vectorize, as 0.27 requires)."""
    block = sch.get_sblock(name)
    nest = _Nest(sch, block)
    if not nest.simple:
        raise ValueError("reduction nest is not a simple loop-per-iter-var nest")
    spatial = [lp for lp, kd in zip(nest.loops, nest.kinds, strict=True) if kd == "S"]
    s_ext = [e for e, kd in zip(nest.extents, nest.kinds, strict=True) if kd == "S"]
    red = [lp for lp, kd in zip(nest.loops, nest.kinds, strict=True) if kd == "R"]
    if not spatial or not red:
        raise ValueError("not a spatial-then-reduction nest")
    if nest.kinds != ["S"] * len(spatial) + ["R"] * len(red):
        sch.reorder(*spatial, *red)
    parallel = nest.work > PARALLEL_MIN_WORK and num_cores > 1
    vec = _reduction_vector_width(sch, block, lanes) if lanes > 1 else None
    if vec is None:
        if parallel:
            _parallel_keep_inner(sch, spatial, s_ext)
    else:
        so, si = sch.split(spatial[-1], [None, vec])
        sch.reorder(so, *red, si)
        outer_loops = [*spatial[:-1], so]
        outer = sch.fuse(*outer_loops) if len(outer_loops) > 1 else outer_loops[0]
        spatial_work = 1
        for e in s_ext:
            spatial_work *= e or 1
        if parallel and spatial_work // vec > 1:
            sch.parallel(outer)
        sch.vectorize(si)
    sch.decompose_reduction(block, red[0])


def _schedule_block(sch: Any, name: str, target: TargetSpec) -> Any:
    """The schedule after the first rule that applies to block ``name`` (``sch`` if none does)."""
    blk = sch.get(sch.get_sblock(name))
    lanes, cores = target.lanes, target.num_cores
    rules: list[tuple[str, Callable[[Any], None]]]
    if all(int(iv.iter_type) == 0 for iv in blk.iter_vars):
        rules = [
            ("spatial", lambda s: _schedule_spatial(s, name, lanes, cores)),
            ("spatial-novec", lambda s: _schedule_spatial(s, name, 1, cores)),
        ]
    else:
        rules = [
            ("matmul", lambda s: _schedule_matmul(s, name, lanes, cores)),
            ("reduction", lambda s: _schedule_reduction(s, name, lanes, cores)),
            ("reduction-novec", lambda s: _schedule_reduction(s, name, 1, cores)),
        ]
    for what, rule in rules:
        new = _try(sch, rule, f"{what} {name}")
        if new is not None:
            return new
    return sch


def schedule_primfunc(func: tvm.tirx.PrimFunc, target: TargetSpec) -> tvm.tirx.PrimFunc:
    """``func`` with the generic CPU schedule applied and ``kiln.scheduled = "generic"``;
    unchanged (but marked) where no rule applies."""
    from tvm import s_tir

    try:
        sch = _inline_producers(s_tir.Schedule(func), target.lanes)
        if _has_root(sch):
            names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
            for name in names:
                sch = _schedule_block(sch, name, target)
        out = sch.mod["main"]
    except _TVM_ERRORS as exc:  # never fail a compilation over a missed optimization
        _log.debug("generic schedule: function left unscheduled: %s", exc)
        out = func
    return out.with_attr("kiln.scheduled", "generic")


def schedule_unscheduled(mod: tvm.IRModule, target: TargetSpec) -> tvm.IRModule:
    """A copy of ``mod`` where every PrimFunc lacking ``kiln.scheduled`` got the generic schedule."""
    import tvm as _tvm
    from tvm import tirx

    funcs = {}
    for gv, func in mod.functions_items():
        if (
            target.is_cpu
            and isinstance(func, tirx.PrimFunc)
            and (func.attrs is None or "kiln.scheduled" not in func.attrs)
        ):
            funcs[gv] = schedule_primfunc(func, target)
        else:
            funcs[gv] = func
    return _tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


def KilnGenericSchedule(target: TargetSpec) -> tvm.transform.Pass:  # noqa: N802 (TVM pass naming)
    """The module pass form of :func:`schedule_unscheduled`."""
    import tvm as _tvm

    def transform(mod: Any, _ctx: Any) -> Any:
        return schedule_unscheduled(mod, target)

    return _tvm.transform.module_pass(transform, opt_level=0, name="KilnGenericSchedule")
