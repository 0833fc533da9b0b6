"""Kiln's ``entropy`` calibration: TensorRT's KL-divergence threshold search on a fine histogram.

**Histogram.** A first pass records ``lo = min X``, ``hi = max X`` and fixes the grid: ``n``
(default 2048) bins of ``|x|`` on ``[0, a]``, ``a = max(|lo|, |hi|)``. The second pass counts
every value into it, so the result depends only on the multiset of values, never on their
order or on how they are split into samples or batches. Exact zeros are taken out of bin 0:
zero is always on the quantizer's grid, and a post-ReLU spike at 0 would otherwise dominate ``P``.

**Levels.** ``L`` is the number of quantizer levels the kept magnitudes ``[0, t]`` get:

* one-sided tensors (``lo >= 0``, post-ReLU/sigmoid, or ``hi <= 0``) under the asymmetric
  (uint8) quantizer: ``L = 256``, the whole grid spans ``[0, t]`` (or ``[-t, 0]``);
* signed tensors, and any tensor under the symmetric (int8) quantizer: the symmetric form,
  ``L = 128`` levels for ``[0, t]`` (TensorRT's choice).

**Search.** For each candidate ``i = L .. n`` (threshold ``t_i = e_i``), ``P`` is the first
``i`` bins with the outliers ``O_i = sum_{k >= i} h_k`` added to bin ``i - 1`` (clipping).
``Q`` merges the first ``i`` bins *without* the outliers into ``L`` groups (group ``j``
holds bins ``[floor(j i / L), floor((j + 1) i / L))``) and spreads each group's mass ``M_j``
evenly over the group's ``Z_j`` bins where ``P != 0``: the quantized, unclipped
distribution. Both are normalised (``N = sum h``, ``K_i = N - O_i``); with ``M'_j`` the
group's ``P`` mass (``M_j``, plus ``O_i`` for the last group)::

    KL(P || Q) = (1/N) [ sum_k P_k log P_k  -  sum_j M'_j log(M_j / Z_j) ]  +  log(K_i / N)

which prefix sums give in ``O(L)`` per candidate, all candidates at once. A wide threshold
pays through coarse groups, a tight one through the outlier mass piled on the last bin.
A candidate whose last group holds only outliers (``Q = 0 < P``) has ``KL = inf``.

**Clipping budget.** ``KL`` weighs the clipped mass but not how far it lies: a few values
at ten times the threshold cost it almost nothing, while their output error is large (a
classifier head fed such a range lost 13 dB of SQNR). A candidate competes only if its
clipping error ``sum_{x > t} (x - t)^2`` (from bin centres) is at most its rounding noise
``K_i D^2 / 12`` with ``D = t / (L - 1)``; the full range always competes. The least ``KL``
among those wins (ties: the widest); the range is ``[max(lo, -t), min(hi, t)]``.

**Saturation bounds.** An extreme taken by ``ATOM_COUNT`` or more values exactly (hard-sigmoid's
1, ReLU6's 6, a Clip's bound) is an atom of the distribution, not a tail: the values there
are the activation's saturated outputs (an SE gate fully open), and clipping them shifts
every one. Such an extreme is kept; the search clips only the other side.

**Output check.** A histogram cannot tell which tail values carry an output's signal (a
detector's objectness map is a few face values among thousands). So when a compile calibrates
with ``entropy``, each KL-clipped range is then checked against the full range ``[lo, hi]``
(:meth:`EntropyObserver.full_range`) by the measured output error on the calibration samples,
and kept only where it lowers no output's SQNR, on all samples and with any one left out
(:mod:`compiler.quant.clip_check`; the manifest's ``calibration.entropy_check`` lists the
tensors put back to full range and why). The observer itself returns the KL range.
"""

from __future__ import annotations

import numpy as np

from compiler.calibration.histogram import BinCounter, finite_minmax, uniform_edges
from compiler.calibration.methods import CalibMethod
from compiler.calibration.observers import Observer, quantizer_range

__all__ = ["kl_divergences", "kl_threshold_index", "kl_range", "levels_for", "EntropyObserver"]

