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
  than ~16K iterations; when an ``if_then_else`` selects on an outer axis (concat), the loops
  down to that axis stay outside (parallel) and only the ones below are fused and vectorized;
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

from backends.tvm.schedule_matmul import schedule_matmul, schedule_row_reduction
from backends.tvm.schedule_nest import (
    PARALLEL_MIN_WORK,
    TVM_ERRORS,
    Nest,
    as_int,
    condition_vars,
    contiguous_in,
    vec_width,
)

if TYPE_CHECKING:
    import tvm

    from backends.tvm.target import TargetSpec

__all__ = ["schedule_unscheduled", "schedule_primfunc", "KilnGenericSchedule", "PARALLEL_MIN_WORK"]

_log = logging.getLogger(__name__)

_EXPENSIVE = ("exp(", "tanh(", "sigmoid(", "log(", "sqrt(", "pow(", "erf(", "sin(", "cos(")
_TRANSPOSE_TILES = (16, 8, 4)


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
    except TVM_ERRORS:
        return False
    return True


def _try(sch: Any, rule: Callable[[Any], None], what: str) -> Any | None:
    """Run ``rule`` on a copy of ``sch``: the changed copy, or None (logged) if it raised."""
    trial = sch.copy()
    try:
        rule(trial)
    except TVM_ERRORS as exc:
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


def _tile_transpose(sch: Any, nest: Nest, parallel: bool) -> bool:
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
            if len(eq) == 2 and as_int(eq[0]) == 1:
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
    nest = Nest(sch, block)
    if not nest.loops:
        return
    vec = None
    if nest.simple and nest.kinds[-1] == "S" and contiguous_in(nest.block, nest.iter_vars[-1]):
        vec = vec_width(nest.extents[-1], lanes)
    parallel = nest.work > PARALLEL_MIN_WORK and num_cores > 1
    if vec is None:
        if not _tile_transpose(sch, nest, parallel) and parallel:
            _parallel_keep_inner(sch, nest.loops, nest.extents)
        return
    cond = condition_vars(nest.block)
    split_at = max(
        (i for i, v in enumerate(nest.iter_vars[:-1]) if any(v.same_as(c) for c in cond)), default=-1
    )
    if split_at >= 0:
        # a selection on an outer axis (concat): keep it outside, so each branch is taken once per
        # row instead of once per vector (measured 13x on DenseNet's 13-way channel concat)
        head, tail = nest.loops[: split_at + 1], nest.loops[split_at + 1 :]
        inner_loop = sch.fuse(*tail) if len(tail) > 1 else tail[0]
        _, inner = sch.split(inner_loop, [None, vec])
        sch.vectorize(inner)
        if parallel:
            sch.parallel(sch.fuse(*head) if len(head) > 1 else head[0])
        return
    fused = sch.fuse(*nest.loops) if len(nest.loops) > 1 else nest.loops[0]
    outer, inner = sch.split(fused, [None, vec])
    sch.vectorize(inner)
    if parallel:
        sch.parallel(outer)


def _reduction_vector_width(sch: Any, block: Any, lanes: int) -> int | None:
    """The vector width for the innermost spatial axis of a reduction block, or None when that axis
    is not contiguous (then LLVM's own vectorizer does better on the untouched nest)."""
    nest = Nest(sch, block)
    if not nest.simple or "S" not in nest.kinds:
        return None
    i = max(j for j, kd in enumerate(nest.kinds) if kd == "S")
    if not contiguous_in(nest.block, nest.iter_vars[i]):
        return None
    return vec_width(nest.extents[i], lanes)


def _schedule_reduction(sch: Any, name: str, lanes: int, num_cores: int) -> None:
    """Parallel outer spatial loops and serial reduction loops. A contiguous innermost spatial axis
    is split by the vector width and vectorized inside the reduction loops; then the reduction is
    decomposed (after parallel/vectorize, as 0.27 requires)."""
    block = sch.get_sblock(name)
    nest = Nest(sch, block)
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


