"""The geometry every conv kernel spec shares: sizes, padding, groups and channel blocks.

``out = (in + pad_begin + pad_end - d*(k-1) - 1) // s + 1`` per spatial axis; channels are
blocked as ``NCHW[b]c`` with ``ceil(C / b)`` chunks (padded lanes are zero).

Grouped convs (1 < groups, not depthwise; ``gi = IC/groups`` and ``go = OC/groups`` channels a
group) run blocked when every output chunk's groups read whole input chunks (:func:`grouped_fits`):
output chunk ``o`` reads the ``group_chunks`` input chunks from ``group_chunk_start(o) =
((o*ob) // go) * gi // ib``, with the weights of other groups zero (ResNeXt's 32x4d with 16-wide
blocks: one input chunk an output chunk, a 16x16 block-diagonal weight of 4x4 groups).

Dead taps: tap ``t`` of an axis reads input ``o*s + t*d - pad_begin``; when that is outside
``[0, in)`` for every output ``o`` the tap only ever multiplies padding zeros. Leading and trailing
dead taps are dropped exactly (:func:`trim_dead_taps`): ``pad_begin -= t0*d``, ``pad_end -=
(k-1-t1)*d`` for the live range ``[t0, t1]``, which keeps ``out``. A dilated 3x3 whose dilation
reaches past the input (DeepLab's ASPP rates 24 and 36 on a 20x20 map) becomes a 1x1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.tvm.kernels.kernel import spec_key
from compiler.ops import blocked_layout as bl

__all__ = [
    "ConvGeometry",
    "ceil_div",
    "depthwise_weight",
    "check_weight_shape",
    "live_taps",
    "trim_dead_taps",
]


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)


@dataclass(frozen=True)
class ConvGeometry:
    """Sizes of one 2-D conv: NCHW[in_block]c in, NCHW[out_block]c out."""

    batch: int
    in_channels: int
    in_h: int
    in_w: int
    out_channels: int
    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    dilations: tuple[int, int] = (1, 1)
    groups: int = 1
    in_block: int = 8
    out_block: int = 8

    @property
    def out_h(self) -> int:
        """``(IH + pt + pb - dh*(KH-1) - 1) // sh + 1``."""
        eff = self.dilations[0] * (self.kernel[0] - 1) + 1
        return (self.in_h + self.pads[0] + self.pads[2] - eff) // self.strides[0] + 1

    @property
    def out_w(self) -> int:
        """``(IW + pl + pr - dw*(KW-1) - 1) // sw + 1``."""
        eff = self.dilations[1] * (self.kernel[1] - 1) + 1
        return (self.in_w + self.pads[1] + self.pads[3] - eff) // self.strides[1] + 1

    @property
    def in_chunks(self) -> int:
        """``ceil(IC / in_block)``."""
        return ceil_div(self.in_channels, self.in_block)

    @property
    def out_chunks(self) -> int:
        """``ceil(OC / out_block)``."""
        return ceil_div(self.out_channels, self.out_block)

    @property
    def is_depthwise(self) -> bool:
        """groups == in_channels == out_channels (and more than one group)."""
        return self.groups > 1 and self.groups == self.in_channels == self.out_channels

    @property
    def is_grouped(self) -> bool:
        """More than one group and not depthwise."""
        return self.groups > 1 and not self.is_depthwise

    @property
    def group_chunks(self) -> int:
        """The input chunks one output chunk reads (all of them when groups == 1; 0 for a grouped
        conv that does not fit its blocks, see :func:`grouped_fits`)."""
        if not self.is_grouped:
            return self.in_chunks
        args = (self.in_channels, self.out_channels, self.groups, self.in_block, self.out_block)
        return bl.grouped_chunks(*args) or 0

    def group_chunk_start(self, o: Any) -> Any:
        """The first input chunk output chunk ``o`` reads (0 when groups == 1). Works on TIR too."""
        if not self.is_grouped:
            return 0
        return bl.group_chunk_start(
            o, self.in_channels, self.out_channels, self.groups, self.in_block, self.out_block
        )

    @property
    def data_shape(self) -> tuple[int, int, int, int, int]:
        """``[N, in_chunks, IH, IW, in_block]``."""
        return (self.batch, self.in_chunks, self.in_h, self.in_w, self.in_block)

    @property
    def out_shape(self) -> tuple[int, int, int, int, int]:
        """``[N, out_chunks, OH, OW, out_block]`` (also the residual's shape)."""
        return (self.batch, self.out_chunks, self.out_h, self.out_w, self.out_block)

    @property
    def flops(self) -> int:
        """Multiply-adds times two over the real channels."""
        per_out = 2 * (self.in_channels // self.groups) * self.kernel[0] * self.kernel[1]
        return self.batch * self.out_channels * self.out_h * self.out_w * per_out

    def key(self) -> str:
        """A short deterministic hash of all spec fields."""
        return spec_key(self)


def grouped_fits(g: ConvGeometry) -> bool:
    """True when a grouped conv's output chunks read whole, in-range input chunks
    (:func:`compiler.ops.blocked_layout.grouped_chunks`)."""
    return g.is_grouped and g.group_chunks > 0


def depthwise_weight(w: np.ndarray, spec: ConvGeometry) -> np.ndarray:
    """Depthwise OIHW ``[C, 1, KH, KW]`` -> ``[C, KH, KW]`` (dtype kept); other shapes raise."""
    kh, kw = spec.kernel
    if w.shape != (spec.out_channels, 1, kh, kw):
        raise ValueError(f"depthwise weight shape {w.shape} != {(spec.out_channels, 1, kh, kw)}")
    return np.ascontiguousarray(w[:, 0])


def check_weight_shape(w: np.ndarray, spec: ConvGeometry) -> None:
    """Raise unless the conv has groups 1 and ``w`` is its OIHW ``[OC, IC, KH, KW]`` weight."""
    expect = (spec.out_channels, spec.in_channels, *spec.kernel)
    if spec.groups != 1 or w.shape != expect:
        raise ValueError(f"weight shape {w.shape} (groups {spec.groups}) != {expect} with groups 1")


def live_taps(
    size: int, kernel: int, stride: int, dilation: int, pad_begin: int, out: int
) -> tuple[int, int]:
    """``(t0, t1)``: the first and last tap of one axis that reads the input for some output
    (``(0, kernel - 1)`` when none does, so nothing is trimmed)."""
    live = [
        t for t in range(kernel) if any(0 <= o * stride + t * dilation - pad_begin < size for o in range(out))
    ]
    return (live[0], live[-1]) if live else (0, kernel - 1)


def trim_dead_taps(
    w: np.ndarray,
    in_hw: tuple[int, int],
    strides: tuple[int, int],
    pads: tuple[int, int, int, int],
    dilations: tuple[int, int],
) -> tuple[np.ndarray, tuple[int, int, int, int], tuple[int, int]]:
    """``(w, pads, dilations)`` without the leading and trailing dead taps of the OIHW weight ``w``
    (see the module docstring; an axis left with one tap gets dilation 1); unchanged when no tap
    is dead or a trimmed pad would be negative."""
    kh, kw = int(w.shape[2]), int(w.shape[3])
    new_pads = list(pads)
    keep: list[slice] = []
    for axis, k in enumerate((kh, kw)):
        d, s, pb, pe = dilations[axis], strides[axis], pads[axis], pads[axis + 2]
        out = (in_hw[axis] + pb + pe - d * (k - 1) - 1) // s + 1
        t0, t1 = live_taps(in_hw[axis], k, s, d, pb, out)
        nb, ne = pb - t0 * d, pe - (k - 1 - t1) * d
        if nb < 0 or ne < 0:
            t0, t1, nb, ne = 0, k - 1, pb, pe
        new_pads[axis], new_pads[axis + 2] = nb, ne
        keep.append(slice(t0, t1 + 1))
    if keep[0] == slice(0, kh) and keep[1] == slice(0, kw):
        return w, pads, dilations
    trimmed = np.ascontiguousarray(w[:, :, keep[0], keep[1]])
    dil = tuple(1 if trimmed.shape[2 + a] == 1 else dilations[a] for a in range(2))
    return trimmed, (new_pads[0], new_pads[1], new_pads[2], new_pads[3]), (dil[0], dil[1])
