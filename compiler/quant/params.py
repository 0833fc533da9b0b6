"""Quantization parameters: real range -> (scale, zero point), and the int math.

Scales and zero points come from one implementation,
:func:`compiler.calibration.qparams.compute_scale_zero_point`, which is bit-identical to
onnxruntime's ``compute_scale_zp``. For a range [rmin, rmax] widened to contain 0:

* asymmetric (uint8 activations, [0, 255]): s = (rmax - rmin) / 255, z = round(-rmin / s);
* symmetric (int8, [-127, 127]; the level -128 is unused): a = max(|rmin|, |rmax|),
  s = 2a / 254 = a / 127, z = 0 (uint8 symmetric: s = 2a / 255, z = 128);
* weights: symmetric int8, per output channel c: s_c = max|W_c| / 127 (no clipping);
* bias: b_q = round(b / (s_x s_w)) in int32, zero point 0. When s_x s_w is so small that
  b_q would leave int32, the weight scale is raised (onnxruntime's
  ``_adjust_weight_scale_for_int32_bias``): s_w >= 1.0001 * 2|b| / (2^32 - 2) / s_x.

s and the arithmetic of z are float64, s is stored as float32; ``round`` is half-to-even. A
range whose step is below float32's smallest normal (an all-zero tensor) gets s = 1, z = 0.
q(x) = clip(round_half_even(x / s) + z, qmin, qmax) in float32, as QuantizeLinear and
onnxruntime's quantizer compute it; dq(q) = (q - z) * s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.calibration.observers import channel_minmax
from compiler.calibration.qparams import compute_scale_zero_point, qrange
from compiler.ir.types import DType

__all__ = [
    "QParams",
    "QRANGE",
    "range_params",
    "weight_params",
    "bias_params",
    "fit_weight_to_bias",
    "quantize",
    "dequantize",
    "MIN_SCALE",
]

QRANGE: dict[DType, tuple[int, int]] = {
    DType.UINT8: (0, 255),
    DType.INT8: (-128, 127),
    DType.INT32: (-(2**31), 2**31 - 1),
}
MIN_SCALE = float(np.finfo(np.float32).tiny)  # smaller steps fall back to s = 1 (see above)
_BIAS_EPS = 1.0001  # onnxruntime's multiplicative epsilon for the int32 bias range
_INT32_LEVELS = float(2**31 - 1) - float(-(2**31) + 1)


@dataclass(frozen=True)
class QParams:
    """Scale and zero point (per tensor: shape (); per channel: 1-D along ``axis``)."""

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: DType
    axis: int | None = None

    @property
    def per_channel(self) -> bool:
        """True for per-axis parameters."""
        return self.axis is not None

    def as_json(self) -> dict[str, object]:
        """JSON-friendly form (exact float32 values as Python floats)."""
        return {
            "dtype": self.dtype.numpy.name,
            "axis": self.axis,
            "scale": [float(v) for v in np.atleast_1d(self.scale)] if self.per_channel else float(self.scale),
            "zero_point": (
                [int(v) for v in np.atleast_1d(self.zero_point)] if self.per_channel else int(self.zero_point)
            ),
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> QParams:
        """Inverse of :meth:`as_json`."""
        dtype = DType.from_numpy(np.dtype(str(d["dtype"])))
        axis = d.get("axis")
        scale = np.asarray(d["scale"], dtype=np.float32)
        zp = np.asarray(d["zero_point"], dtype=dtype.numpy)
        return cls(scale, zp, dtype, None if axis is None else int(axis))  # type: ignore[call-overload]


def range_params(rmin: float, rmax: float, dtype: DType, *, symmetric: bool) -> QParams:
    """Per-tensor parameters representing [rmin, rmax] (widened to include 0), as onnxruntime."""
    qmin, qmax = qrange(dtype, symmetric=symmetric)
    lo, hi = np.asarray(rmin, dtype=np.float32), np.asarray(rmax, dtype=np.float32)
    scale, zp = compute_scale_zero_point(lo, hi, qmin, qmax, symmetric=symmetric)
    return QParams(scale.reshape(()), zp.astype(dtype.numpy).reshape(()), dtype)


def weight_params(w: np.ndarray, axis: int | None, dtype: DType = DType.INT8) -> QParams:
    """Symmetric parameters for weights: per channel along ``axis``, or per tensor if axis is None."""
    qmin, qmax = qrange(dtype, symmetric=True)
    a = np.asarray(w, dtype=np.float32)
    if axis is None:
        lo = np.asarray(a.min() if a.size else 0.0, dtype=np.float32)
        hi = np.asarray(a.max() if a.size else 0.0, dtype=np.float32)
        scale, zp = compute_scale_zero_point(lo, hi, qmin, qmax, symmetric=True)
        return QParams(scale.reshape(()), zp.astype(dtype.numpy).reshape(()), dtype)
    axis = axis + a.ndim if axis < 0 else axis
    lo, hi = channel_minmax(a, axis)
    scale, zp = compute_scale_zero_point(lo, hi, qmin, qmax, symmetric=True)
    return QParams(scale, zp.astype(dtype.numpy), dtype, axis)


def fit_weight_to_bias(w: QParams, x_scale: np.ndarray, bias: np.ndarray) -> QParams:
    """``w`` with its scales raised where s_x * s_w is too small for ``bias`` in int32.

    Per channel c: s_w,c >= 1.0001 * 2 |b_c| / (2^32 - 2) / s_x; per tensor with max |b|.
    Returns ``w`` itself when nothing changes.
    """
    b = np.abs(np.asarray(bias, dtype=np.float64)).reshape(-1)
    if not b.size or not w.scale.size:
        return w
    need = _BIAS_EPS * 2.0 * (b if w.per_channel else np.array([b.max()])) / _INT32_LEVELS
    xs = float(np.asarray(x_scale, dtype=np.float32))
    ws = np.atleast_1d(w.scale).astype(np.float64)
    if need.shape != ws.shape:
        return w
    cand = xs * ws
    low = (cand < need) & (cand > 0.0)
    if not low.any():
        return w
    scale = np.where(low, ws * (need / np.where(cand > 0, cand, 1.0)), ws).astype(np.float32)
    return QParams(scale.reshape(w.scale.shape), w.zero_point, w.dtype, w.axis)


def bias_params(x_scale: np.ndarray, w: QParams) -> QParams:
    """int32 bias parameters with s_b = s_x * s_w (per output channel when the weights are)."""
    scale = (np.float32(x_scale) * w.scale.astype(np.float32)).astype(np.float32)
    zp = np.zeros(scale.shape, np.int32)
    return QParams(scale, zp, DType.INT32, 0 if w.per_channel else None)


def _bcast(p: np.ndarray, ndim: int, axis: int | None) -> np.ndarray:
    if axis is None or p.ndim == 0:
        return p
    shape = [1] * ndim
    shape[axis] = -1
    return p.reshape(shape)


def quantize(x: np.ndarray, p: QParams) -> np.ndarray:
    """q = clip(round_half_even(x / s) + z, qmin, qmax) computed like ONNX QuantizeLinear (float32)."""
    qmin, qmax = QRANGE[p.dtype]
    s = _bcast(p.scale.astype(np.float32), x.ndim, p.axis)
    z = _bcast(p.zero_point.astype(np.float64), x.ndim, p.axis)
    if p.dtype == DType.INT32:
        q = np.rint(x.astype(np.float64) / s.astype(np.float64)) + z
    else:
        q = np.rint(x.astype(np.float32) / s) + z
    return np.clip(q, qmin, qmax).astype(p.dtype.numpy)


def dequantize(q: np.ndarray, p: QParams) -> np.ndarray:
    """dq = (q - z) * s in float32."""
    s = _bcast(p.scale.astype(np.float32), q.ndim, p.axis)
    z = _bcast(p.zero_point.astype(np.int64), q.ndim, p.axis)
    return ((q.astype(np.int64) - z).astype(np.float32) * s).astype(np.float32)
