"""GridSample (opset 20 form): sample X[n, c] at the normalized points of ``grid``.

For a spatial axis of length L, a grid value g in [-1, 1] maps to the pixel
coordinate x = (g + 1)/2 · (L - 1) with ``align_corners`` and ((g + 1) · L - 1)/2
without (grid[..., 0] indexes the last axis). A coordinate outside
[lo, hi] = [0, L-1] (aligned) or [-1/2, L-1/2] is clamped to [0, L-1] (``border``)
or mirrored into [lo, hi] (``reflection``) -- except for ``cubic``, which pads its
taps only; ``zeros`` reads 0 outside the tensor. Coordinates and weights are
computed in the grid's dtype (as onnxruntime), the weighted sum in float64.
``nearest`` rounds half to even; ``linear`` weighs the 2 neighbours of each axis by
1 - |x - x_i|; ``cubic`` the 4 neighbours by Keys' kernel with a = -0.75. Taps
outside the tensor are read under the same padding rule.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from compiler.ir.types import TensorType
from compiler.ops.inputs import arg, first
from compiler.ops.registry import InferContext, Layout, OpDef, register
from compiler.ops.shapes import merge_dim

__all__ = ["GridSampleAttrs", "MODES", "PADDING_MODES"]

MODES = ("linear", "nearest", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")
_CUBIC_A = -0.75


@dataclass(frozen=True)
class GridSampleAttrs:
    """GridSample: interpolation ``mode``, ``padding_mode`` and ``align_corners``."""

    align_corners: int = 0
    mode: str = "linear"
    padding_mode: str = "zeros"


def _infer(ctx: InferContext) -> list[TensorType]:
    a: GridSampleAttrs = ctx.attrs
    if a.mode not in MODES or a.padding_mode not in PADDING_MODES:
        raise ctx.fail(f"mode {a.mode!r} / padding_mode {a.padding_mode!r} not in {MODES} / {PADDING_MODES}")
    t, tg = ctx.type(0), ctx.type(1)
    if not t.dtype.is_float or not tg.dtype.is_float:
        raise ctx.fail("X and grid must be float")
    if t.shape is None or tg.shape is None:
        return [t.with_shape(None)]
    k = len(t.shape) - 2
    last = tg.shape[-1]
    if k < 1 or len(tg.shape) != k + 2 or (isinstance(last, int) and last != k):
        raise ctx.fail(f"grid {tg.shape} does not fit X {t.shape}: expected (N, *out, {k})")
    n = merge_dim(t.shape[0], tg.shape[0])
    if n is None:
        raise ctx.fail(f"batch sizes differ: X {t.shape[0]} vs grid {tg.shape[0]}")
    return [t.with_shape((n, t.shape[1], *tg.shape[1:-1]))]


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Mirror x into [lo, hi] by the nearer border, repeatedly."""
    rng = hi - lo
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, x - hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        turns = np.floor(dx / rng) if rng > 0 else np.zeros_like(dx)
    r = dx - turns * rng
    even = turns % 2 == 0
    return np.where(below, np.where(even, lo + r, hi - r), np.where(above, np.where(even, hi - r, lo + r), x))


def _cubic(t: np.ndarray) -> list[np.ndarray]:
    """Keys' weights of the taps at offsets -1, 0, 1, 2 for a fraction t in [0, 1)."""
    a = _CUBIC_A

    def near(s: np.ndarray) -> np.ndarray:
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s: np.ndarray) -> np.ndarray:
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _taps(x: np.ndarray, length: int, a: GridSampleAttrs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Tap indices (already under the padding rule; -1 = read 0) and weights along one axis."""
    lo, hi = (0.0, length - 1.0) if a.align_corners else (-0.5, length - 0.5)
    if a.mode == "nearest":
        x = np.rint(x)
    out = (x < lo) | (x > hi)
    if a.mode == "cubic":
        pass  # cubic pads only its taps (as PyTorch and onnxruntime)
    elif a.padding_mode == "border":
        x = np.where(out, np.clip(x, 0, length - 1), x)
    elif a.padding_mode == "reflection":
        x = np.where(out, _reflect(x, lo, hi), x)
    if a.mode == "nearest":
        idx, weights = [x.astype(np.int64)], [np.ones_like(x)]
    else:
        x0 = np.floor(x)
        t = x - x0
        base = x0.astype(np.int64)
        if a.mode == "linear":
            idx, weights = [base, base + 1], [1 - t, t]
        else:
            idx, weights = [base - 1, base, base + 1, base + 2], _cubic(t)
    fixed = []
    for i in idx:
        if a.padding_mode == "zeros":
            fixed.append(np.where((i >= 0) & (i < length), i, -1))
        elif a.padding_mode == "border":
            fixed.append(np.clip(i, 0, length - 1))
        else:
            fixed.append(_reflect(i.astype(np.float64), lo, hi).astype(np.int64))
    return fixed, weights


def _ref(ins: list[np.ndarray | None], a: GridSampleAttrs, n: int) -> list[np.ndarray]:
    x, grid = first(ins), np.asarray(arg(ins, 1))
    if a.mode not in MODES or a.padding_mode not in PADDING_MODES:
        raise ValueError(f"mode {a.mode!r} / padding_mode {a.padding_mode!r} is not supported")
    spatial = x.shape[2:]
    k = len(spatial)
    per_axis = []
    for d, length in enumerate(spatial):
        g = grid[..., k - 1 - d]
        one, two, n = g.dtype.type(1), g.dtype.type(2), g.dtype.type(length)
        pos = (g + one) / two * (n - one) if a.align_corners else ((g + one) * n - one) / two
        per_axis.append(_taps(pos, length, a))
    xf = x.astype(np.float64)
    batch = np.arange(x.shape[0]).reshape((-1,) + (1,) * (grid.ndim - 2))
    acc = np.zeros((*grid.shape[:-1], x.shape[1]), dtype=np.float64)
    for combo in itertools.product(*(range(len(w)) for _, w in per_axis)):
        weight = np.ones(grid.shape[:-1])
        valid = np.ones(grid.shape[:-1], dtype=bool)
        index = []
        for (idx, w), j in zip(per_axis, combo, strict=True):
            weight = weight * w[j]
            valid &= idx[j] >= 0
            index.append(np.maximum(idx[j], 0))
        vals = xf[(batch, slice(None), *index)]  # advanced dims first: (N, *out, C)
        acc += np.where(valid, weight, 0.0)[..., None] * vals
    return [np.moveaxis(acc, -1, 1).astype(x.dtype)]


register(
    OpDef(
        "GridSample",
        _infer,
        _ref,
        GridSampleAttrs,
        inputs=(2, 2),
        layout=Layout.FIXED,
        doc="y[n, c, p..] = interpolation of X[n, c] at the denormalized grid[n, p..] (linear/nearest/cubic)",
    )
)
