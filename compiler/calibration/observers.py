"""Per-tensor calibration observers: fed one sample's array at a time, they return a float range.

Let ``x_s`` be the values of the tensor in sample ``s`` and ``X`` all of them. Each
observer first computes onnxruntime's *calibrated range* ``[lo, hi]`` (its ``TensorData``
``lowest, highest``), then :meth:`Observer.range` turns it into the range the quantizer
represents.

* **minmax**: ``[min X, max X]``. With ``moving_average``: ``[mean_s min x_s, mean_s max x_s]``
  (streaming: ``m <- m + c (m_s - m)``). With ``symmetric_range``: ``[-a, a]``, ``a = max|X|``.
* **percentile** (P, default 99.999; 2048 bins): onnxruntime's default calibrator option is
  symmetric, so the histogram is of ``|X|`` on ``[min|X|, max|X|]`` and the range is
  ``[-t, t]`` clipped to ``[min X, max X]``, ``t`` the left edge of the bin where the CDF of
  ``|X|`` reaches ``P/100``. Non-symmetric: signed histogram on ``[-a, a]``, cutting
  ``(100 - P)/2`` percent off each side.
* **entropy-ort** (128 bins, 128 quantized bins): signed histogram on ``[-a, a]``, threshold
  minimising ``KL(P || Q)`` (see :func:`~compiler.calibration.thresholds.entropy_range`).
  With these defaults there is a single candidate and the range is exactly ``[min X, max X]``.
  Kiln's own **entropy** (a real KL search on 2048 bins of ``|x|``) is
  :class:`~compiler.calibration.entropy.EntropyObserver`; **auto** is
  :class:`~compiler.calibration.auto.AutoObserver`.
* **mse** (Kiln; 2048 bins): signed histogram on ``[-a, a]``, range minimising the expected
  squared quantisation error (see :func:`~compiler.calibration.thresholds.mse_range`).

**Passes.** onnxruntime's ``quantize_static`` histograms all samples at once, on a grid
fixed by the global ``a = max|X|`` (or ``[min|X|, max|X|]``). A histogram observer
therefore takes two passes over the same samples (``passes == 2``): the first records
``min X, max X`` (and ``min |X|``), :meth:`Observer.next_pass` fixes the grid, the second
bins every value; the result equals ``quantize_static``'s bit for bit. With
``CalibMethod(streaming=True)`` one pass suffices and the observer equals onnxruntime's
calibrator fed one sample per ``collect_data`` call (histograms merged as the range grows).

**Quantizer range.** ``range(symmetric=False)`` is ``[min(lo, 0), max(hi, 0)]`` (0 must be
exact); ``range(symmetric=True)`` is ``[-m, m]``, ``m = max(|lo|, |hi|)`` (for mse the
search itself is then symmetric). A range whose step ``(rmax - rmin) / S`` would be below
float32's smallest normal (an all-zero tensor) is widened to a unit step:
``[0, 2^bits - 1]`` asymmetric, ``[-(2^(bits-1) - 1), 2^(bits-1) - 1]`` symmetric, which gives
onnxruntime's fallback ``scale = 1`` for uint8-asymmetric and int8-symmetric types; a constant
tensor ``c != 0`` already has width ``|c|``. Values are float32 numbers returned as floats.
Non-finite values are ignored. Float16/float64 inputs are observed as float32.
"""

from __future__ import annotations

import abc

import numpy as np

from compiler.calibration.histogram import (
    AbsStream,
    BinCounter,
    Histogram,
    SignedStream,
    abs_min,
    as_float32,
    finite_minmax,
    uniform_edges,
)
from compiler.calibration.methods import CalibMethod
from compiler.calibration.thresholds import entropy_range, mse_range, percentile_range

__all__ = [
    "Observer",
    "MinMaxObserver",
    "HistogramObserver",
    "make_observer",
    "channel_minmax",
    "quantizer_range",
]


