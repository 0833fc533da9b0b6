"""Row softmax fp32 kernel: ``y = exp(x - max) / Σ exp(x - max)`` over the last axis.

Shapes: ``x [M, N]`` (the leading dims flattened), output ``[M, N]``. Per row: ``m = max_j x_j``
and ``l = Σ_j e_j`` with ``e_j = exp(x_j - m)`` (:func:`~backends.tvm.kernels.fast_math.fast_exp`),
each in ``vec``-wide vector partials plus a scalar tail over the last ``N % vec``, then
``y_j = e_j / l``. Schedule: one task per row (parallel
when the work is large); ``e`` is a row tile (``N`` floats, in L1), so x is read from memory once
and y written once, every loop vectorized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.tvm.kernels.fast_math import fast_exp
from backends.tvm.kernels.kernel import Kernel, mark_scheduled, simd_isa, spec_key
from backends.tvm.schedule_nest import PARALLEL_MIN_WORK

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["RowSoftmaxSpec", "row_softmax_kernel", "row_softmax_compute"]


@dataclass(frozen=True)
class RowSoftmaxSpec:
    """Softmax over rows of ``width`` elements, ``rows`` rows; partial sums ``vec`` wide."""

    rows: int
    width: int
    vec: int

    @property
    def out_shape(self) -> tuple[int, int]:
        """``[M, N]``."""
        return (self.rows, self.width)

    def key(self) -> str:
        """A short deterministic hash of all spec fields."""
        return spec_key(self)


def row_softmax_compute(spec: RowSoftmaxSpec) -> Any:
    """The unscheduled PrimFunc ``(x, out)``."""
    from tvm import te

    m, n, vec = spec.rows, spec.width, spec.vec
    if vec < 2 or n < vec:
        raise ValueError(f"bad row-softmax spec {spec}")
    x = te.placeholder((m, n), "float32", name="x")
    full, tail = divmod(n, vec)

    def row_reduce(val: Any, combine: Any, name: str) -> Any:
        q = te.reduce_axis((0, full), name=f"{name}_q")
        rf = te.compute((m, vec), lambda r, l: combine(val(r, q * vec + l), axis=q), name=f"{name}_rf")
        lane = te.reduce_axis((0, vec), name=f"{name}_l")
        if not tail:
            return te.compute((m,), lambda r: combine(rf[r, lane], axis=lane), name=name)
        lanes = te.compute((m,), lambda r: combine(rf[r, lane], axis=lane), name=f"{name}_lanes")
        t = te.reduce_axis((0, tail), name=f"{name}_t")
        rest = te.compute((m,), lambda r: combine(val(r, full * vec + t), axis=t), name=f"{name}_tail")
        pair = te.max if combine is te.max else (lambda a, b: a + b)
        return te.compute((m,), lambda r: pair(lanes[r], rest[r]), name=name)

    top = row_reduce(lambda r, k: x[r, k], te.max, "row_max")
    e = te.compute((m, n), lambda r, k: fast_exp(x[r, k] - top[r]), name="exp")
    total = row_reduce(lambda r, k: e[r, k], te.sum, "row_sum")
    out = te.compute((m, n), lambda r, k: e[r, k] / total[r], name="out")
    return te.create_prim_func([x, out])


def _schedule(func: Any, spec: RowSoftmaxSpec, target: TargetSpec) -> Any:
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    r, k = sch.get_loops(sch.get_sblock("out"))
    parts = ("_tail", "_lanes", "_rf") if spec.width % spec.vec else ("_rf",)
    stages = [f"{st}{p}" for st in ("row_sum", "row_max") for p in ("", *parts)]
    stages.insert(len(parts) + 1, "exp")  # after the sum's stages, before the max's
    for name in stages:
        sch.compute_at(sch.get_sblock(name), r)
    if target.num_cores > 1 and spec.rows > 1 and spec.rows * spec.width > PARALLEL_MIN_WORK:
        sch.parallel(r)
    decompose = []
    for name in ("row_max_rf", "row_sum_rf"):
        blk = sch.get_sblock(name)
        loops = sch.get_loops(blk)[1:]
        if len(loops) == 2:  # (lane, q); a single vector per row leaves only the lane loop
            lane, q = loops
            sch.reorder(q, lane)
            decompose.append((blk, q))
        sch.vectorize(loops[0])
    if spec.width % spec.vec == 0:  # else LLVM vectorizes the plain loops, with their tails
        for name in ("exp", "out"):
            _, kv = sch.split(sch.get_loops(sch.get_sblock(name))[-1], [None, spec.vec])
            sch.vectorize(kv)
    for blk, q in decompose:
        sch.decompose_reduction(blk, q)
    return sch.mod["main"]


def row_softmax_kernel(spec: RowSoftmaxSpec, target: TargetSpec) -> Kernel:
    """The scheduled row-softmax kernel for ``spec`` (args ``x, out``)."""
    func = _schedule(row_softmax_compute(spec), spec, target)
    name = f"kiln_softmax_{spec.key()}"
    func = mark_scheduled(func.with_attr("global_symbol", name), "row_softmax", "softmax", simd_isa(target))
    return Kernel(name=name, func=func, out_shape=spec.out_shape, out_dtype="float32")
