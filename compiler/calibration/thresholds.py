"""Range searches over a calibration histogram: percentile, entropy (KL) and mse.

All take a :class:`~compiler.calibration.histogram.Histogram` ``(h, e, lo, hi)`` with
counts ``h_0..h_{n-1}``, edges ``e_0..e_n`` and raw data extremes ``lo, hi``, and return a
calibrated range clipped into ``[lo, hi]``. Percentile and entropy re-implement
onnxruntime's ``HistogramCollector.compute_percentile`` / ``get_entropy_threshold``,
including their float32 arithmetic, so that they return the same floats.
"""

from __future__ import annotations

import numpy as np

from compiler.calibration.histogram import Histogram

__all__ = ["percentile_range", "entropy_range", "mse_range", "MSE_TOLERANCE"]

_F32 = np.float32


def _clip(h: Histogram, lo: np.float32, hi: np.float32) -> tuple[np.float32, np.float32]:
    return (h.min if lo < h.min else _F32(lo)), (h.max if hi > h.max else _F32(hi))


def percentile_range(h: Histogram, percentile: float, *, symmetric: bool) -> tuple[np.float32, np.float32]:
    """onnxruntime's percentile threshold.

    With ``F = cumsum(h) / sum(h)`` and ``idx(q) = min{k : F_k >= q}``, the range is
    ``[-e_idx(P/100), e_idx(P/100)]`` for a symmetric (``|x|``) histogram, else
    ``[e_idx(c), e_idx(1 - c)]`` with ``c = (100 - P) / 200``; then clipped to ``[lo, hi]``.
    The edge taken is the bin's left edge, as in onnxruntime.
    """
    total = h.hist.sum()
    if total == 0:
        return h.min, h.max
    cdf = np.cumsum(h.hist / total)
    if symmetric:
        t = h.edges[np.searchsorted(cdf, percentile / 100.0)]
        return _clip(h, -t, t)
    cut = (100.0 - percentile) / 200.0
    return _clip(h, h.edges[np.searchsorted(cdf, cut)], h.edges[np.searchsorted(cdf, 1.0 - cut)])


def _smooth(p: np.ndarray, eps: float = 0.0001) -> np.ndarray | None:
    """onnxruntime's ``smooth_distribution``: zeros become ``eps``, paid for by the non-zeros."""
    is_zeros = (p == 0).astype(np.float32)
    is_nonzeros = (p != 0).astype(np.float32)
    n_zeros = is_zeros.sum()
    n_nonzeros = p.size - n_zeros
    if not n_nonzeros:
        return None
    eps1 = eps * float(n_zeros) / float(n_nonzeros)
    hist = p.astype(np.float32)
    hist += eps * is_zeros + (-eps1) * is_nonzeros
    if eps1 >= 1.0 or (hist <= 0).any():  # onnxruntime asserts here; Kiln rejects the candidate
        return None
    return hist