def quantizer_range(lo: float, hi: float, *, symmetric: bool, bits: int = 8) -> tuple[float, float]:
    """The range the quantizer represents: 0 included, symmetrised, never of zero step."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if symmetric:
        hi = max(-lo, hi)
        lo = -hi
    steps = 2**bits - 2 if symmetric else 2**bits - 1
    if not (hi - lo) / steps >= float(np.finfo(np.float32).tiny):
        half = 2 ** (bits - 1) - 1
        return (-float(half), float(half)) if symmetric else (0.0, float(steps))
    return lo, hi


class Observer(abc.ABC):
    """Collects one tensor's values over the calibration samples.

    Feed every sample with :meth:`update`; an observer with ``passes == 2`` needs the same
    samples, in the same order, again after :meth:`next_pass` (a one-pass observer must not
    be fed twice). Then read :meth:`range`. The second pass checks that it saw as many
    arrays and values as the first.

    Args:
        method: The calibration method and its options.
    """

    passes: int = 1

    def __init__(self, method: CalibMethod) -> None:
        self.method = method
        self.passes = method.passes
        self._pass = 0
        self._seen = [0] * self.passes  # arrays fed in each pass
        self._sizes = [0] * self.passes  # values fed in each pass

    def update(self, x: np.ndarray) -> None:
        """Observe one sample's array (any shape; NaN and infinities are ignored)."""
        v = as_float32(np.asarray(x))
        self._seen[self._pass] += 1
        self._sizes[self._pass] += v.size
        self._observe(v)

    def next_pass(self) -> None:
        """Start the next pass over the same samples.

        Raises:
            RuntimeError: This observer has no further pass, or saw no data.
        """
        if self._pass + 1 >= self.passes:
            raise RuntimeError(
                f"{type(self).__name__} takes {self.passes} pass(es); next_pass() called too often"
            )
        if not self._seen[self._pass]:
            raise RuntimeError(f"{type(self).__name__}: next_pass() before any update()")
        self._pass += 1
        self._start_pass()

    def calibrated_range(self, *, symmetric: bool = False) -> tuple[float, float]:
        """onnxruntime's calibrated ``(lowest, highest)`` (``symmetric`` only matters for mse).

        Raises:
            RuntimeError: Data is missing: no update, a pass not run, or passes that differ.
        """
        if self._pass != self.passes - 1:
            raise RuntimeError(
                f"{type(self).__name__} needs {self.passes} passes over the data; "
                f"call next_pass() and feed the samples again"
            )
        if not self._seen[0]:
            raise RuntimeError(f"{type(self).__name__}: no data observed")
        if self._seen[-1] != self._seen[0] or self._sizes[-1] != self._sizes[0]:
            raise RuntimeError(
                f"{type(self).__name__}: the passes saw different data "
                f"({self._seen[0]} arrays of {self._sizes[0]} values, then "
                f"{self._seen[-1]} of {self._sizes[-1]})"
            )
        lo, hi = self._calibrated(symmetric)
        return float(lo), float(hi)

    def range(self, *, symmetric: bool) -> tuple[float, float]:
        """The ``(rmin, rmax)`` the quantizer should represent (see the module docstring).

        Args:
            symmetric: The quantizer is symmetric (int8 with zero point 0).
        """
        lo, hi = self.calibrated_range(symmetric=symmetric)
        return quantizer_range(lo, hi, symmetric=symmetric, bits=self.method.bits)

    def _start_pass(self) -> None:  # noqa: B027 - optional hook
        """Prepare the next pass (two-pass observers)."""

    @abc.abstractmethod
    def _observe(self, x: np.ndarray) -> None:
        """Take one sample's float32 values."""

    @abc.abstractmethod
    def _calibrated(self, symmetric: bool) -> tuple[np.float32, np.float32]:
        """The calibrated range from everything observed."""


class MinMaxObserver(Observer):
    """onnxruntime's ``MinMaxCalibrater``: extremes, or their (moving) average."""

    def __init__(self, method: CalibMethod) -> None:
        super().__init__(method)
        self._mins: list[np.float32] = []
        self._maxs: list[np.float32] = []
        self._ema: tuple[np.ndarray, np.ndarray] | None = None

    def _observe(self, x: np.ndarray) -> None:
        lo, hi = finite_minmax(x)
        m = self.method
        if not m.streaming:
            self._mins.append(lo)
            self._maxs.append(hi)
            return
        new = (np.array([lo]), np.array([hi]))
        if m.calib_symmetric:
            a = np.maximum(np.abs(new[0]), np.abs(new[1]))
            new = (-a, a)
        if self._ema is None:
            self._ema = new
        elif m.moving_average:
            c, (old_lo, old_hi) = m.averaging_constant, self._ema
            self._ema = (old_lo + c * (new[0] - old_lo), old_hi + c * (new[1] - old_hi))
        else:
            self._ema = (np.minimum(self._ema[0], new[0]), np.maximum(self._ema[1], new[1]))

    def _calibrated(self, symmetric: bool) -> tuple[np.float32, np.float32]:
        if self._ema is not None:
            return np.float32(self._ema[0][0]), np.float32(self._ema[1][0])
        mins = np.array(self._mins, dtype=np.float32).reshape(-1, 1)
        maxs = np.array(self._maxs, dtype=np.float32).reshape(-1, 1)
        if self.method.moving_average:
            lo, hi = np.nanmean(mins, axis=0), np.nanmean(maxs, axis=0)
        else:
            lo, hi = np.nanmin(mins, axis=0), np.nanmax(maxs, axis=0)
        if self.method.calib_symmetric:
            a = np.nanmax([np.abs(lo), np.abs(hi)], axis=0)
            lo, hi = -a, a
        return np.float32(lo[0]), np.float32(hi[0])