def _schedule_block(sch: Any, name: str, target: TargetSpec) -> tuple[Any, str | None]:
    """The schedule after the first rule that applies to block ``name`` (``sch`` if none does),
    and that rule's name (None: none applied, or the block is gone, e.g. inlined by a rule)."""
    try:
        blk = sch.get(sch.get_sblock(name))
    except TVM_ERRORS:
        return sch, None
    lanes, cores = target.lanes, target.num_cores
    rules: list[tuple[str, Callable[[Any], None]]]
    if all(int(iv.iter_type) == 0 for iv in blk.iter_vars):
        rules = [
            ("spatial", lambda s: _schedule_spatial(s, name, lanes, cores)),
            ("spatial-novec", lambda s: _schedule_spatial(s, name, 1, cores)),
        ]
    else:
        rules = [
            ("matmul", lambda s: schedule_matmul(s, name, target)),
            ("row-reduction", lambda s: schedule_row_reduction(s, name, target)),
            ("reduction", lambda s: _schedule_reduction(s, name, lanes, cores)),
            ("reduction-novec", lambda s: _schedule_reduction(s, name, 1, cores)),
        ]
    for what, rule in rules:
        new = _try(sch, rule, f"{what} {name}")
        if new is not None:
            return new, what
    return sch, None


def _blocks(sch: Any) -> dict[str, Any]:
    """The root's child blocks by name (empty without a root block)."""
    if not _has_root(sch):
        return {}
    return {sch.get(b).name_hint: sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))}


_RULE_RANK = ("matmul", "row-reduction", "reduction", "reduction-novec", "spatial", "spatial-novec")


def schedule_primfunc(func: tvm.tirx.PrimFunc, target: TargetSpec, name: str = "") -> tvm.tirx.PrimFunc:
    """``func`` with the generic CPU schedule applied and ``kiln.scheduled = "generic"``;
    unchanged (but marked) where no rule applies. It also records what it did (the "which kernel
    ran" report): ``kiln.generic_rule`` (the main rule applied), ``kiln.op_class`` (from the
    blocks: :func:`backends.tvm.kernel_report.classify_generic`) and ``kiln.isa`` = generic."""
    from tvm import s_tir

    from backends.tvm.kernel_report import classify_generic

    original = _blocks(s_tir.Schedule(func))
    rules: dict[str, str] = {}
    try:
        sch = _inline_producers(s_tir.Schedule(func), target.lanes)
        for block in list(_blocks(sch)):
            sch, rule = _schedule_block(sch, block, target)
            if rule is not None:
                rules[block] = rule
        out = sch.mod["main"]
    except TVM_ERRORS as exc:  # never fail a compilation over a missed optimization
        _log.debug("generic schedule: function left unscheduled: %s", exc)
        out, rules = func, {}
    main = min(rules.values(), key=_RULE_RANK.index, default="none")
    op_class = classify_generic(name, original, {k: v for k, v in rules.items() if k in original})
    return out.with_attrs(
        {
            "kiln.scheduled": "generic",
            "kiln.generic_rule": main,
            "kiln.op_class": op_class,
            "kiln.isa": "generic",
        }
    )


def schedule_unscheduled(
    mod: tvm.IRModule, target: TargetSpec, log: list[dict[str, str]] | None = None
) -> tvm.IRModule:
    """A copy of ``mod`` where every PrimFunc lacking ``kiln.scheduled`` got the generic schedule;
    ``log`` (if given) receives each one's record (:func:`backends.tvm.kernel_report.kernel_entry`)."""
    import tvm as _tvm
    from tvm import tirx

    from backends.tvm.kernel_report import kernel_entry
    from backends.tvm.vector_intrinsics import mark_vectorizable

    mark_vectorizable()  # before the build's VectorizeLoop (see that module)
    funcs = {}
    for gv, func in mod.functions_items():
        if (
            target.is_cpu
            and isinstance(func, tirx.PrimFunc)
            and (func.attrs is None or "kiln.scheduled" not in func.attrs)
        ):
            funcs[gv] = schedule_primfunc(func, target, gv.name_hint)
            if log is not None:
                log.append(kernel_entry(gv.name_hint, funcs[gv]))
        else:
            funcs[gv] = func
    return _tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


def KilnGenericSchedule(  # noqa: N802 (TVM pass naming)
    target: TargetSpec, log: list[dict[str, str]] | None = None
) -> tvm.transform.Pass:
    """The module pass form of :func:`schedule_unscheduled`."""
    import tvm as _tvm

    def transform(mod: Any, _ctx: Any) -> Any:
        return schedule_unscheduled(mod, target, log)

    return _tvm.transform.module_pass(transform, opt_level=0, name="KilnGenericSchedule")
