"""Numerical agreement metrics between a result and a reference tensor."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Agreement", "agreement"]


@dataclass(frozen=True)
class Agreement:
    """How closely ``actual`` matches ``expected``.

    max_rel is max|a - e| / max(1, max|e|) (a scale-aware relative error);
    sqnr_db is 10*log10(sum(e^2) / sum((a-e)^2)), inf when exact.
    """

    max_abs: float
    max_rel: float
    cosine: float
    sqnr_db: float
    shape_ok: bool

    def as_dict(self) -> dict[str, float | bool]:
        """JSON-friendly dict (inf becomes a large finite number)."""
        return {
            k: (round(v, 9) if isinstance(v, float) and np.isfinite(v) else (999.0 if v else v))
            for k, v in asdict(self).items()
        }


def agreement(actual: np.ndarray, expected: np.ndarray) -> Agreement:
    """Compare two tensors in float64."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return Agreement(float("inf"), float("inf"), 0.0, float("-inf"), False)
    if a.size == 0:
        return Agreement(0.0, 0.0, 1.0, float("inf"), True)
    both_nan = np.isnan(a) & np.isnan(e)
    same_inf = np.isinf(a) & np.isinf(e) & (np.sign(a) == np.sign(e))
    ok = both_nan | same_inf
    a = np.where(ok, 0.0, a)
    e = np.where(ok, 0.0, e)
    diff = np.abs(a - e)
    max_abs = float(np.max(diff)) if np.all(np.isfinite(diff)) else float("inf")
    scale = max(1.0, float(np.max(np.abs(e))) if np.all(np.isfinite(e)) else 1.0)
    noise = float(np.sum(diff**2))
    signal = float(np.sum(e**2))
    sqnr = float("inf") if noise == 0 else (10 * np.log10(signal / noise) if signal > 0 else float("-inf"))
    na, ne = float(np.linalg.norm(a)), float(np.linalg.norm(e))
    if na == 0 and ne == 0:
        cos = 1.0
    elif na == 0 or ne == 0:
        cos = 0.0
    else:
        cos = float(np.dot(a.ravel(), e.ravel()) / (na * ne))
    return Agreement(max_abs, max_abs / scale, cos, sqnr, True)