class HistogramObserver(Observer):
    """Percentile, entropy-ort or mse over onnxruntime's histograms (two passes, or streaming)."""

    def __init__(self, method: CalibMethod) -> None:
        if method.name not in ("percentile", "entropy-ort", "mse"):
            raise ValueError(f"HistogramObserver needs percentile, entropy-ort or mse, got {method.name}")
        super().__init__(method)
        self._abs = method.name == "percentile" and method.calib_symmetric
        self._stream: AbsStream | SignedStream | None = None
        if method.streaming:
            self._stream = AbsStream(method.bins) if self._abs else SignedStream(method.bins)
        self._lo = self._hi = self._amin = np.float32(np.nan)
        self._counter: BinCounter | None = None
        self._zeros = 0

    def _observe(self, x: np.ndarray) -> None:
        if self.method.name == "mse" and self._pass == self.passes - 1:
            self._zeros += int(np.count_nonzero(x == 0))
        if self._stream is not None:
            self._stream.add(x)
        elif self._pass == 0:
            if x.size == 0:
                return
            lo, hi = finite_minmax(x)
            self._lo, self._hi = np.fmin(self._lo, lo), np.fmax(self._hi, hi)
            if self._abs:
                self._amin = np.fmin(self._amin, abs_min(x, lo, hi))
        else:
            assert self._counter is not None
            self._counter.add(x, absolute=self._abs)

    def _start_pass(self) -> None:
        lo, hi = (np.float32(0), np.float32(0)) if np.isnan(self._lo) else (self._lo, self._hi)
        self._lo, self._hi = lo, hi
        if self._abs:
            amin = np.float32(0) if np.isnan(self._amin) else self._amin
            edges = uniform_edges(amin, np.float32(max(abs(lo), abs(hi))), self.method.bins)
        else:
            t = np.float32(max(abs(lo), abs(hi)))
            edges = uniform_edges(-t, t, self.method.bins)
        self._counter = BinCounter(edges)

    def histogram(self) -> Histogram:
        """The histogram collected so far (after the last pass): onnxruntime's record."""
        if self._stream is not None:
            if self._stream.histogram is None:
                raise RuntimeError("HistogramObserver: no data observed")
            return self._stream.histogram
        if self._counter is None:
            raise RuntimeError("HistogramObserver: the second pass has not started")
        return Histogram(self._counter.counts, self._counter.edges, self._lo, self._hi)

    def _calibrated(self, symmetric: bool) -> tuple[np.float32, np.float32]:
        m = self.method
        h = self.histogram()
        if m.name == "percentile":
            return percentile_range(h, m.percentile, symmetric=self._abs)
        if m.name == "entropy-ort":
            return entropy_range(h, m.num_quantized_bins)
        return mse_range(h, self._zeros, symmetric=symmetric or m.calib_symmetric, bits=m.bits)


def make_observer(method: CalibMethod) -> Observer:
    """A fresh observer for ``method`` (check its ``passes``)."""
    if method.name == "minmax":
        return MinMaxObserver(method)
    if method.name == "entropy":
        from compiler.calibration.entropy import EntropyObserver

        return EntropyObserver(method)
    if method.name == "auto":
        from compiler.calibration.auto import AutoObserver

        return AutoObserver(method)
    return HistogramObserver(method)


def channel_minmax(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``(min, max)`` of a weight along ``axis`` (float32 arrays of ``w.shape[axis]``).

    ``mins[c] = min w[..., c, ...]`` over every other axis (0 for an empty channel). Feed
    them to :func:`~compiler.calibration.qparams.compute_scale_zero_point` with
    ``symmetric=True`` and ``qrange(INT8, symmetric=True)`` for onnxruntime's per-channel
    int8 weights (``scale_c = max(|min_c|, |max_c|) / 127``).
    """
    a = np.asarray(w, dtype=np.float32)
    if a.ndim == 0:
        raise ValueError("channel_minmax needs an array of rank >= 1")
    ax = axis + a.ndim if axis < 0 else axis
    if not 0 <= ax < a.ndim:
        raise ValueError(f"axis {axis} out of range for rank {a.ndim}")
    rows = np.moveaxis(a, ax, 0).reshape(a.shape[ax], -1)
    if rows.shape[1] == 0:
        return np.zeros(a.shape[ax], np.float32), np.zeros(a.shape[ax], np.float32)
    return rows.min(axis=1), rows.max(axis=1)
