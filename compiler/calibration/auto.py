"""``--calib-method auto``: per tensor, the method whose range quantizes the calibration data best.

Three passes over the same samples:

1. the extremes ``lo = min X``, ``hi = max X`` (the minmax candidate), which fix the grid;
2. a signed histogram of ``n`` (default 4096) bins on ``[-a, a]``, ``a = max(|lo|, |hi|)``,
   and the count of exact zeros; folding it about 0 gives ``n / 2`` bins of ``|x|`` on
   ``[0, a]``. From these the candidate ranges are computed, for each quantizer form
   (asymmetric uint8 / symmetric int8):

   * **minmax** ``[lo, hi]``;
   * **percentile** ``[max(lo, -t), min(hi, t)]``, ``t`` the left edge of the ``|x|`` bin where
     the CDF reaches ``P / 100`` (``P = 99.999``);
   * **entropy** the KL search of :mod:`compiler.calibration.entropy` on the folded histogram;
   * **mse** :func:`~compiler.calibration.thresholds.mse_range` on the signed histogram;

3. each distinct candidate's quantizer ``(s, z)`` (:func:`quantizer_range`, then
   :func:`compute_scale_zero_point`) fake-quantizes every value of every sample, and the
   observer sums the squared error ``sum (s (clip(round(x / s) + z) - z) - x)^2``.

**Criterion.** The candidate of least *measured* squared error of the tensor itself on the
calibration samples wins, for the quantizer form asked for; within 0.1% of the least the
widest range wins (it clips less of unseen data). :meth:`AutoObserver.choice` names the
winning method (the quantization report counts them).
"""

from __future__ import annotations

import numpy as np

from compiler.calibration.entropy import kl_range
from compiler.calibration.histogram import BinCounter, Histogram, finite_minmax, uniform_edges
from compiler.calibration.methods import CalibMethod
from compiler.calibration.observers import Observer, quantizer_range
from compiler.calibration.qparams import compute_scale_zero_point
from compiler.calibration.thresholds import mse_range

__all__ = ["AutoObserver", "CANDIDATES", "AUTO_TOLERANCE"]

CANDIDATES = ("minmax", "percentile", "entropy", "mse")
AUTO_TOLERANCE = 1e-3  # relative slack in favour of wider ranges
_BLOCK = 1 << 18


def _levels(symmetric: bool, bits: int) -> tuple[int, int]:
    half = 2 ** (bits - 1) - 1
    return (-half, half) if symmetric else (0, 2**bits - 1)


class _Candidate:
    """One candidate range and its quantizer, with the squared error summed so far."""

    def __init__(self, name: str, lo: np.float32, hi: np.float32, symmetric: bool, bits: int) -> None:
        self.names = [name]
        self.calibrated = (lo, hi)
        self.qmin, self.qmax = _levels(symmetric, bits)
        rmin, rmax = quantizer_range(float(lo), float(hi), symmetric=symmetric, bits=bits)
        scale, zp = compute_scale_zero_point(rmin, rmax, self.qmin, self.qmax, symmetric=symmetric)
        self.scale, self.zero = np.float32(scale), np.float32(zp)
        self.width = rmax - rmin
        self.error = 0.0

    def add(self, x: np.ndarray) -> None:
        for start in range(0, x.size, _BLOCK):
            block = x[start : start + _BLOCK]
            q = np.round(block / self.scale) + self.zero
            np.clip(q, self.qmin, self.qmax, out=q)
            q -= self.zero
            q *= self.scale
            q -= block
            self.error += float(np.dot(q, q))


class AutoObserver(Observer):
    """Minmax, percentile, entropy and mse ranges, scored on the samples (three passes)."""

    def __init__(self, method: CalibMethod) -> None:
        if method.name != "auto":
            raise ValueError(f"AutoObserver needs method auto, got {method.name}")
        super().__init__(method)
        self._lo = self._hi = np.float32(np.nan)
        self._counter: BinCounter | None = None
        self._zeros = 0
        self._candidates: dict[bool, list[_Candidate]] = {}

    def _observe(self, x: np.ndarray) -> None:
        if self._pass == 0:
            if x.size:
                lo, hi = finite_minmax(x)
                self._lo, self._hi = np.fmin(self._lo, lo), np.fmax(self._hi, hi)
        elif self._pass == 1:
            assert self._counter is not None
            self._zeros += int(np.count_nonzero(x == 0))
            self._counter.add(x)
        else:
            x = x[np.isfinite(x)] if not np.isfinite(x).all() else x
            for cands in self._candidates.values():
                for c in cands:
                    c.add(x)

    def _start_pass(self) -> None:
        if self._pass == 1:
            if np.isnan(self._lo):
                self._lo = self._hi = np.float32(0)
            a = np.float32(max(abs(self._lo), abs(self._hi)))
            self._counter = BinCounter(uniform_edges(-a, a, self.method.bins))
            return
        for symmetric in (False, True):
            cands: list[_Candidate] = []
            for name, (lo, hi) in self._ranges(symmetric).items():
                c = _Candidate(name, lo, hi, symmetric, self.method.bits)
                same = next((d for d in cands if (d.scale, d.zero) == (c.scale, c.zero)), None)
                if same is None:
                    cands.append(c)
                else:
                    same.names.append(name)
            self._candidates[symmetric] = cands

    def _ranges(self, symmetric: bool) -> dict[str, tuple[np.float32, np.float32]]:
        assert self._counter is not None
        lo, hi, m = self._lo, self._hi, self.method
        counts, edges = self._counter.counts, self._counter.edges
        half = counts.size // 2
        mag = counts[half:].copy()
        mag[: counts.size - half] += counts[:half][::-1][: mag.size]
        mag[0] = max(int(mag[0]) - self._zeros, 0)
        mag_edges = edges[half:] - edges[half]
        out: dict[str, tuple[np.float32, np.float32]] = {"minmax": (lo, hi)}
        total = mag.sum()
        if total:
            k = int(np.searchsorted(np.cumsum(mag) / total, m.percentile / 100.0))
            t = np.float32(mag_edges[min(k, mag.size)])
            out["percentile"] = (lo if lo > -t else -t), (hi if hi < t else t)
            out["entropy"] = kl_range(mag, mag_edges, lo, hi, symmetric=symmetric, bits=m.bits)
        hist = Histogram(counts, edges, lo, hi)
        out["mse"] = mse_range(hist, self._zeros, symmetric=symmetric, bits=m.bits)
        return out

    def _best(self, symmetric: bool) -> _Candidate:
        cands = self._candidates[symmetric]
        least = min(c.error for c in cands)
        ok = [c for c in cands if c.error <= least * (1.0 + AUTO_TOLERANCE)]
        return max(ok, key=lambda c: c.width)

    def choice(self, *, symmetric: bool) -> str:
        """The method whose range won (the first name when several gave the same quantizer)."""
        return self._best(symmetric).names[0]

    def errors(self, *, symmetric: bool) -> dict[str, float]:
        """Measured squared error of each candidate method on the calibration samples."""
        return {n: c.error for c in self._candidates[symmetric] for n in c.names}

    def _calibrated(self, symmetric: bool) -> tuple[np.float32, np.float32]:
        return self._best(symmetric).calibrated
