"""Dense (fully connected) fp32 kernel: ``y = act(x @ W^T + b)`` with a pre-packed weight.

Shapes: ``x [M, K]``, ``W [N, K]`` packed as ``Wp [ceil(N/B), K, B]`` with
``Wp[c, k, j] = W[c*B + j, k]`` (zero where ``c*B + j >= N``), bias packed as
``[ceil(N/B)*B]`` zero padded, output ``[M, N]``; ``B`` is ``spec.block``.

``acc[m, c, j] = sum_k x[m, k] * Wp[c, k, j]`` and ``y[m, n] = act(acc[m, n//B, n%B] + b[n])``
with ONNX activation math (see :mod:`backends.tvm.kernels.epilogue`).

Schedule: a register tile of ``tm`` rows x ``tn`` weight chunks x ``B`` lanes (the B axis
vectorized, the tile loops unrolled, accumulators in a small stack buffer), K split into
cache-sized steps, the (chunk tile, row tile) loop parallel when the work is large, and
the bias+activation epilogue computed inside that loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.tvm.kernels.epilogue import ACTIVATIONS, activation_expr
from backends.tvm.kernels.kernel import Kernel, mark_scheduled, simd_isa, spec_key
from backends.tvm.schedule_nest import fits_stack

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["DenseSpec", "dense_kernel", "dense_compute", "pack_dense_weight", "pack_dense_bias"]

_MAX_ACCUMULATORS = 12  # vector registers held by the register tile
_K_STEP = 256  # reduction chunk (x row slice and W panel stay in L1/L2)
_PARALLEL_MIN_FLOPS = 1 << 16


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class DenseSpec:
    """One fp32 dense layer ``[M, K] x [N, K]^T (+ bias) -> act -> [M, N]``."""

    m: int
    k: int
    n: int
    activation: str = "none"
    alpha: float = 0.0
    beta: float = 0.0
    has_bias: bool = True
    block: int = 16

    @property
    def chunks(self) -> int:
        """``ceil(N / block)``."""
        return _ceil_div(self.n, self.block)

    @property
    def weight_shape(self) -> tuple[int, int, int]:
        """``[ceil(N/block), K, block]``."""
        return (self.chunks, self.k, self.block)

    @property
    def bias_shape(self) -> tuple[int]:
        """``[ceil(N/block) * block]``."""
        return (self.chunks * self.block,)

    @property
    def out_shape(self) -> tuple[int, int]:
        """``[M, N]``."""
        return (self.m, self.n)

    def key(self) -> str:
        """A short deterministic hash of all spec fields."""
        return spec_key(self)


def _check(spec: DenseSpec) -> None:
    if spec.activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {spec.activation!r} (choose from {', '.join(ACTIVATIONS)})")
    if min(spec.m, spec.k, spec.n, spec.block) < 1:
        raise ValueError(f"dense sizes must be positive: {spec}")


def pack_dense_weight(w_nk: np.ndarray, spec: DenseSpec) -> np.ndarray:
    """``W [N, K]`` -> ``Wp [ceil(N/B), K, B]`` with ``Wp[c, k, j] = W[c*B + j, k]`` (zero padded)."""
    w = np.asarray(w_nk, dtype=np.float32)
    if w.shape != (spec.n, spec.k):
        raise ValueError(f"dense weight shape {w.shape} != {(spec.n, spec.k)}")
    full = np.zeros((spec.chunks * spec.block, spec.k), np.float32)
    full[: spec.n] = w
    return np.ascontiguousarray(full.reshape(spec.chunks, spec.block, spec.k).transpose(0, 2, 1))


def pack_dense_bias(b: np.ndarray | None, spec: DenseSpec) -> np.ndarray:
    """Bias ``[N]`` (None: zeros) -> ``[ceil(N/B)*B]`` zero padded."""
    full = np.zeros(spec.bias_shape, np.float32)
    if b is not None:
        full[: spec.n] = np.asarray(b, dtype=np.float32).reshape(-1)
    return full


def dense_compute(spec: DenseSpec) -> Any:
    """The unscheduled PrimFunc ``(x, Wp[, bias], out)``."""
    from tvm import te

    _check(spec)
    bsz = spec.block
    x = te.placeholder((spec.m, spec.k), "float32", name="x")
    w = te.placeholder(spec.weight_shape, "float32", name="weight")
    bias = te.placeholder(spec.bias_shape, "float32", name="bias") if spec.has_bias else None
    rk = te.reduce_axis((0, spec.k), name="rk")
    acc = te.compute(
        (spec.m, spec.chunks, bsz),
        lambda m, c, j: te.sum(x[m, rk] * w[c, rk, j], axis=rk),
        name="acc",
    )

    def epi(m: Any, n: Any) -> Any:
        v = acc[m, n // bsz, n % bsz]
        if bias is not None:
            v = v + bias[n]
        return activation_expr(v, spec.activation, spec.alpha, spec.beta)

    out = te.compute(spec.out_shape, epi, name="epilogue")
    args = [x, w] + ([bias] if bias is not None else []) + [out]
    return te.create_prim_func(args)


def _largest_divisor(n: int, options: tuple[int, ...]) -> int:
    return next(t for t in options if n % t == 0)


def pick_dense_tile(spec: DenseSpec, target: TargetSpec) -> tuple[int, int]:
    """``(tm, tn)``: rows x weight chunks per register tile, at most ~12 vector accumulators."""
    vregs = max(1, _ceil_div(spec.block, target.lanes))
    tm = _largest_divisor(spec.m, (4, 3, 2, 1))
    tn = 1
    for cand in (4, 3, 2):
        fits = fits_stack(tm * cand * spec.block)  # else a workspace buffer per tile
        if spec.chunks % cand == 0 and tm * cand * vregs <= _MAX_ACCUMULATORS and fits:
            tn = cand
            break
    return tm, tn


def _schedule(func: Any, spec: DenseSpec, target: TargetSpec) -> Any:
    from tvm import s_tir

    tm, tn = pick_dense_tile(spec, target)
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock("acc")
    epi = sch.get_sblock("epilogue")
    m, c, j, k = sch.get_loops(acc)
    m_o, m_i = sch.split(m, [None, tm])
    c_o, c_i = sch.split(c, [None, tn])
    k_loops = [k]
    if spec.k > _K_STEP:
        step = next((s for s in range(_K_STEP, 15, -1) if spec.k % s == 0), 0)
        if step:
            k_loops = list(sch.split(k, [None, step]))
    sch.reorder(c_o, m_o, *k_loops, m_i, c_i, j)
    outer = sch.fuse(c_o, m_o)
    # global, not "local": TVM serves every local buffer from the workspace pool (a call per tile);
    # a global one under 1 KiB is a stack array that LLVM keeps in registers
    sch.reverse_compute_at(epi, outer)
    flops = 2 * spec.m * spec.n * spec.k
    tiles = (spec.chunks // tn) * (spec.m // tm)
    if target.num_cores > 1 and tiles > 1 and flops >= _PARALLEL_MIN_FLOPS:
        sch.parallel(outer)
    sch.vectorize(j)
    if tn > 1:
        sch.unroll(c_i)
    if tm > 1:
        sch.unroll(m_i)
    e_m, e_n = sch.get_loops(epi)[-2:]
    if spec.n % spec.block == 0:
        _, e_v = sch.split(e_n, [None, spec.block])
        sch.vectorize(e_v)
    init = sch.decompose_reduction(acc, k_loops[0])
    i_m, i_c, i_j = sch.get_loops(init)[-3:]
    sch.vectorize(i_j)
    sch.unroll(i_c)
    sch.unroll(i_m)
    return sch.mod["main"]


def dense_kernel(spec: DenseSpec, target: TargetSpec) -> Kernel:
    """The scheduled dense kernel for ``spec`` (args ``x, Wp[, bias], out``)."""
    func = _schedule(dense_compute(spec), spec, target)
    name = f"kiln_dense_{spec.key()}"
    func = mark_scheduled(func.with_attr("global_symbol", name), "dense", "dense", simd_isa(target))
    return Kernel(name=name, func=func, out_shape=spec.out_shape, out_dtype="float32")