def _kl(p: np.ndarray, q: np.ndarray) -> np.float32:
    """``sum p' log(p'/q')`` of the normalised float32 ``p, q`` (onnxruntime's ``entropy``)."""
    pk = 1.0 * p / np.sum(p, axis=0, keepdims=True)
    qk = 1.0 * q / np.sum(q, axis=0, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        res = pk * np.log(pk / qk)
    res[(pk == 0) & (qk >= 0)] = 0
    res[~((pk > 0) & (qk > 0))] = np.inf
    return _F32(np.sum(res, axis=0))


def entropy_range(h: Histogram, num_quantized_bins: int) -> tuple[np.float32, np.float32]:
    """onnxruntime's entropy (TensorRT KL) threshold over a signed histogram.

    With ``z = n // 2`` and ``m = num_quantized_bins``, for each ``i`` in ``m//2 .. z`` the
    candidate keeps bins ``[z - i, min(z + i + 1, n))``. ``P`` is that slice with the
    outlier counts added to its end bins; ``Q`` merges the slice into ``m`` groups of
    ``g = len // m`` bins (the remainder joins the last group), and spreads each group's
    sum evenly (truncated to an int) over the group's bins where ``P != 0``. Both are
    smoothed (zeros -> 1e-4) and the candidate minimising ``KL(P || Q)`` wins; its edges
    ``(e_{z-i}, e_{end})`` are clipped to ``[lo, hi]``. onnxruntime's quirk is kept: the
    remainder bins beyond ``m g`` get ``Q = 0`` before smoothing.

    With the defaults (128 bins, 128 quantized bins) there is one candidate, the whole
    histogram, so the range is exactly ``[lo, hi]``.
    """
    hist = h.hist.astype(np.int64)
    n = hist.size
    zero, half_q = n // 2, num_quantized_bins // 2
    if zero < half_q:
        raise ValueError(f"entropy needs at least {num_quantized_bins} bins, the histogram has {n}")
    cum = np.concatenate(([0], np.cumsum(hist)))
    kl = np.zeros(zero - half_q + 1)
    for i in range(half_q, zero + 1):
        start, end = zero - i, min(zero + i + 1, n)
        sliced = hist[start:end]
        p = sliced.copy()
        p[0] += cum[start]
        p[-1] += cum[n] - cum[end]
        group = sliced.size // num_quantized_bins
        used = group * num_quantized_bins
        qbins = sliced[:used].reshape(num_quantized_bins, group).sum(axis=1)
        qbins[-1] += sliced[used:].sum()
        norm = (p[:used] != 0).reshape(num_quantized_bins, group).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            spread = np.where(norm != 0, qbins / np.maximum(norm, 1), 0.0).astype(np.int64)
        q = np.zeros(p.size, dtype=np.int64)
        q[:used] = np.repeat(spread, group)
        ps, qs = _smooth(p), _smooth(q)
        kl[i - half_q] = np.inf if ps is None or qs is None else _kl(ps, qs)
    best = int(np.argmin(kl)) + half_q
    return _clip(h, h.edges[zero - best], h.edges[min(zero + best + 1, n)])


MSE_TOLERANCE = 0.01  # relative slack of the mse search in favour of wider ranges


def _widest(err: np.ndarray, width: np.ndarray) -> int:
    """Flat index of the widest candidate whose error is within ``MSE_TOLERANCE`` of the least."""
    ok = err <= err.min() * (1.0 + MSE_TOLERANCE)
    return int(np.argmax(np.where(ok, width, -np.inf)))


def _subsample(k: int, limit: int) -> np.ndarray:
    return np.unique(np.linspace(0, k - 1, min(k, limit)).round().astype(np.intp))


def mse_range(h: Histogram, zero_count: int, *, symmetric: bool, bits: int) -> tuple[np.float32, np.float32]:
    """Kiln's mse range: the clipping range of least expected squared quantisation error.

    Bins have centres ``c_j``, widths ``w_j`` and counts ``h_j`` (exact zeros, always
    representable, are taken out of the bin holding 0). For a candidate range ``[a, b]``
    (``a <= 0 <= b``) with step ``D = (b - a) / S`` (``S = 2^bits - 1``; symmetric:
    ``a = -b`` and ``S = 2^bits - 2``)::

        E(a, b) = sum_{c_j < a} h_j ((c_j - a)^2 + w_j^2/12)
                + sum_{c_j > b} h_j ((c_j - b)^2 + w_j^2/12)
                + (sum_{a <= c_j <= b} h_j) D^2 / 12

    ``a`` ranges over ``lo`` and the edges in ``(lo, 0]``, ``b`` over ``hi`` and the edges in
    ``[0, hi)`` (prefix sums make each ``E`` O(1)); an asymmetric search scans a 129 x 129
    grid and then every pair in the neighbourhood of the coarse optimum. Of the candidates
    with ``E <= (1 + MSE_TOLERANCE) min E`` the widest wins: ``E`` is flat near its minimum,
    and the wider range costs under 1% on the calibration data while it clips less of the
    tails of unseen data. The ``D^2/12`` term assumes values spread within a step; data on a
    lattice (0..255 pixels) is exact under minmax and may be clipped by a step here.
    """
    lo, hi = float(h.min), float(h.max)
    n = h.hist.size
    counts = h.hist.astype(np.float64)
    edges = h.edges.astype(np.float64)
    if edges[0] <= 0.0 <= edges[-1]:
        zb = min(int(np.searchsorted(edges, 0.0, side="right")) - 1, n - 1)
        counts[zb] = max(counts[zb] - zero_count, 0.0)
    if counts.sum() == 0 or lo == hi:
        return h.min, h.max
    c = 0.5 * (edges[:-1] + edges[1:])
    pre = [
        np.concatenate(([0.0], np.cumsum(v)))
        for v in (counts, counts * c, counts * c * c, counts * np.diff(edges) ** 2 / 12.0)
    ]

    def left(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        j = np.searchsorted(c, a, side="left")
        s0, s1, s2, sw = (p[j] for p in pre)
        return s2 - 2.0 * a * s1 + a * a * s0 + sw, s0

    def right(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = np.searchsorted(c, b, side="right")
        s0, s1, s2, sw = (p[n] - p[k] for p in pre)
        return s2 - 2.0 * b * s1 + b * b * s0 + sw, s0

    total = pre[0][n]
    if symmetric:
        amax = max(abs(lo), hi)
        cand = np.unique(np.append(np.abs(edges[(np.abs(edges) > 0) & (np.abs(edges) < amax)]), amax))
        el, nl = left(-cand)
        er, nr = right(cand)
        step = 2.0 * cand / (2**bits - 2)
        err = el + er + (total - nl - nr) * step * step / 12.0
        b = _F32(cand[_widest(err, cand)])
        return _clip(h, -b, b)
    steps = 2**bits - 1
    ca = np.unique(np.append(edges[(edges > lo) & (edges <= 0.0)], [min(lo, 0.0), 0.0]))
    cb = np.unique(np.append(edges[(edges >= 0.0) & (edges < hi)], [max(hi, 0.0), 0.0]))

    def search(ia: np.ndarray, ib: np.ndarray) -> tuple[float, int, int]:
        el, nl = left(ca[ia])
        er, nr = right(cb[ib])
        d = (cb[ib][None, :] - ca[ia][:, None]) / steps
        err = el[:, None] + er[None, :] + (total - nl[:, None] - nr[None, :]) * d * d / 12.0
        k = _widest(err, d)
        return float(err.flat[k]), int(ia[k // ib.size]), int(ib[k % ib.size])

    sa, sb = _subsample(ca.size, 129), _subsample(cb.size, 129)
    _, ba, bb = search(sa, sb)
    pa, pb = int(np.searchsorted(sa, ba)), int(np.searchsorted(sb, bb))
    wa = np.arange(sa[max(pa - 1, 0)], sa[min(pa + 1, sa.size - 1)] + 1)
    wb = np.arange(sb[max(pb - 1, 0)], sb[min(pb + 1, sb.size - 1)] + 1)
    _, ba, bb = search(wa, wb)
    return _clip(h, _F32(ca[ba]), _F32(cb[bb]))
