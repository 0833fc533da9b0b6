"""Integer weights as MNN stores them in ``IDSTQuan`` (``type`` 1), and MNN's decoding of them.

Weights are ``[rows, K]`` (rows = output channels in MNN's layout), cut into ``groups``
groups g of ``rows * K / groups`` consecutive weights, each with its own scale:

* symmetric: alpha = [s_g]; MNN decodes w = q * alpha[g].
* asymmetric: alpha = [min_g, s_g] pairs, aMin = -2^(b-1); MNN decodes
  w = (q - aMin) * s_g + min_g.

The bytes of ``q`` are the IDST table coding (:mod:`schemas.mnn.idst`). The encoder, which
picks the scales, is the MNN backend's (``backends/mnn/weights.py``); the MNN frontend reads
files with :func:`dequantize_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["QuantizedWeights", "dequantize_weights"]


@dataclass(frozen=True)
class QuantizedWeights:
    """Integer weights ``q`` ([rows, K]) and their scales as MNN stores them (float32 values)."""

    q: np.ndarray
    alpha: np.ndarray
    bits: int
    asymmetric: bool
    groups: int

    @property
    def a_min(self) -> int:
        """``IDSTQuan.aMin``: the clamp minimum for asymmetric weights, else 0."""
        return -(1 << (self.bits - 1)) if self.asymmetric else 0


def dequantize_weights(qw: QuantizedWeights) -> np.ndarray:
    """The float weights MNN decodes from ``qw`` ([rows, K], float32)."""
    g = qw.q.reshape(qw.groups, -1).astype(np.float32)
    if qw.asymmetric:
        mins, scale = qw.alpha[0::2, None], qw.alpha[1::2, None]
        out = (g - np.float32(qw.a_min)) * scale + mins
    else:
        out = g * qw.alpha[:, None]
    return out.reshape(qw.q.shape).astype(np.float32)
