"""The geometry every conv kernel spec shares: sizes, padding, groups and channel blocks.

``out = (in + pad_begin + pad_end - d*(k-1) - 1) // s + 1`` per spatial axis; channels are
blocked as ``NCHW[b]c`` with ``ceil(C / b)`` chunks (padded lanes are zero).
"""

from __future__ import annotations

import hashlib
from dataclasses import astuple, dataclass

import numpy as np

__all__ = ["ConvGeometry", "ceil_div", "depthwise_weight", "check_weight_shape"]


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
        return hashlib.sha1(repr(astuple(self)).encode()).hexdigest()[:12]


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
