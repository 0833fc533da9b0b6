"""Quantization parameters: real range -> (scale, zero point), and the int math.

For a b-bit grid [qmin, qmax] and a real range [rmin, rmax] widened to contain 0:

* asymmetric: s = (rmax - rmin) / (qmax - qmin), z = round(qmin - rmin / s);
* symmetric:  s = max(|rmin|, |rmax|) / ((qmax - qmin) / 2), z = 0 (int8: s = a/127.5);
* per-channel symmetric weights: s_c = max|W_c| / 127 (no clipping of the extreme value);
* bias: b_q = round(b / (s_x * s_w)) in int32, zero point 0.

q(x) = clip(round_half_even(x / s) + z, qmin, qmax); dq(q) = (q - z) * s.
A zero-width range gets s = 1 / (qmax - qmin) * eps-safe floor so scales stay finite and > 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType

__all__ = [
    "QParams",
    "QRANGE",
    "range_params",
    "weight_params",
    "bias_params",
    "quantize",
    "dequantize",
    "MIN_SCALE",
]

QRANGE: dict[DType, tuple[int, int]] = {
    DType.UINT8: (0, 255),
    DType.INT8: (-128, 127),
    DType.INT32: (-(2**31), 2**31 - 1),
}
MIN_SCALE = 1e-8


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
    """Per-tensor parameters representing [rmin, rmax] (widened to include 0)."""
    qmin, qmax = QRANGE[dtype]
    rmin, rmax = min(float(rmin), 0.0), max(float(rmax), 0.0)
    if symmetric:
        a = max(abs(rmin), abs(rmax))
        scale = a / ((qmax - qmin) / 2.0)
        zp = 0 if dtype == DType.INT8 else (qmin + qmax + 1) // 2
    else:
        scale = (rmax - rmin) / float(qmax - qmin)
        zp = (
            int(np.clip(np.round(qmin - rmin / scale), qmin, qmax))
            if scale > 0
            else (0 if qmin < 0 else qmin)
        )
    scale = max(scale, MIN_SCALE)
    return QParams(np.array(scale, np.float32), np.array(zp, dtype.numpy), dtype)


def weight_params(w: np.ndarray, axis: int | None, dtype: DType = DType.INT8) -> QParams:
    """Symmetric parameters for weights: per channel along ``axis``, or per tensor if axis is None."""
    qmax = QRANGE[dtype][1]
    if axis is None:
        a = float(np.max(np.abs(w))) if w.size else 0.0
        scale = np.array(max(a / qmax, MIN_SCALE), np.float32)
        return QParams(scale, np.zeros((), dtype.numpy), dtype)
    moved = np.moveaxis(np.abs(w.astype(np.float64)), axis, 0).reshape(w.shape[axis], -1)
    amax = moved.max(axis=1) if moved.shape[1] else np.zeros(w.shape[axis])
    scale = np.maximum(amax / qmax, MIN_SCALE).astype(np.float32)
    return QParams(scale, np.zeros(w.shape[axis], dtype.numpy), dtype, axis)


def bias_params(x_scale: np.ndarray, w: QParams) -> QParams:
    """int32 bias parameters with s_b = s_x * s_w (per output channel when the weights are)."""
    scale = (np.float32(x_scale) * w.scale.astype(np.float32)).astype(np.float32)
    scale = np.maximum(scale, np.float32(MIN_SCALE))
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
