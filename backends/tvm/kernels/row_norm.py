"""Row normalization fp32 kernel: LayerNorm and RMSNorm over the last ``N`` elements of each row.

Shapes: ``x [M, N]`` (the leading dims flattened, the normalized dims flattened), ``gamma [N]``,
``beta [N]`` (LayerNorm, optional), output ``[M, N]``. Per row:

* LayerNorm: ``mu = Σ x / N``, ``var = Σ (x - mu)² / N``, ``y = (x - mu) · r · gamma + beta``;
* RMSNorm: ``ms = Σ x² / N``, ``y = x · r · gamma``;

with ``r = 1 / sqrt(var + eps)`` (resp. ``ms``) computed once per row. Schedule: one task per row
(parallel when the work is large), each sum in ``vec``-wide vector partials (the row is read from
L1 by the second sum and the write), the write vectorized: x is read from memory once and y
written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.tvm.kernels.kernel import Kernel, mark_scheduled, simd_isa, spec_key
from backends.tvm.schedule_nest import PARALLEL_MIN_WORK, vec_width

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["RowNormSpec", "row_norm_kernel", "row_norm_compute", "row_norm_width"]

KINDS = ("layer", "rms")


@dataclass(frozen=True)
class RowNormSpec:
    """``kind`` ("layer" or "rms") normalization of ``rows`` rows of ``width`` elements."""

    kind: str
    rows: int
    width: int
    epsilon: float
    has_beta: bool
    vec: int

    @property
    def out_shape(self) -> tuple[int, int]:
        """``[M, N]``."""
        return (self.rows, self.width)

    def key(self) -> str:
        """A short deterministic hash of all spec fields."""
        return spec_key(self)


def row_norm_width(width: int, lanes: int) -> int | None:
    """The partial-sum vector width for rows of ``width`` (None: no vector width divides it)."""
    return vec_width(width, lanes) or (4 if width % 4 == 0 else None)


def row_norm_compute(spec: RowNormSpec) -> Any:
    """The unscheduled PrimFunc ``(x, gamma[, beta], out)``."""
    from tvm import te, tirx

    if spec.kind not in KINDS or spec.width % spec.vec:
        raise ValueError(f"bad row-norm spec {spec}")
    m, n, vec = spec.rows, spec.width, spec.vec
    x = te.placeholder((m, n), "float32", name="x")
    gamma = te.placeholder((n,), "float32", name="gamma")
    beta = te.placeholder((n,), "float32", name="beta") if spec.has_beta else None
    inv_n = tirx.const(1.0 / n, "float32")
    eps = tirx.const(spec.epsilon, "float32")

    def row_sum(val: Any, name: str) -> Any:
        q = te.reduce_axis((0, n // vec), name=f"{name}_q")
        rf = te.compute((m, vec), lambda r, l: te.sum(val(r, q * vec + l), axis=q), name=f"{name}_rf")
        lane = te.reduce_axis((0, vec), name=f"{name}_l")
        return te.compute((m,), lambda r: te.sum(rf[r, lane], axis=lane), name=name)

    if spec.kind == "layer":
        total = row_sum(lambda r, k: x[r, k], "mean_sum")
        mean = te.compute((m,), lambda r: total[r] * inv_n, name="mean")
        sq = row_sum(lambda r, k: (x[r, k] - mean[r]) * (x[r, k] - mean[r]), "var_sum")

        def centered(r: Any, k: Any) -> Any:
            return x[r, k] - mean[r]
    else:
        sq = row_sum(lambda r, k: x[r, k] * x[r, k], "var_sum")

        def centered(r: Any, k: Any) -> Any:
            return x[r, k]

    one = tirx.const(1.0, "float32")
    inv = te.compute((m,), lambda r: one / te.sqrt(sq[r] * inv_n + eps), name="inv_std")

    def norm(r: Any, k: Any) -> Any:
        y = centered(r, k) * inv[r] * gamma[k]
        return y + beta[k] if beta is not None else y

    out = te.compute((m, n), norm, name="out")
    args = [x, gamma] + ([beta] if beta is not None else []) + [out]
    return te.create_prim_func(args)


def _schedule(func: Any, spec: RowNormSpec, target: TargetSpec) -> Any:
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    out = sch.get_sblock("out")
    r, k = sch.get_loops(out)
    stages = ["inv_std", "var_sum", "var_sum_rf"]
    if spec.kind == "layer":
        stages += ["mean", "mean_sum", "mean_sum_rf"]
    for name in stages:
        sch.compute_at(sch.get_sblock(name), r)
    if target.num_cores > 1 and spec.rows > 1 and spec.rows * spec.width > PARALLEL_MIN_WORK:
        sch.parallel(r)
    decompose = []
    for name in stages:
        if not name.endswith("_rf"):
            continue
        blk = sch.get_sblock(name)
        loops = sch.get_loops(blk)[1:]
        if len(loops) == 2:  # (lane, q); a single vector per row leaves only the lane loop
            lane, q = loops
            sch.reorder(q, lane)
            decompose.append((blk, q))
        sch.vectorize(loops[0])
    _, kv = sch.split(k, [None, spec.vec])
    sch.vectorize(kv)
    for blk, q in decompose:
        sch.decompose_reduction(blk, q)
    return sch.mod["main"]


def row_norm_kernel(spec: RowNormSpec, target: TargetSpec) -> Kernel:
    """The scheduled row-normalization kernel for ``spec`` (args ``x, gamma[, beta], out``)."""
    func = _schedule(row_norm_compute(spec), spec, target)
    name = f"kiln_{spec.kind}_norm_{spec.key()}"
    func = func.with_attr("global_symbol", name)
    func = mark_scheduled(func, "row_norm", "normalization", simd_isa(target))
    return Kernel(name=name, func=func, out_shape=spec.out_shape, out_dtype="float32")
