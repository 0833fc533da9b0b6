"""Padding-free output regions of a conv: where each output reads only in-bounds taps.

Along one axis, output ``o`` reads input ``o*s + t*d - pad_begin`` with tap ``t``; the taps that
land inside ``[0, in)`` form one contiguous range ``[t0(o), t1(o))`` (the read index grows with
``t``). Consecutive outputs with the same range form a band (:func:`axis_bands`), and a 2-D region
is a row band times a column band. Inside a region the conv is exact without padding:

``conv[n, o, y, x] = sum_{i, kh in [r.t0, r.t1), kw in [c.t0, c.t1)} x[n, i, y*sh + kh*dh - pt,
x*sw + kw*dw - pl] * W[o, i, kh, kw]`` for ``y`` in the row band ``r`` and ``x`` in the column
band ``c`` (a region whose range is empty reads nothing: its conv is 0).

A dilated conv on a small map mostly multiplies padding (DeepLab's ASPP rate 12 on a 20x20 map: 64%
of the multiply-adds read zeros, and no tap is dead for every output, so
:func:`backends.tvm.kernels.conv_geometry.trim_dead_taps` drops none). Computing each region on its
own skips exactly those: :func:`splits_regions` says when that pays (:data:`MIN_DEAD_SHARE`,
:data:`MIN_BAND`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from backends.tvm.kernels.conv_geometry import ConvGeometry

__all__ = [
    "AxisBand",
    "ConvRegion",
    "axis_bands",
    "conv_regions",
    "live_share",
    "splits_regions",
    "MIN_DEAD_SHARE",
    "MIN_BAND",
    "MAX_BANDS",
    "region_spec",
]

_G = TypeVar("_G", bound=ConvGeometry)

# Split a conv into regions when at least this share of its dense multiply-adds reads padding and
# every band that reads the input is at least MIN_BAND outputs wide. Measured on Zen 4, 1 thread
# (benchmarks/conv_regions.py, split/dense): ASPP rate 12 on 20x20 (64% dead, bands 8/4/8) 0.44;
# rate 6 on 33x33 (23%, 6/21/6) 0.80; 3x3 pad 1 on 7x7 (18%, bands 1/5/1) 1.29 and on 5x5 (25%)
# 1.99: one-wide border bands run at a fraction of the register tile's throughput.
MIN_DEAD_SHARE = 0.2
MIN_BAND = 4
MAX_BANDS = 5  # bands per axis beyond which the region nests cost more than they save


@dataclass(frozen=True)
class AxisBand:
    """Outputs ``[o0, o1)`` of one axis, each reading exactly the taps ``[t0, t1)`` (all in bounds)."""

    o0: int
    o1: int
    t0: int
    t1: int

    @property
    def size(self) -> int:
        """``o1 - o0`` outputs."""
        return self.o1 - self.o0

    @property
    def taps(self) -> int:
        """``t1 - t0`` live taps (0: the band reads only padding)."""
        return max(0, self.t1 - self.t0)


@dataclass(frozen=True)
class ConvRegion:
    """One row band times one column band of a conv's output."""

    rows: AxisBand
    cols: AxisBand

    @property
    def macs_per_channel_pair(self) -> int:
        """Live multiply-adds per (input, output) channel pair: ``rows*cols*row_taps*col_taps``."""
        return self.rows.size * self.cols.size * self.rows.taps * self.cols.taps


def axis_bands(
    size: int, kernel: int, stride: int, dilation: int, pad_begin: int, out: int
) -> list[AxisBand]:
    """The bands of one axis, in output order, covering ``[0, out)``."""
    bands: list[AxisBand] = []
    for o in range(out):
        live = [t for t in range(kernel) if 0 <= o * stride + t * dilation - pad_begin < size]
        t0, t1 = (live[0], live[-1] + 1) if live else (0, 0)
        last = bands[-1] if bands else None
        if last is not None and (last.t0, last.t1) == (t0, t1):
            bands[-1] = AxisBand(last.o0, o + 1, t0, t1)
        else:
            bands.append(AxisBand(o, o + 1, t0, t1))
    return bands


def _bands(g: ConvGeometry) -> tuple[list[AxisBand], list[AxisBand]]:
    (kh, kw), (sh, sw), (dh, dw) = g.kernel, g.strides, g.dilations
    rows = axis_bands(g.in_h, kh, sh, dh, g.pads[0], g.out_h)
    cols = axis_bands(g.in_w, kw, sw, dw, g.pads[1], g.out_w)
    return rows, cols


def conv_regions(g: ConvGeometry) -> list[ConvRegion]:
    """Every region of ``g``'s output, row-major (row bands outer)."""
    rows, cols = _bands(g)
    return [ConvRegion(r, c) for r in rows for c in cols]


def live_share(g: ConvGeometry) -> float:
    """The share of the dense multiply-adds that read the input (1.0: no tap reads padding)."""
    dense = g.out_h * g.out_w * g.kernel[0] * g.kernel[1]
    return sum(r.macs_per_channel_pair for r in conv_regions(g)) / dense


def splits_regions(g: ConvGeometry) -> bool:
    """True when ``g`` runs faster as its padding-free regions: at least :data:`MIN_DEAD_SHARE` of
    its multiply-adds read padding, every band reading the input is :data:`MIN_BAND` wide or more,
    and no axis has more than :data:`MAX_BANDS` bands."""
    if not any(g.pads):
        return False
    for bands in _bands(g):
        if len(bands) > MAX_BANDS or any(b.taps and b.size < MIN_BAND for b in bands):
            return False
    return 1.0 - live_share(g) >= MIN_DEAD_SHARE


def region_spec(g: _G, region: ConvRegion) -> _G:
    """``g`` narrowed to one region: the same channels, the region's output size and live taps, no
    padding (the input size is the one those taps and outputs span). For sizing the region's tile."""
    (sh, sw), (dh, dw) = g.strides, g.dilations
    r, c = region.rows, region.cols
    in_h = (r.size - 1) * sh + (r.taps - 1) * dh + 1
    in_w = (c.size - 1) * sw + (c.taps - 1) * dw + 1
    return replace(g, in_h=in_h, in_w=in_w, kernel=(r.taps, c.taps), pads=(0, 0, 0, 0))