_CHUNK = 256  # candidates per block: bounds the (candidates x levels) temporaries
ATOM_COUNT = 2  # values exactly at an extreme that make it a saturation bound, never clipped


def _xlogx(v: np.ndarray) -> np.ndarray:
    res = np.zeros(np.shape(v), dtype=np.float64)
    pos = v > 0
    res[pos] = v[pos] * np.log(v[pos])
    return res


def kl_divergences(counts: np.ndarray, levels: int, candidates: np.ndarray | None = None) -> np.ndarray:
    """``KL(P_i || Q_i)`` for every candidate ``i = levels .. n`` (index ``i - levels``).

    Args:
        counts: ``n >= levels`` non-negative bin counts of ``|x|`` on ``[0, a]``, not all zero.
        levels: Quantizer levels ``L`` for the kept range.
        candidates: Only these ``i`` (ascending; default all); the result then has their length.
    """
    h = np.asarray(counts, dtype=np.float64)
    n = h.size
    if n < levels:
        raise ValueError(f"the KL search needs at least {levels} bins, got {n}")
    total = h.sum()
    cum = np.concatenate(([0.0], np.cumsum(h)))
    nonzero = np.concatenate(([0], np.cumsum(h > 0)))
    plogp = np.concatenate(([0.0], np.cumsum(_xlogx(h))))
    every = np.arange(levels, n + 1, dtype=np.int64) if candidates is None else np.asarray(candidates)
    kls = np.empty(every.size)
    j = np.arange(levels + 1, dtype=np.int64)
    for start in range(0, every.size, _CHUNK):
        i = every[start : start + _CHUNK]
        kept = cum[i]
        outliers = total - kept
        sum_plogp = plogp[i - 1] + _xlogx(h[i - 1] + outliers)
        b = (j[None, :] * i[:, None]) // levels
        mass = cum[b[:, 1:]] - cum[b[:, :-1]]  # Q's group masses: the kept values only
        nz = (nonzero[b[:, 1:]] - nonzero[b[:, :-1]]).astype(np.float64)
        nz[:, -1] += (h[i - 1] == 0) & (outliers > 0)
        pmass = mass.copy()
        pmass[:, -1] += outliers  # P's group masses
        with np.errstate(divide="ignore", invalid="ignore"):
            cross = np.where(pmass > 0, pmass * np.log(mass / np.maximum(nz, 1.0)), 0.0)
            kl = (sum_plogp - cross.sum(axis=1)) / total + np.log(kept / total)
        kls[start : start + i.size] = np.where(np.isfinite(kl), np.maximum(kl, 0.0), np.inf)
    return kls


def clipping_allowed(counts: np.ndarray, levels: int) -> np.ndarray:
    """Per candidate ``i = levels .. n``: is its clipping error within its rounding noise?

    With bin centres ``c_k`` (edges ``k``, in bin units), ``t = i`` and step ``D = t / (L - 1)``::

        sum_{k >= i} h_k (c_k - t)^2  <=  (sum_{k < i} h_k) D^2 / 12
    """
    h = np.asarray(counts, dtype=np.float64)
    n = h.size
    c = np.arange(n) + 0.5
    pre = [np.concatenate(([0.0], np.cumsum(v))) for v in (h, h * c, h * c * c)]
    i = np.arange(levels, n + 1)
    s0, s1, s2 = (p[n] - p[i] for p in pre)
    t = i.astype(np.float64)
    clip = s2 - 2.0 * t * s1 + t * t * s0
    step = t / (levels - 1)
    return np.asarray(clip <= pre[0][i] * step * step / 12.0)


def kl_threshold_index(counts: np.ndarray, levels: int) -> int:
    """The number of bins ``i`` the KL search keeps (``levels <= i <= n``; ties: the largest).

    Only candidates whose clipping error is within their rounding noise
    (:func:`clipping_allowed`) compete; ``i = n`` always does.
    """
    allowed = clipping_allowed(counts, levels)
    allowed[-1] = True
    cand = np.flatnonzero(allowed) + levels
    kl = kl_divergences(counts, levels, cand)
    kl[-1] = min(kl[-1], np.finfo(np.float64).max)
    best = kl.min()
    return int(cand[np.flatnonzero(kl <= best + 1e-12 * max(abs(best), 1.0))[-1]])


