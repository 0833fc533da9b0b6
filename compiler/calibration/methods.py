"""Calibration methods: the ``CalibMethod`` options dataclass and the ``--calib-method`` parser.

A method picks how an observer turns the activations it saw into the float
range ``[rmin, rmax]`` that the int8 quantizer represents:

* ``minmax``: ``[min x, max x]`` over every calibration sample.
* ``percentile[=P]``: the ``P``-th percentile of ``|x|`` (default ``P = 99.999``).
* ``entropy``: Kiln's KL-divergence search (TensorRT's): a 2048-bin histogram of ``|x|``
  and the threshold that minimises ``KL(P || Q)`` between the clipped histogram ``P``
  and its requantisation ``Q`` on the quantizer's levels (see
  :mod:`compiler.calibration.entropy`); a compile then keeps each clipped range only where
  it lowers no output's SQNR on the calibration samples against the full range
  (:mod:`compiler.quant.clip_check`).
* ``entropy-ort``: onnxruntime's ``CalibrationMethod.Entropy`` bit for bit (128 bins,
  128 quantized bins: a single candidate, so it returns the minmax range).
* ``mse``: the range that minimises the expected squared quantisation error
  over the histogram (Kiln's own method).
* ``auto``: per tensor, the candidate range of minmax, percentile, entropy and mse
  with the least measured squared quantisation error on the calibration samples
  (see :mod:`compiler.calibration.auto`).

The defaults of minmax, percentile and entropy-ort equal onnxruntime's
``create_calibrator`` defaults, so that they reproduce
``onnxruntime.quantization.quantize_static``; see
:mod:`compiler.calibration.observers` for the math.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, cast

from compiler.errors import OptionError

__all__ = ["CalibMethod", "MethodName", "METHOD_NAMES", "parse_calib_method"]

MethodName = Literal["minmax", "percentile", "entropy", "entropy-ort", "mse", "auto"]
METHOD_NAMES: tuple[MethodName, ...] = ("minmax", "percentile", "entropy", "entropy-ort", "mse", "auto")

# onnxruntime's create_calibrator defaults: num_bins per method, and whether the
# calibrator itself makes the range symmetric (its ``symmetric`` extra option).
# Kiln's own methods: entropy histograms |x| (2048 bins), auto a signed [-a, a] grid (4096 bins,
# which folds into 2048 bins of |x|).
_DEFAULT_BINS: dict[str, int] = {
    "minmax": 0,
    "percentile": 2048,
    "entropy": 2048,
    "entropy-ort": 128,
    "mse": 2048,
    "auto": 4096,
}
_DEFAULT_SYMMETRIC_RANGE: dict[str, bool] = {"percentile": True}
_PASSES: dict[str, int] = {"minmax": 1, "entropy": 2, "auto": 3}  # the rest: 2, or 1 streaming


@dataclass(frozen=True)
class CalibMethod:
    """How to calibrate one activation; fields default to onnxruntime's defaults.

    Attributes:
        name: ``minmax``, ``percentile``, ``entropy``, ``entropy-ort``, ``mse`` or ``auto``.
        percentile: For ``percentile``: the kept mass ``P`` in percent, ``0 < P <= 100``.
        num_bins: Histogram bins (``None``: 2048, 128 for entropy-ort, 4096 for auto).
        num_quantized_bins: For ``entropy-ort``: levels of the candidate distribution ``Q``
            (Kiln's ``entropy`` takes the levels from the quantizer: see ``observers``).
        symmetric_range: onnxruntime's calibrator option ``symmetric`` (``CalibTensorRangeSymmetric``):
            the calibrated range is ``[-t, t]`` clipped to ``[min x, max x]``; for percentile the
            histogram is then of ``|x|``. ``None``: onnxruntime's default (True for percentile only).
            It is independent of the quantizer's symmetry, which ``Observer.range`` takes.
        streaming: False (default): histogram methods take two passes over the data and equal
            ``quantize_static``, which histograms all samples at once. True: one pass, equal to
            onnxruntime's calibrator fed one sample per ``collect_data`` call (histograms merged
            as the range grows; minmax moving average becomes an exponential one). Kiln's
            ``entropy`` and ``auto`` always fix their grid in a first pass (deterministic
            merging) and refuse ``streaming``.
        moving_average: For ``minmax``: average the per-sample minima and maxima instead of
            taking the extremes (onnxruntime's ``CalibMovingAverage``).
        averaging_constant: For ``minmax`` with ``moving_average`` and ``streaming``: the
            smoothing constant ``c`` of ``m <- m + c (m_new - m)``.
        bits: For ``mse``: integer bits of the quantized type the range is searched for.
    """

    name: MethodName = "minmax"
    percentile: float = 99.999
    num_bins: int | None = None
    num_quantized_bins: int = 128
    symmetric_range: bool | None = None
    streaming: bool = False
    moving_average: bool = False
    averaging_constant: float = 0.01
    bits: int = 8

    def __post_init__(self) -> None:
        if self.name not in METHOD_NAMES:
            raise ValueError(f"unknown calibration method {self.name!r}; expected one of {METHOD_NAMES}")
        if not (0.0 < self.percentile <= 100.0) or math.isnan(self.percentile):
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")
        if self.num_bins is not None and self.num_bins < 1:
            raise ValueError(f"num_bins must be >= 1, got {self.num_bins}")
        if self.num_quantized_bins < 2:
            raise ValueError(f"num_quantized_bins must be >= 2, got {self.num_quantized_bins}")
        if self.streaming and self.name in ("entropy", "auto"):
            raise ValueError(f"{self.name} fixes its histogram grid in a first pass; no streaming mode")
        if self.name in ("entropy", "auto") and self.bins < 256:
            raise ValueError(f"{self.name} needs num_bins >= 256 (it searches 256 levels), got {self.bins}")
        if self.name == "entropy-ort" and self.bins // 2 < self.num_quantized_bins // 2:
            raise ValueError(
                f"entropy needs num_bins >= num_quantized_bins, got {self.bins} < {self.num_quantized_bins}"
            )
        if not 0.0 <= self.averaging_constant <= 1.0:
            raise ValueError(f"averaging_constant must be in [0, 1], got {self.averaging_constant}")
        if not 2 <= self.bits <= 16:
            raise ValueError(f"bits must be in [2, 16], got {self.bits}")

    @property
    def bins(self) -> int:
        """The histogram bin count in force (``num_bins`` or the method's default)."""
        return self.num_bins if self.num_bins is not None else _DEFAULT_BINS[self.name]

    @property
    def calib_symmetric(self) -> bool:
        """The calibrator-level symmetric option in force (``symmetric_range`` or its default)."""
        if self.symmetric_range is not None:
            return self.symmetric_range
        return _DEFAULT_SYMMETRIC_RANGE.get(self.name, False)

    @property
    def passes(self) -> int:
        """Passes over the calibration data an observer for this method needs."""
        return _PASSES.get(self.name, 1 if self.streaming else 2)

    def spec(self) -> str:
        """The ``--calib-method`` text of this method (its other options do not show)."""
        if self.name == "percentile" and self.percentile != 99.999:
            return f"percentile={self.percentile:g}"
        return self.name


_USAGE = "expected minmax, percentile, percentile=P (0 < P <= 100), entropy, entropy-ort, mse or auto"


def parse_calib_method(text: str) -> CalibMethod:
    """Parse ``--calib-method``: ``minmax | percentile[=P] | entropy | entropy-ort | mse | auto``.

    Names are case-insensitive and surrounding blanks are ignored; ``P`` is the
    kept percentage, e.g. ``percentile=99.99``.

    Args:
        text: The flag's value.

    Returns:
        The method with onnxruntime's defaults for everything the text does not set.

    Raises:
        OptionError: The text names no method, or ``P`` is not a number in (0, 100].
    """
    raw = text
    name, sep, arg = text.strip().lower().partition("=")
    name = name.strip()
    if name not in METHOD_NAMES:
        raise OptionError(f"--calib-method {raw!r}: unknown method; {_USAGE}")
    if not sep:
        return CalibMethod(name=cast(MethodName, name))
    if name != "percentile":
        raise OptionError(f"--calib-method {raw!r}: {name} takes no value; {_USAGE}")
    try:
        p = float(arg)
    except ValueError:
        raise OptionError(
            f"--calib-method {raw!r}: percentile {arg.strip()!r} is not a number; {_USAGE}"
        ) from None
    if not (0.0 < p <= 100.0):
        raise OptionError(f"--calib-method {raw!r}: percentile must be in (0, 100]; {_USAGE}")
    return CalibMethod(name="percentile", percentile=p)
