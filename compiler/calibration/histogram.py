"""Histograms for calibration: numpy's exact bin semantics, computed fast, and ORT's collectors.

**Bins.** For increasing float32 edges ``e_0 < ... < e_n`` the count of bin ``k`` is
``#{x : e_k <= x < e_{k+1}}``, the last bin also holding ``x = e_n``; values outside
``[e_0, e_n]`` (and NaN) are dropped. That is ``np.histogram(x, bins=edges)`` and also
``np.histogram(x, n, range=(e_0, e_n))`` when ``edges`` are that call's linspace edges.

**Fast exact binning.** With a float32 map ``f(x) ~ n (x - e_0) / (e_n - e_0)`` that is
monotone in ``x`` (every rounded step is) and ``d = max_k |f(e_k) - k|``, any ``x`` whose
fractional part ``frac(f(x))`` lies in ``(d, 1 - d)`` has ``f(e_k) < f(x) < f(e_{k+1})`` for
``k = floor(f(x))``, hence ``e_k < x < e_{k+1}``: its bin is ``k``. Only values near an edge
(about ``2 d`` of them, ``d ~ 1e-4`` for 2048 bins, plus exact zeros and clipped values,
which sit on edges) are compared with the edges. The counts are bit-identical to
``np.histogram``'s, at under half its cost.

**Collectors** (onnxruntime's ``HistogramCollector``, re-implemented):

* signed (``collect_value``): ``t = max(|min x|, |max x|)``; ``n`` bins on ``[-t, t]``.
  Merging a new sample with threshold ``t' > t`` (``merge_histogram``): with stride
  ``s = 2t/n`` and ``h = floor((t' - t) / s) + 1`` the range grows to ``T = t + h s``
  with ``n + 2h`` bins; the new sample is binned on the new range and the old counts
  are added at offset ``h``. When ``t' <= t`` the sample is binned on the old range.
* absolute (``collect_absolute_value``): ``n`` bins on ``[min |x|, max |x|]``; a later
  sample above the last edge appends bins of the same width (``arange``), and its values
  below the first edge are dropped.

Merging keeps the first sample's bin width, so a tiny first range followed by a large one
would need millions of bins; past ``MAX_STREAM_BINS`` Kiln raises instead (onnxruntime
would allocate them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "Histogram",
    "BinCounter",
    "as_float32",
    "finite_minmax",
    "abs_min",
    "uniform_edges",
    "bin_counts",
    "SignedStream",
    "AbsStream",
]

_BLOCK = 1 << 18  # values per block: keeps the temporaries in cache
MAX_STREAM_BINS = 1 << 22  # a merged histogram larger than this is refused (see _check_growth)


def _check_growth(bins: int) -> None:
    if bins > MAX_STREAM_BINS:
        raise ValueError(
            f"a merged calibration histogram would need {bins} bins: the first sample's "
            f"range was tiny next to a later one's; use two-pass (non-streaming) calibration"
        )


def as_float32(x: np.ndarray) -> np.ndarray:
    """``x`` flattened to a contiguous float32 vector (a view when it already is one)."""
    return np.ascontiguousarray(x, dtype=np.float32).reshape(-1)


def finite_minmax(x: np.ndarray) -> tuple[np.float32, np.float32]:
    """``(min x, max x)`` over the finite values, as float32; ``(0, 0)`` when there are none."""
    if x.size == 0:
        return np.float32(0), np.float32(0)
    lo, hi = x.min(), x.max()
    if not (np.isfinite(lo) and np.isfinite(hi)):
        keep = x[np.isfinite(x)]
        if keep.size == 0:
            return np.float32(0), np.float32(0)
        lo, hi = keep.min(), keep.max()
    return np.float32(lo), np.float32(hi)


def abs_min(x: np.ndarray, lo: np.float32, hi: np.float32) -> np.float32:
    """``min |x|`` over the finite values of ``x``, given its finite extremes ``lo, hi``."""
    if lo >= 0 or hi <= 0:
        return np.float32(lo if lo >= 0 else -hi)
    m = np.float32(np.inf)
    for start in range(0, x.size, _BLOCK):
        m = np.fmin(m, np.fmin.reduce(np.abs(x[start : start + _BLOCK])))
    return np.float32(m)


def uniform_edges(first: np.float32, last: np.float32, num_bins: int) -> np.ndarray:
    """The edges ``np.histogram(a, num_bins, range=(first, last))`` uses for float32 ``a``.

    An empty range ``first == last`` becomes ``[first - 0.5, last + 0.5]``, as in numpy.
    """
    first, last = np.float32(first), np.float32(last)
    if first == last:
        first, last = first - np.float32(0.5), last + np.float32(0.5)
    return np.linspace(first, last, num_bins + 1, endpoint=True, dtype=np.float32)


class BinCounter:
    """Counts float32 values into fixed increasing edges with ``np.histogram``'s semantics.

    The position map is ``f(x) = fl(fl(x a) + b)`` with ``a = fl(n / (e_n - e_0))`` and
    ``b = -fl(e_0 a)``: monotone, and ``f(e_0) = 0``. Near-edge values are re-placed by
    one step down or up against the true edges (``|f(e_k) - k| = d < 1/4`` guarantees the
    first guess is off by at most one bin); edges that stray further fall back to
    ``searchsorted`` for every value.

    Args:
        edges: ``n + 1`` increasing float32 edges.
    """

    def __init__(self, edges: np.ndarray) -> None:
        self.edges = np.asarray(edges, dtype=np.float32)
        self.n = self.edges.size - 1
        if self.n < 1 or np.any(self.edges[:-1] >= self.edges[1:]):
            raise ValueError("edges must be at least two strictly increasing values")
        self.counts = np.zeros(self.n, dtype=np.intp)
        self._first, self._last = self.edges[0], self.edges[-1]
        self._a = np.float32(self.n) / np.subtract(self._last, self._first)
        self._b = -(self._first * self._a)
        fe = self._position(self.edges).astype(np.float64)
        dev = float(np.max(np.abs(fe - np.arange(self.n + 1))))
        # Values with dev < frac(f) < 1 - dev are placed by floor(f); the float32 bounds
        # are rounded outwards so that the test is conservative.
        self._lo = np.nextafter(np.float32(dev), np.float32(np.inf))
        self._hi = np.nextafter(np.float32(1.0 - dev), np.float32(-np.inf))
        self._exact_all = dev >= 0.25
        # upper edge of each bin; the last bin is closed, so its upper edge never excludes
        self._upper = np.append(self.edges[1:-1], np.float32(np.inf))

    def _position(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        f = np.multiply(x, self._a, out=out)
        return np.add(f, self._b, out=f)

    def add(self, x: np.ndarray, *, absolute: bool = False) -> None:
        """Add the values (or with ``absolute`` the magnitudes) of the float32 vector ``x``.

        Values outside ``[e_0, e_n]`` and NaN are dropped.
        """
        for start in range(0, x.size, _BLOCK):
            block = x[start : start + _BLOCK]
            if absolute:
                block = np.abs(block)
            lo, hi = block.min(), block.max()
            if not (lo >= self._first and hi <= self._last):  # also true when x holds NaN
                block = block[(block >= self._first) & (block <= self._last)]
                if block.size == 0:
                    continue
            self._add_block(block)

    def _add_block(self, x: np.ndarray) -> None:
        if self._exact_all:
            b = np.searchsorted(self.edges, x, side="right") - 1
            self.counts += np.bincount(np.minimum(b, self.n - 1, out=b), minlength=self.n)
            return
        f = self._position(x)
        k = np.floor(f)
        frac = np.subtract(f, k, out=f)
        idx = k.astype(np.int32)
        near = np.flatnonzero((frac <= self._lo) | (frac >= self._hi))
        if near.size:
            b = np.minimum(idx[near], self.n - 1)
            xs = x[near]
            b -= xs < self.edges[b]
            b += xs >= self._upper[b]
            idx[near] = b
        self.counts += np.bincount(idx, minlength=self.n)


def bin_counts(x: np.ndarray, edges: np.ndarray, *, absolute: bool = False) -> np.ndarray:
    """``np.histogram(x, bins=edges)[0]`` (of ``|x|`` with ``absolute``) for float32 ``x``."""
    counter = BinCounter(edges)
    counter.add(as_float32(x), absolute=absolute)
    return counter.counts


@dataclass
class Histogram:
    """onnxruntime's per-tensor histogram record: counts, edges and the raw data extremes.

    Attributes:
        hist: ``n`` int counts.
        edges: ``n + 1`` float32 edges.
        min: ``nanmin`` of the raw (signed) data seen.
        max: ``nanmax`` of the raw (signed) data seen.
    """

    hist: np.ndarray
    edges: np.ndarray
    min: np.float32
    max: np.float32


class SignedStream:
    """onnxruntime's ``collect_value`` + ``merge_histogram``, fed one sample at a time.

    Args:
        num_bins: Bins of the first histogram.
    """

    def __init__(self, num_bins: int) -> None:
        self.num_bins = num_bins
        self.histogram: Histogram | None = None
        self._threshold = np.float32(0)

    def add(self, x: np.ndarray) -> None:
        """Merge the float32 vector ``x`` (one sample) into the histogram."""
        lo, hi = finite_minmax(x)
        t = np.float32(max(abs(lo), abs(hi)))
        h = self.histogram
        if h is None:
            edges = uniform_edges(-t, t, self.num_bins)
            self.histogram = Histogram(bin_counts(x, edges), edges, lo, hi)
            self._threshold = t
            return
        old_t = self._threshold
        if t <= old_t:
            h.hist = h.hist + bin_counts(x, h.edges)
        elif old_t == 0:
            edges = uniform_edges(-t, t, h.hist.size)
            h.hist, h.edges, self._threshold = bin_counts(x, edges) + h.hist, edges, t
        else:
            n_old = h.hist.size
            stride = np.float32(2) * old_t / np.float32(n_old)
            half = int((t - old_t) // stride + np.float32(1))
            _check_growth(n_old + 2 * half)
            new_t = np.float32(half) * stride + old_t
            edges = uniform_edges(-new_t, new_t, n_old + 2 * half)
            hist = bin_counts(x, edges)
            hist[half : half + n_old] += h.hist
            h.hist, h.edges, self._threshold = hist, edges, new_t
        h.min, h.max = min(h.min, lo), max(h.max, hi)


class AbsStream:
    """onnxruntime's ``collect_absolute_value``, fed one sample at a time.

    Args:
        num_bins: Bins of the first histogram.
    """

    def __init__(self, num_bins: int) -> None:
        self.num_bins = num_bins
        self.histogram: Histogram | None = None

    def add(self, x: np.ndarray) -> None:
        """Merge ``|x|`` of the float32 vector ``x`` (one sample) into the histogram."""
        lo, hi = finite_minmax(x)
        amax = np.float32(max(abs(lo), abs(hi)))
        h = self.histogram
        if h is None:
            edges = uniform_edges(abs_min(x, lo, hi), amax, self.num_bins)
            self.histogram = Histogram(bin_counts(x, edges, absolute=True), edges, lo, hi)
            return
        edges = h.edges
        if amax > edges[-1]:
            width = edges[1] - edges[0]
            _check_growth(edges.size + int((amax - edges[-1]) / width))
            extra = np.arange(edges[-1] + width, amax + width, width)
            edges = np.hstack((edges, extra)).astype(np.float32)
        hist = bin_counts(x, edges, absolute=True)
        hist[: h.hist.size] += h.hist
        h.hist, h.edges = hist, edges
        h.min, h.max = min(h.min, lo), max(h.max, hi)