def levels_for(lo: float, hi: float, *, symmetric: bool, bits: int = 8) -> int:
    """Quantizer levels of the kept magnitudes: ``2^bits`` one-sided asymmetric, else ``2^(bits-1)``."""
    one_sided = lo >= 0 or hi <= 0
    return int(2**bits if one_sided and not symmetric else 2 ** (bits - 1))


def kl_range(
    counts: np.ndarray, edges: np.ndarray, lo: np.float32, hi: np.float32, *, symmetric: bool, bits: int = 8
) -> tuple[np.float32, np.float32]:
    """The KL range from a ``|x|`` histogram on ``[0, a]`` (zeros taken out), clipped to ``[lo, hi]``."""
    if lo == hi or counts.sum() == 0:
        return lo, hi
    i = kl_threshold_index(counts, levels_for(float(lo), float(hi), symmetric=symmetric, bits=bits))
    t = np.float32(edges[i])
    return (lo if lo > -t else -t), (hi if hi < t else t)


class EntropyObserver(Observer):
    """Kiln's ``entropy``: two passes (extremes, then a fixed ``|x|`` grid), then the KL search."""

    def __init__(self, method: CalibMethod) -> None:
        if method.name != "entropy":
            raise ValueError(f"EntropyObserver needs method entropy, got {method.name}")
        super().__init__(method)
        self._lo = self._hi = np.float32(np.nan)
        self._counter: BinCounter | None = None
        self._zeros = 0
        self._atoms = [0, 0]  # values exactly at lo, at hi (second pass)

    def _observe(self, x: np.ndarray) -> None:
        if self._pass == 0:
            if x.size:
                lo, hi = finite_minmax(x)
                self._lo, self._hi = np.fmin(self._lo, lo), np.fmax(self._hi, hi)
            return
        assert self._counter is not None
        self._zeros += int(np.count_nonzero(x == 0))
        self._atoms[0] += int(np.count_nonzero(x == self._lo))
        self._atoms[1] += int(np.count_nonzero(x == self._hi))
        self._counter.add(x, absolute=True)

    def _start_pass(self) -> None:
        if np.isnan(self._lo):
            self._lo = self._hi = np.float32(0)
        a = np.float32(max(abs(self._lo), abs(self._hi)))
        self._counter = BinCounter(uniform_edges(np.float32(0), a, self.method.bins))

    def magnitude_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, edges)`` of ``|x|`` on ``[0, a]`` with the exact zeros taken out."""
        if self._counter is None:
            raise RuntimeError("EntropyObserver: the second pass has not started")
        counts = self._counter.counts.copy()
        counts[0] = max(int(counts[0]) - self._zeros, 0)
        return counts, self._counter.edges

    def saturated(self) -> tuple[bool, bool]:
        """Whether ``lo`` / ``hi`` are atoms: taken by at least ``ATOM_COUNT`` values (a clamp's bound)."""
        return self._lo != 0 and self._atoms[0] >= ATOM_COUNT, self._hi != 0 and self._atoms[1] >= ATOM_COUNT

    def full_range(self, *, symmetric: bool) -> tuple[float, float]:
        """The quantizer range of the extremes ``[lo, hi]`` (minmax's): what a clip is checked against."""
        self.calibrated_range(symmetric=symmetric)  # the same checks that every pass saw the data
        return quantizer_range(float(self._lo), float(self._hi), symmetric=symmetric, bits=self.method.bits)

    def _calibrated(self, symmetric: bool) -> tuple[np.float32, np.float32]:
        counts, edges = self.magnitude_histogram()
        lo, hi = kl_range(counts, edges, self._lo, self._hi, symmetric=symmetric, bits=self.method.bits)
        keep_lo, keep_hi = self.saturated()
        return (self._lo if keep_lo else lo), (self._hi if keep_hi else hi)
