"""Scale and zero point from a float range, as onnxruntime's ``compute_scale_zp`` computes them.

For integer levels ``[qmin, qmax]`` (``qmin <= 0 <= qmax``) and a range ``[rmin, rmax]``::

    rmin' = min(rmin, 0),  rmax' = max(rmax, 0)                  # 0 must be exact
    symmetric: rmax' = max(|rmin'|, |rmax'|),  rmin' = -rmax'
    s = (rmax' - rmin') / (qmax - qmin)          (float64, stored as float32)
    z = round((qmin + qmax) / 2)  if symmetric   else  round(qmin - rmin' / s)

``round`` is half-to-even. A range so narrow that ``s`` is below float32's smallest normal
(an all-zero tensor) gets onnxruntime's fallback ``s = 1, z = 0``. Quantization is then
``q = clip(round(r / s) + z, qmin, qmax)`` and ``r ~ s (q - z)``.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.types import DType

__all__ = ["qrange", "compute_scale_zero_point"]

_RANGES: dict[DType, tuple[int, int]] = {
    DType.UINT8: (0, 255),
    DType.INT8: (-128, 127),
    DType.UINT16: (0, 65535),
    DType.INT16: (-32768, 32767),
}
_SYMMETRIC_RANGES: dict[DType, tuple[int, int]] = {DType.INT8: (-127, 127), DType.INT16: (-32767, 32767)}


def qrange(dtype: DType, *, symmetric: bool) -> tuple[int, int]:
    """onnxruntime's ``(qmin, qmax)`` for an integer type: signed symmetric drops the lowest level.

    Raises:
        ValueError: ``dtype`` is not UINT8, INT8, UINT16 or INT16.
    """
    if symmetric and dtype in _SYMMETRIC_RANGES:
        return _SYMMETRIC_RANGES[dtype]
    if dtype not in _RANGES:
        raise ValueError(f"no quantization range for {dtype.name}")
    return _RANGES[dtype]


def compute_scale_zero_point(
    rmin: float | np.ndarray, rmax: float | np.ndarray, qmin: int, qmax: int, *, symmetric: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Scale (float32) and zero point (int64) for each ``[rmin, rmax]`` (scalars or per-channel arrays).

    Args:
        rmin: Range minima, float32 (per tensor, or one per channel).
        rmax: Range maxima, broadcastable with ``rmin``.
        qmin: Lowest integer level, ``<= 0``.
        qmax: Highest integer level, ``>= 0``.
        symmetric: Symmetrise the range about 0 and centre the zero point.

    Returns:
        ``(scale, zero_point)`` arrays of the broadcast shape; bit-identical to onnxruntime.
    """
    if qmin > 0 or qmax < 0 or qmin >= qmax:
        raise ValueError(f"need qmin <= 0 <= qmax and qmin < qmax, got [{qmin}, {qmax}]")
    lo = np.minimum(np.asarray(rmin, dtype=np.float32), np.float32(0))
    hi = np.maximum(np.asarray(rmax, dtype=np.float32), np.float32(0))
    if symmetric:
        hi = np.maximum(np.abs(lo), np.abs(hi))
        lo = -hi
    scale = (hi.astype(np.float64) - lo.astype(np.float64)) / float(qmax - qmin)
    tiny = scale < np.finfo(np.float32).tiny
    safe = np.where(tiny, 1.0, scale)
    if symmetric:
        zp = np.broadcast_to(np.round((qmin + qmax) / 2.0), safe.shape)
    else:
        zp = np.round(qmin - lo.astype(np.float64) / safe)
    zero_point = np.where(tiny, 0, zp).astype(np.int64)
    return np.where(tiny, np.float32(1), scale.astype(np.float32)).astype(np.float32), zero_point
