"""Weight encodings of MNN convolutions: fp32, fp16 and weight-only int8/int4.

Weights arrive as ``[rows, K]`` float32 (rows = output channels in MNN's layout,
K = the weights of one row); the bias stays float32. Encodings:

* fp32: ``Convolution2D.weight`` / ``bias``.
* fp16: ``IDSTQuan{type 3, buffer = IEEE half bytes}``; MNN widens them to float at load.
* int8 / int4 (``IDSTQuan{type 1}``, table-coded, see :mod:`schemas.mnn.idst`), per group
  g of ``K / blocks`` consecutive weights of one row (``blocks`` = 1: per output channel):

  - symmetric: s_g = max|w_g| / (2^(b-1) - 1), q = round(w / s_g), alpha = [s_g];
    MNN decodes w = q * alpha[g].
  - asymmetric: s_g = (max w_g - min w_g) / (2^b - 1), q = round((w - min_g) / s_g) - 2^(b-1),
    alpha = [min_g, s_g] pairs, aMin = -2^(b-1), readType = number of groups;
    MNN decodes w = (q - aMin) * s_g + min_g.

  ``quantScale`` is always 1.0 (MNN multiplies alpha by it). With fp16 scale storage the
  alphas are rounded to half first and q is computed against the rounded values, so the
  decoded weights are exactly what MNN computes.

The integer form (:class:`~schemas.mnn.quantized_weights.QuantizedWeights`) and MNN's decoding
of it are format code shared with the MNN frontend, in ``schemas/mnn/quantized_weights.py``.
A :class:`WeightStorage` may carry precomputed integer weights (``levels``, e.g. GPTQ's, on
the grid ``quantize_weights`` picks): they are then written and decoded instead of the
nearest rounding of the float weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backends.mnn.model import Table
from backends.mnn.options import MnnOptions
from schemas.mnn import idst
from schemas.mnn.external import ExternalData
from schemas.mnn.quantized_weights import QuantizedWeights, dequantize_weights
from schemas.mnn.schema import fb

__all__ = [
    "WeightStorage",
    "quantize_weights",
    "decoded_weights",
    "conv_weight_fields",
    "group_count",
]


@dataclass(frozen=True)
class WeightStorage:
    """How one layer's weights are stored: fp32, fp16, int8 or int4 (+ int options).

    ``levels``: int8/int4 only, the layer's integer weights and scales to write as they are
    (rows in MNN's layout); None: nearest rounding of the float weights.
    """

    kind: str = "fp32"
    asymmetric: bool = False
    fp16_scales: bool = False
    levels: QuantizedWeights | None = field(default=None, compare=False, repr=False)

    @property
    def bits(self) -> int | None:
        """Bit width of integer storage, else None."""
        return {"int8": 8, "int4": 4}.get(self.kind)

    @classmethod
    def of(cls, options: MnnOptions) -> WeightStorage:
        """The storage the options ask for."""
        quantized = options.bits is not None
        return cls(options.weights, quantized and options.asymmetric, quantized and options.scale == "fp16")


def group_count(rows: int, k: int, block_elems: int | None) -> int:
    """Number of scale groups: one per row, or per block when ``block_elems`` splits K evenly."""
    if block_elems is None or block_elems >= k or k % block_elems:
        return rows
    return rows * (k // block_elems)


def _stored(x: np.ndarray, fp16: bool) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x.astype(np.float16).astype(np.float32) if fp16 else x


def quantize_weights(
    w: np.ndarray, bits: int, asymmetric: bool, block_elems: int | None = None, fp16_scales: bool = False
) -> QuantizedWeights:
    """Quantize ``w`` ([rows, K]) per row, or per block of ``block_elems`` weights of a row."""
    w = np.asarray(w, np.float32)
    rows, k = w.shape
    groups = group_count(rows, k, block_elems)
    g = w.reshape(groups, -1)
    half = 1 << (bits - 1)
    if asymmetric:
        lo, hi = g.min(axis=1), g.max(axis=1)
        mins = _stored(lo, fp16_scales)
        scale = _stored((hi.astype(np.float64) - mins) / (2 * half - 1), fp16_scales)
        safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
        q = np.rint((g - mins[:, None]) / safe[:, None]) - half
        q = np.where(scale[:, None] > 0, q, -half)
        q = np.clip(q, -half, half - 1)
        alpha = np.stack([mins, scale], axis=1).reshape(-1)
    else:
        scale = _stored(np.abs(g).max(axis=1).astype(np.float64) / (half - 1), fp16_scales)
        safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
        q = np.where(scale[:, None] > 0, np.rint(g / safe[:, None]), 0)
        q = np.clip(q, -(half - 1), half - 1)
        alpha = scale
    return QuantizedWeights(
        q.reshape(rows, k).astype(np.int32), alpha.astype(np.float32), bits, asymmetric, groups
    )


def _idst_fields(qw: QuantizedWeights, fp16_scales: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "type": 1,
        "quantScale": 1.0,
        "aMaxOrBits": qw.bits,
        "aMin": qw.a_min,
        "readType": qw.groups if qw.asymmetric else 0,
    }
    if fp16_scales:
        fields["scaleStorage"] = fb.ScaleStorageType.FP16
    return fields


def decoded_weights(w: np.ndarray, storage: WeightStorage, block_elems: int | None = None) -> np.ndarray:
    """The float weights MNN computes with when ``w`` ([rows, K]) is stored as ``storage``."""
    w = np.asarray(w, np.float32)
    if storage.kind == "fp32":
        return w
    if storage.kind == "fp16":
        return w.astype(np.float16).astype(np.float32)
    assert storage.bits is not None
    return dequantize_weights(_levels(w, storage, block_elems))


def _levels(w: np.ndarray, storage: WeightStorage, block_elems: int | None) -> QuantizedWeights:
    """The integer weights of ``w`` under ``storage``: its ``levels`` if given, else nearest rounding."""
    assert storage.bits is not None
    if storage.levels is not None:
        qw = storage.levels
        if qw.q.shape != w.shape or qw.bits != storage.bits or qw.asymmetric != storage.asymmetric:
            raise ValueError(f"precomputed levels {qw.q.shape} do not fit weights {w.shape} as {storage}")
        return qw
    return quantize_weights(w, storage.bits, storage.asymmetric, block_elems, storage.fp16_scales)


def conv_weight_fields(
    w: np.ndarray,
    bias: np.ndarray,
    storage: WeightStorage,
    external: ExternalData | None,
    block_elems: int | None = None,
) -> Mapping[str, Any]:
    """``Convolution2D`` fields holding weights ``w`` ([rows, K]) and ``bias`` as ``storage`` says."""
    w = np.ascontiguousarray(w, np.float32)
    bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
    if storage.kind == "fp32":
        if external is not None:
            return {"external": np.asarray(external.append(w, bias), np.int64)}
        return {"weight": w.reshape(-1), "bias": bias}
    if storage.kind == "fp16":
        buffer = w.astype(np.float16).reshape(-1).view(np.int8)
        quan: dict[str, Any] = {"type": 3, "quantScale": 1.0}
        alpha = np.zeros(0, np.float32)
    else:
        assert storage.bits is not None
        qw = _levels(w, storage, block_elems)
        buffer, wide = idst.encode(qw.q, qw.bits)
        quan = _idst_fields(qw, storage.fp16_scales)
        if wide:
            quan["shapeInt32"] = True
        alpha = qw.alpha.astype(np.float16).view(np.uint16) if storage.fp16_scales else qw.alpha
    if external is not None:
        ext = external.append(buffer, alpha, bias, np.zeros(0, np.uint32))
        return {"quanParameter": Table("IDSTQuan", quan), "external": np.asarray(ext, np.int64)}
    quan["buffer"] = buffer
    if alpha.size:
        quan["alphaFp16" if alpha.dtype == np.uint16 else "alpha"] = alpha
    return {"bias": bias, "quanParameter": Table("IDSTQuan", quan)}
