"""SmoothQuant's α search: the int8 error of a group's readers, held out over folds of the samples.

For a group X [..., K] read by W_1 .. W_R and a candidate α (or no smoothing, s = 1), each fold F
of the calibration samples is scored with what the other samples T would give a compile:

    s = max_T|X_j|^α / max|W_j|^(1-α),   q_x on the --calib-method range of X_T / s,
    SQNR_r(α) = 10 log10(Σ_F Σ (X_F W_r)² / Σ_F Σ (q_x(X_F / s) q_w(diag(s) W_r) - X_F W_r)²),

q_w per output channel (or per tensor); the score is min_r SQNR_r. Sample i is in fold i mod
:data:`FOLDS` (one sample: it is scored on itself). Holding out matters: s and the range fitted
to the rows they are scored on reward removing every channel's headroom (α near 1), which an
unseen input then pays for in clipping (GPT-2 on 8 calibration samples: -3 dB at the output).

q_x's range is that of the calibration method's observer (:mod:`compiler.calibration`) fed the
fold's kept rows of X / s, plus X / s's extremes over all its samples where no kept row holds
them (so minmax is exact). At most :data:`ROW_CAP` rows of X per group are kept (evenly over the
samples); the search is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.calibration.methods import CalibMethod
from compiler.calibration.observers import make_observer
from compiler.ir.graph import Graph
from compiler.ir.types import DType
from compiler.quant.calibrate import SampleSource, graph_runner
from compiler.quant.params import QParams, dequantize, quantize, range_params, weight_params

__all__ = ["ROW_CAP", "FOLDS", "SearchSetting", "GroupRows", "collect", "smoothing_scales", "Scorer"]

ROW_CAP = 2048
FOLDS = 4
_S_MIN, _S_MAX = 1e-5, 1e5  # s is clamped: a dead channel must not blow a weight row up


@dataclass(frozen=True)
class SearchSetting:
    """How X and W are quantized in the score: the compile's int8 options."""

    act_dtype: DType = DType.UINT8
    symmetric: bool = False
    per_channel: bool = True
    method: CalibMethod = field(default_factory=CalibMethod)


@dataclass
class GroupRows:
    """One group's X per sample: per-channel min and max, and the kept rows."""

    lo: list[np.ndarray] = field(default_factory=list)
    hi: list[np.ndarray] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)

    def xmax(self, samples: Sequence[int] | None = None) -> np.ndarray:
        """max |X_j| over ``samples`` (all by default), float64."""
        idx = range(len(self.lo)) if samples is None else samples
        return np.max([np.maximum(np.abs(self.lo[i]), np.abs(self.hi[i])) for i in idx], axis=0)


def collect(
    graph: Graph, names: Sequence[str], channels: Sequence[int], samples: SampleSource
) -> dict[str, GroupRows]:
    """Each named value's :class:`GroupRows` over the samples (one run of the graph per sample)."""
    run = graph_runner(graph, names)
    per = max(1, ROW_CAP // max(len(samples), 1))
    stats = {n: GroupRows() for n in names}
    for feeds in samples:
        out = run(feeds)
        for name, k in zip(names, channels, strict=True):
            x = np.asarray(out[name], np.float32).reshape(-1, k)
            st = stats[name]
            st.lo.append(x.min(0).astype(np.float64))
            st.hi.append(x.max(0).astype(np.float64))
            st.rows.append(x[:: max(1, -(-len(x) // per))])
    return stats


def smoothing_scales(xmax: np.ndarray, wmax: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|X_j|^α / max|W_j|^(1-α) (float64), 1 where a channel is dead, clamped."""
    live = (xmax > 0) & (wmax > 0)
    x, w = np.where(live, xmax, 1.0), np.where(live, wmax, 1.0)
    s = np.where(live, np.power(x, alpha) / np.power(w, 1.0 - alpha), 1.0)
    return np.clip(s, _S_MIN, _S_MAX)


def _sqnr(signal: float, noise: float) -> float:
    return 999.0 if noise <= 0 else (-999.0 if signal <= 0 else 10.0 * math.log10(signal / noise))


def x_params(values: np.ndarray, cfg: SearchSetting) -> QParams:
    """q_x's grid for ``values``: the range the calibration method gives them (every pass it takes)."""
    obs = make_observer(cfg.method)
    for p in range(obs.passes):
        if p:
            obs.next_pass()
        obs.update(values)
    lo, hi = obs.range(symmetric=cfg.symmetric)
    return range_params(lo, hi, cfg.act_dtype, symmetric=cfg.symmetric)


@dataclass
class _Fold:
    xmax: np.ndarray  # max |X_j| of the fitting samples
    lo: np.ndarray  # their per-channel extremes
    hi: np.ndarray
    fit: np.ndarray  # their kept rows
    test: np.ndarray  # the held-out rows
    refs: list[np.ndarray]  # X_test W_r (float64)


class Scorer:
    """The held-out min_r SQNR_r of a group for a candidate s (see the module docstring)."""

    def __init__(self, st: GroupRows, weights: Sequence[np.ndarray], cfg: SearchSetting) -> None:
        self.weights = [np.asarray(w, np.float32) for w in weights]
        self.wmax = np.max([np.abs(w).max(axis=1) for w in self.weights], axis=0).astype(np.float64)
        self.cfg = cfg
        n = len(st.rows)
        parts = min(FOLDS, n)
        self.folds: list[_Fold] = []
        for f in range(parts):
            test = [i for i in range(n) if i % parts == f]
            fit = [i for i in range(n) if i % parts != f] or test
            x = np.concatenate([st.rows[i] for i in test])
            self.folds.append(
                _Fold(
                    st.xmax(fit),
                    np.min([st.lo[i] for i in fit], axis=0),
                    np.max([st.hi[i] for i in fit], axis=0),
                    np.concatenate([st.rows[i] for i in fit]),
                    x,
                    [x.astype(np.float64) @ w for w in self.weights],
                )
            )

    def __call__(self, alpha: float | None) -> float:
        """The score of smoothing with ``alpha`` (None: no smoothing)."""
        signal = np.zeros(len(self.weights))
        noise = np.zeros(len(self.weights))
        for fold in self.folds:
            s = np.ones_like(self.wmax) if alpha is None else smoothing_scales(fold.xmax, self.wmax, alpha)
            inv = 1.0 / s
            xs = (fold.fit * inv).astype(np.float32)
            lo, hi = np.float32((fold.lo * inv).min()), np.float32((fold.hi * inv).max())
            ends = [e for e, out in ((lo, lo < xs.min()), (hi, hi > xs.max())) if out]  # rows left out
            p = x_params(np.concatenate([xs.ravel(), np.array(ends, np.float32)]), self.cfg)
            xq = dequantize(quantize((fold.test * inv).astype(np.float32), p), p)
            for r, (w, ref) in enumerate(zip(self.weights, fold.refs, strict=True)):
                ws = (w * s[:, None]).astype(np.float32)
                wp = weight_params(ws, 1 if self.cfg.per_channel else None)
                d = (xq @ dequantize(quantize(ws, wp), wp)).astype(np.float64) - ref
                signal[r] += float(np.square(ref).sum())
                noise[r] += float(np.square(d).sum())
        return min(_sqnr(float(a), float(b)) for a, b in zip(signal, noise, strict=True))
