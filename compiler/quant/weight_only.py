"""Weight-only block quantization: the grid of a [N, K] weight and its integer levels.

A row n of W is cut into blocks of ``block_size`` weights along K (the last one may be shorter);
block b gets a scale s and, asymmetric, a zero point z, on ``bits``-bit signed levels
q ∈ [qmin, qmax] = [-2^(bits-1), 2^(bits-1) - 1]::

    symmetric:   s = max|w_b| / (2^(bits-1) - 1),  z = 0,   q ∈ [-qmax, qmax]
    asymmetric:  lo = min(min w_b, 0), hi = max(max w_b, 0),  s = (hi - lo) / (2^bits - 1),
                 z = clip(rint(qmin - lo / s), qmin, qmax)   (0 lies on the grid)
    nearest:     q = clip(rint(w / s) + z, qmin, qmax),   w ≈ (q - z) · s

s is rounded to the scale dtype (float16 or float32) before any level is computed, so the
levels are those of the stored grid. GPTQ (:func:`compiler.quant.gptq.gptq_columns`) keeps
the grid and picks the levels that minimise the layer's output error ||(W - Ŵ) Xᵀ||²_F over
calibration inputs X (rows of A), H = Σ x xᵀ; :func:`linear_hessians` measures H for the
MatMul/Gemm nodes of a float graph in one run over the samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node
from compiler.ops.weight_only import block_count, level_range
from compiler.quant.gptq import DAMP, gptq_columns

__all__ = [
    "BlockGrid",
    "MAX_GPTQ_COLUMNS",
    "block_grid",
    "nearest_levels",
    "gptq_block_levels",
    "linear_hessians",
]

LAZY_BLOCK = 128
"""Columns per GPTQ lazy batch update."""
MAX_GPTQ_COLUMNS = 8192
"""Largest K for GPTQ: the K x K float64 Hessian and its inverse factor (1 GiB at this size)."""


@dataclass(frozen=True)
class BlockGrid:
    """The grid of one weight [N, K]: scales [N, n_blocks] (float32 values of the scale dtype) and
    signed zero points [N, n_blocks] (None: symmetric)."""

    scales: np.ndarray
    zero_points: np.ndarray | None
    bits: int
    block_size: int

    def per_weight(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """s and z per weight [N, K] (float64)."""
        s = np.repeat(self.scales.astype(np.float64), self.block_size, axis=1)[:, :k]
        z = np.zeros_like(s) if self.zero_points is None else self.zero_points.astype(np.float64)
        if self.zero_points is not None:
            z = np.repeat(z, self.block_size, axis=1)[:, :k]
        return s, z


def _blocks(w: np.ndarray, block_size: int) -> np.ndarray:
    """w [N, K] as [N, n_blocks, block_size] float64, the last block padded with its own first value."""
    n, k = w.shape
    nb = block_count(k, block_size)
    out = np.empty((n, nb * block_size), np.float64)
    out[:, :k] = w
    out[:, k:] = w[:, (nb - 1) * block_size : (nb - 1) * block_size + 1]
    return out.reshape(n, nb, block_size)


def block_grid(w: np.ndarray, bits: int, block_size: int, symmetric: bool, scale_dtype: str) -> BlockGrid:
    """The grid of ``w`` [N, K] (see the module docstring); ``scale_dtype`` is fp16 or fp32.

    An fp16 scale past 65504 is inf: callers check ``np.isfinite(grid.scales)``.
    """
    b = _blocks(np.asarray(w, np.float64), block_size)
    qmin, qmax = level_range(bits)
    store = np.float16 if scale_dtype == "fp16" else np.float32
    with np.errstate(over="ignore"):
        if symmetric:
            s = (np.abs(b).max(axis=2) / qmax).astype(store).astype(np.float32)
            return BlockGrid(s, None, bits, block_size)
        lo, hi = np.minimum(b.min(axis=2), 0.0), np.maximum(b.max(axis=2), 0.0)
        s = ((hi - lo) / (qmax - qmin)).astype(store).astype(np.float32)
    safe = np.where(s > 0, s, 1.0).astype(np.float64)
    z = np.where(s > 0, np.clip(np.rint(qmin - lo / safe), qmin, qmax), 0.0)
    return BlockGrid(s, z.astype(np.int8), bits, block_size)


def nearest_levels(w: np.ndarray, grid: BlockGrid) -> np.ndarray:
    """q = clip(rint(w / s) + z, qmin, qmax) per weight (int8 [N, K]); a zero scale gives q = z."""
    w = np.asarray(w, np.float64)
    s, z = grid.per_weight(w.shape[1])
    qmin, qmax = level_range(grid.bits)
    safe = np.where(s > 0, s, 1.0)
    q = np.where(s > 0, np.clip(np.rint(w / safe) + z, qmin, qmax), z)
    return q.astype(np.int8)


def gptq_block_levels(w: np.ndarray, h: np.ndarray, grid: BlockGrid, *, damp: float = DAMP) -> np.ndarray:
    """GPTQ levels (int8 [N, K]) of ``w`` on ``grid`` (its scales and zero points unchanged); H [K, K]."""
    w = np.asarray(w, np.float64)
    s, z = grid.per_weight(w.shape[1])
    qmin, qmax = level_range(grid.bits)
    live = s > 0
    safe = np.where(live, s, 1.0)

    def level(k: int, col: np.ndarray) -> np.ndarray:
        q = np.clip(np.rint(col / safe[:, k]) + z[:, k], qmin, qmax)
        return np.asarray(np.where(live[:, k], q, z[:, k]))

    def decode(k: int, q: np.ndarray) -> np.ndarray:
        return np.asarray((q - z[:, k]) * s[:, k])

    return gptq_columns(w, h, level, decode, damp=damp, lazy_block=LAZY_BLOCK).astype(np.int8)


def linear_hessians(
    graph: Graph, nodes: Sequence[Node], samples: Iterable[Mapping[str, np.ndarray]]
) -> dict[int, np.ndarray]:
    """H = Σ x xᵀ (float64 [K, K], summed per sample in float32) over every row x of input A of
    each node (by node id), with the float graph run in onnxruntime over ``samples``."""
    from compiler.quant.calibrate import graph_runner

    inputs: dict[int, str] = {}
    for node in nodes:
        a = graph.inputs_of(node)[0]
        assert a is not None
        inputs[node.id] = a.name
    if not inputs:
        return {}
    run = graph_runner(graph, sorted(set(inputs.values())))
    total: dict[int, np.ndarray] = {}
    for feeds in samples:
        acts = run(feeds)
        for nid, name in inputs.items():
            x = np.asarray(acts[name], np.float32)
            x = x.reshape(-1, x.shape[-1])
            total[nid] = total.get(nid, 0.0) + (x.T @ x).astype(np.float64)  # float32 products per sample
    return total
