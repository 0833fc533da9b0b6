"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights before int8.

For the readers of an activation X [..., K] (MatMul / Gemm with constant weights W) and s > 0 in R^K,

    X W = (X diag(s)^-1) (diag(s) W),    s_j = max|X_j|^α / max|W_j|^(1-α),

max|X_j| over the calibration samples, max|W_j| over row j of every reader's W (q, k and v share
one s). X diag(s)^-1 is folded into X's producer, so no op is added (:func:`find_groups`):

* LayerNormalization(x, γ, β) over the last axis: γ / s, β / s (RMSNormalization: γ / s);
* x ⊙ c (Mul by a constant along the last axis): c / s; and (x ⊙ c) + b, or any foldable
  producer + b: b / s as well (the affine tail of a decomposed LayerNorm, a linear layer's bias);
* a MatMul/Gemm with a constant weight: its output columns W_p[:, j] / s_j (and its bias C_j / s_j);
* any of these seen through ops that move values without mixing the last axis (a Gather of the
  class token, a reshape keeping the channels: :func:`compiler.ops.quant_rules.keeps_last_axis`).

Every reader of X must absorb s into its weight rows (MatMul(X, W), Gemm(X, B) without transA);
another reader (a residual Add, a graph output) leaves X as it is, with the reason recorded.

α is fixed (``--smoothquant 0.5``) or, with ``auto``, searched per group over :data:`ALPHAS` and no
smoothing at all, by the int8 error of the group's readers on the calibration samples:

    SQNR_r(α) = 10 log10(Σ (X W_r)² / Σ (q_x(X / s) q_w(diag(s) W_r) - X W_r)²),

q_x per tensor on X / s's calibrated [min, max] (minmax, whatever ``--calib-method``), q_w per
output channel; the candidate with the largest min_r SQNR_r wins (so a group is never smoothed
to a worse measured error than none). At most :data:`ROW_CAP` rows of X per group are kept.
Folding is exact in real arithmetic; in float32 each folded constant rounds once (~1e-7 relative).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.quant_rules import keeps_last_axis
from compiler.quant.calibrate import SampleSource, graph_runner
from compiler.quant.params import dequantize, quantize, range_params, weight_params
from compiler.quant.plan import node_label

__all__ = [
    "ALPHAS",
    "ROW_CAP",
    "Site",
    "SmoothGroup",
    "SmoothReport",
    "find_groups",
    "smoothing_scales",
    "smooth_quant",
]

log = logging.getLogger(__name__)

ALPHAS = tuple(round(0.05 * i, 2) for i in range(21))
ROW_CAP = 2048
_S_MIN, _S_MAX = 1e-5, 1e5  # s is clamped: a dead channel must not blow a weight row up
_SMOOTH = 1e-4  # max |log s| of a group that is smooth already (a second run: s = 1 up to rounding)
_GAIN_DB = 0.01  # auto smooths a group when that gains more than this over no smoothing
_NORMS = ("LayerNormalization", "RMSNormalization")


@dataclass(frozen=True)
class Site:
    """The constant input ``port`` of node ``node``, multiplied by s**power along its ``axis``."""

    node: int
    port: int
    axis: int
    power: int  # -1: the producer's side (X / s); +1: a reader's weight rows (s W)


@dataclass
class SmoothGroup:
    """One smoothable activation: its producer's fold, its readers, and what was chosen."""

    x: str
    producer: str
    fold: str
    readers: list[int]
    sites: list[Site]
    channels: int
    alpha: float | None = None
    sqnr_db: dict[str, float] = field(default_factory=dict)
    scale_range: tuple[float, float] = (1.0, 1.0)

    def as_json(self, graph: Graph) -> dict[str, Any]:
        """Manifest form (dB to 2 decimals)."""
        return {
            "x": self.x,
            "producer": self.producer,
            "fold": self.fold,
            "readers": [node_label(graph.node(n)) for n in self.readers],
            "alpha": self.alpha,
            "sqnr_db": {k: round(v, 2) for k, v in self.sqnr_db.items()},
            "scale_range": [float(f"{v:.4g}") for v in self.scale_range],
        }


@dataclass
class SmoothReport:
    """What ``smooth-quant`` did: the groups (smoothed or not) and the layers it could not reach."""

    alpha: str
    groups: list[dict[str, Any]] = field(default_factory=list)
    not_smoothed: dict[str, str] = field(default_factory=dict)
    samples: int = 0

    def as_json(self) -> dict[str, Any]:
        """Manifest form."""
        doc: dict[str, Any] = {"alpha": self.alpha, "calibration_samples": self.samples}
        if self.alpha == "auto":
            doc["grid"] = list(ALPHAS)
        doc["groups"] = self.groups
        doc["not_smoothed"] = dict(sorted(self.not_smoothed.items()))
        return doc


# ------------------------------------------------------------------------------------ structure
def _const(v: Value | None) -> np.ndarray | None:
    c = v.const if v is not None else None
    return c if c is not None and c.dtype.kind == "f" else None


def _linear(graph: Graph, node: Node) -> bool:
    """A MatMul/Gemm whose input 1 is a constant float 2-D weight."""
    ins = graph.inputs_of(node)
    w = _const(ins[1]) if len(ins) > 1 else None
    return not node.domain and node.op in ("MatMul", "Gemm") and w is not None and w.ndim == 2


def _reader_site(graph: Graph, node: Node, port: int, k: int) -> Site | str:
    """Where reader ``node`` absorbs s (its weight rows), or why it cannot."""
    what = f"{node.qualified_op} '{node_label(node)}' (input {port})"
    if port != 0 or not _linear(graph, node):
        return f"also read by {what}, which has no weight rows to absorb s"
    if node.op == "Gemm" and node.attrs.transA:
        return f"also read by {what} with transA=1"
    w = _const(graph.inputs_of(node)[1])
    assert w is not None
    axis = 1 if node.op == "Gemm" and node.attrs.transB else 0
    if w.shape[axis] != k:
        return f"{what}: weight rows {w.shape[axis]} != {k} channels"
    return Site(node.id, 1, axis, 1)


def _channel_const(c: np.ndarray | None, k: int, *, rows: bool = False) -> bool:
    """A constant broadcast along the last axis only: () or [1, ..., 1, K] ([..., K] with ``rows``)."""
    if c is None:
        return False
    if c.ndim == 0:
        return True
    return c.shape[-1] == k and (rows or math.prod(c.shape[:-1]) == 1)


def _sole_reader(graph: Graph, v: Value, node: Node) -> bool:
    return not graph.is_output(v) and all(u.id == node.id for u, _ in graph.users(v))


def _producer_sites(graph: Graph, v: Value, k: int) -> tuple[list[Site], str] | str:
    """The constants of ``v``'s producer that absorb 1/s, and the fold's name; or why there are none."""
    p = v.producer
    ins = graph.inputs_of(p)
    what = f"{p.qualified_op} '{node_label(p)}'"
    if not p.domain and p.op in _NORMS and v.port == 0:
        if p.attrs.axis not in (-1, len(v.type.shape or ()) - 1):
            return f"produced by {what}, which normalizes over more than the channel axis"
        sites = []
        for port in (1, 2) if p.op == "LayerNormalization" else (1,):
            if port < len(ins) and ins[port] is not None:
                if not _channel_const(_const(ins[port]), k):
                    return f"produced by {what}, whose input {port} is not a per-channel constant"
                sites.append(Site(p.id, port, -1, -1))
        return sites, p.op
    if not p.domain and p.op in ("Mul", "Add") and len(ins) == 2:
        consts = [i for i, x in enumerate(ins) if _channel_const(_const(x), k)]
        if len(consts) != 1 or _const(ins[1 - consts[0]]) is not None:
            return f"produced by {what} without one per-channel constant operand"
        site = Site(p.id, consts[0], -1, -1)
        if p.op == "Mul":
            return [site], "Mul"
        a = ins[1 - consts[0]]
        assert a is not None
        if not _sole_reader(graph, a, p):
            return f"produced by {what}, whose other input is read elsewhere too"
        inner = _producer_sites(graph, a, k)
        if isinstance(inner, str):
            return inner
        return [*inner[0], site], f"{inner[1]}+Add"
    if _linear(graph, p) and v.port == 0:
        w = _const(ins[1])
        assert w is not None
        axis = 0 if p.op == "Gemm" and p.attrs.transB else 1
        if w.shape[axis] != k:
            return f"produced by {what} with {w.shape[axis]} output columns"
        sites = [Site(p.id, 1, axis, -1)]
        if p.op == "Gemm" and len(ins) > 2 and ins[2] is not None:
            if not _channel_const(_const(ins[2]), k, rows=True):
                return f"produced by {what}, whose bias is not constant"
            sites.append(Site(p.id, 2, -1, -1))
        return sites, p.op
    if keeps_last_axis(graph, p):  # a Gather of the class token, a reshape keeping the channels
        a = ins[0]
        assert a is not None
        if not _sole_reader(graph, a, p):
            return f"produced by {what}, whose input is read elsewhere too"
        inner = _producer_sites(graph, a, k)
        return inner if isinstance(inner, str) else (inner[0], f"{inner[1]}>{p.op}")
    return f"produced by {what}, which has no per-channel parameters to fold 1/s into"


def _group(graph: Graph, x: Value) -> SmoothGroup | str:
    shape = x.type.shape
    if x.type.dtype != DType.FLOAT32 or not shape or not isinstance(shape[-1], int):
        return f"{x.name!r} is not float32 with a static channel dim"
    k = int(shape[-1])
    if graph.is_output(x):
        return f"{x.name!r} is also a graph output"
    sites: list[Site] = []
    for user, port in graph.users(x):
        site = _reader_site(graph, user, port, k)
        if isinstance(site, str):
            return site
        sites.append(site)
    prod = _producer_sites(graph, x, k)
    if isinstance(prod, str):
        return prod
    readers = [s.node for s in sites]
    return SmoothGroup(x.name, node_label(x.producer), prod[1], readers, prod[0] + sites, k)


def find_groups(graph: Graph) -> tuple[list[SmoothGroup], dict[str, str]]:
    """The smoothable activations (topological order) and, by layer, why the others are not."""
    groups: list[SmoothGroup] = []
    skipped: dict[str, str] = {}
    seen: set[tuple[int, int]] = set()
    for node in graph.ops():
        if not _linear(graph, node):
            continue
        x = graph.inputs_of(node)[0]
        assert x is not None
        if (x.node, x.port) in seen:
            continue
        seen.add((x.node, x.port))
        found = _group(graph, x)
        if isinstance(found, str):
            for user, _ in graph.users(x):
                if _linear(graph, user):
                    skipped[node_label(user)] = found
        else:
            groups.append(found)
    return groups, skipped


# ---------------------------------------------------------------------------------- measurement
@dataclass
class _Stats:
    lo: np.ndarray
    hi: np.ndarray
    rows: list[np.ndarray] = field(default_factory=list)


def _collect(graph: Graph, groups: Sequence[SmoothGroup], samples: SampleSource) -> dict[str, _Stats]:
    """Per-channel min/max of every group's X over the samples, and up to ROW_CAP of its rows."""
    names = [g.x for g in groups]
    run = graph_runner(graph, names)
    per = max(1, ROW_CAP // max(len(samples), 1))
    stats: dict[str, _Stats] = {}
    for feeds in samples:
        out = run(feeds)
        for g in groups:
            x = np.asarray(out[g.x], np.float32).reshape(-1, g.channels)
            st = stats.get(g.x)
            if st is None:
                st = stats[g.x] = _Stats(x.min(0).astype(np.float64), x.max(0).astype(np.float64))
            else:
                st.lo, st.hi = np.minimum(st.lo, x.min(0)), np.maximum(st.hi, x.max(0))
            st.rows.append(x[:: max(1, -(-len(x) // per))])
    return stats


def smoothing_scales(xmax: np.ndarray, wmax: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|X_j|^α / max|W_j|^(1-α) (float64), 1 where a channel is dead, clamped."""
    live = (xmax > 0) & (wmax > 0)
    x, w = np.where(live, xmax, 1.0), np.where(live, wmax, 1.0)
    s = np.where(live, np.power(x, alpha) / np.power(w, 1.0 - alpha), 1.0)
    return np.clip(s, _S_MIN, _S_MAX)


@dataclass(frozen=True)
class _Setting:
    act_dtype: DType
    symmetric: bool
    per_channel: bool


def _sqnr(signal: float, noise: float) -> float:
    return 999.0 if noise <= 0 else (-999.0 if signal <= 0 else 10.0 * math.log10(signal / noise))


def _score(
    rows: np.ndarray, st: _Stats, weights: Sequence[np.ndarray], s: np.ndarray, cfg: _Setting
) -> float:
    """min over readers of SQNR(q_x(X / s) q_w(diag(s) W), X W), X the kept rows."""
    inv = 1.0 / s
    p = range_params(
        float((st.lo * inv).min()), float((st.hi * inv).max()), cfg.act_dtype, symmetric=cfg.symmetric
    )
    xq = dequantize(quantize((rows * inv).astype(np.float32), p), p)
    worst = math.inf
    for w in weights:
        ref = rows @ w
        ws = (w * s[:, None]).astype(np.float32)
        wp = weight_params(ws, 1 if cfg.per_channel else None)
        d = (xq @ dequantize(quantize(ws, wp), wp)).astype(np.float64) - ref
        worst = min(worst, _sqnr(float(np.square(ref, dtype=np.float64).sum()), float(np.square(d).sum())))
    return worst


def _weights(graph: Graph, group: SmoothGroup) -> list[np.ndarray]:
    """Each reader's current weight as [K, N] float32."""
    out = []
    for site in group.sites:
        if site.power == 1:
            w = _const(graph.inputs_of(graph.node(site.node))[site.port])
            assert w is not None
            out.append(np.asarray(w.T if site.axis == 1 else w, np.float32))
    return out


def _apply(graph: Graph, group: SmoothGroup, s: np.ndarray) -> None:
    """Fold s: producer constants times s**-1, reader weight rows times s (new constants)."""
    for site in group.sites:
        node = graph.node(site.node)
        v = graph.inputs_of(node)[site.port]
        c = _const(v)
        assert v is not None and c is not None
        c64 = np.full(s.shape, float(c), np.float64) if c.ndim == 0 else c.astype(np.float64)
        shape = [1] * c64.ndim
        shape[site.axis] = -1
        new = (c64 * np.power(s, site.power).reshape(shape)).astype(c.dtype)
        graph.set_input(node, site.port, graph.add_constant(new, f"{v.name}_smooth"))
        if not graph.has_users(v.producer) and not graph.is_output(v):
            graph.remove(v.producer)


def smooth_quant(
    graph: Graph,
    alpha: float | None,
    samples: SampleSource,
    *,
    act_dtype: DType = DType.UINT8,
    symmetric: bool = False,
    per_channel: bool = True,
) -> SmoothReport:
    """Smooth every foldable group of ``graph`` in place; ``alpha`` None searches it per group."""
    groups, skipped = find_groups(graph)
    report = SmoothReport(
        "auto" if alpha is None else f"{alpha:g}", not_smoothed=skipped, samples=len(samples)
    )
    if not groups or not len(samples):
        return report
    cfg = _Setting(act_dtype, symmetric, per_channel)
    stats = _collect(graph, groups, samples)
    for g in groups:
        st = stats[g.x]
        rows = np.concatenate(st.rows)
        weights = _weights(graph, g)
        xmax = np.maximum(np.abs(st.lo), np.abs(st.hi))
        wmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0).astype(np.float64)
        off = _score(rows, st, weights, np.ones(g.channels), cfg)
        grid = ALPHAS if alpha is None else (alpha,)
        tried = {a: _score(rows, st, weights, smoothing_scales(xmax, wmax, a), cfg) for a in grid}
        best = max(tried, key=lambda a: (tried[a], -a))
        g.sqnr_db = {"off": off, f"{best:g}": tried[best]}
        s = smoothing_scales(xmax, wmax, best)
        smooth = float(np.abs(np.log(s)).max()) <= _SMOOTH  # already smoothed with this alpha
        if not smooth and (alpha is not None or tried[best] > off + _GAIN_DB):
            _apply(graph, g, s)
            g.alpha, g.scale_range = best, (float(s.min()), float(s.max()))
        log.info("smooth-quant %s: alpha %s, %s", g.x, g.alpha, g.sqnr_db)
        report.groups.append(g.as_json(graph))
    return report
