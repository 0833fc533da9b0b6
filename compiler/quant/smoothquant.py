"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights before int8.

For the readers of an activation X [..., K] (MatMul / Gemm with constant weights W) and s > 0 in R^K,

    X W = (X diag(s)^-1) (diag(s) W),    s_j = max|X_j|^α / max|W_j|^(1-α),

max|X_j| over the calibration samples, max|W_j| over row j of every reader's W (q, k and v share
one s). X diag(s)^-1 is folded into X's producer, so no op is added (:func:`find_groups`):

* LayerNormalization(x, γ, β) over the last axis: γ / s, β / s (RMSNormalization: γ / s);
* x ⊙ c (Mul by a constant along the last axis): c / s; and (x ⊙ c) + b, or any foldable
  producer + b: b / s as well (the affine tail of a decomposed LayerNorm, a linear layer's bias);
* a MatMul/Gemm with a constant weight: its output columns W_p[:, j] / s_j (and its bias C_j / s_j);
* any of these reached through ops that move values or mix tokens but not channels
  (:mod:`compiler.quant.smooth_paths`: reshapes, transposes, a Gather of the class token, a Split,
  and a MatMul of two computed operands whose other operand mixes the rows). This is attention's
  value path: out_proj's input ctx = merge_heads(softmax(Q K^T) V) is linear in V per channel,
  so ctx / s = merge_heads(softmax(Q K^T) (V / s')), s' the same scales in V's head layout, and
  1/s folds into V's projection columns W_v[:, j] / s_j and bias b_v,j / s_j (through the Split
  of a fused qkv projection: only V's columns). A path that carries a channel onto a token axis
  (a reshape merging tokens, a MatMul contracting the channels) ends the search: nothing is folded.

Every reader of X must absorb s into its weight rows (MatMul(X, W), Gemm(X, B) without transA);
another reader (a residual Add, a graph output) leaves X as it is, with the reason recorded.

α is fixed (``--smoothquant 0.5``) or, with ``auto``, searched per group over :data:`ALPHAS` and no
smoothing at all, by the int8 error of the group's readers (:mod:`compiler.quant.smooth_search`):

    SQNR_r(α) = 10 log10(Σ (X W_r)² / Σ (q_x(X / s) q_w(diag(s) W_r) - X W_r)²),

held out: each fold of the calibration samples is scored with s and q_x's range taken from the
other samples, q_x per tensor on the range that ``--calib-method`` (minmax, percentile, entropy,
mse, auto: the observers of :mod:`compiler.calibration`) gives X / s, q_w per output channel. The
candidate with the largest min_r SQNR_r wins, and auto smooths only when it beats no smoothing,
so no group is smoothed to a worse measured error than none. At most :data:`ROW_CAP` rows of X
per group are kept. With entropy a compile later checks each clipped range against the full one
(:mod:`compiler.quant.clip_check`); the search scores the clipped range. Folding is exact in real
arithmetic; in float32 each folded constant rounds once (~1e-7 relative).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.calibration.methods import CalibMethod
from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.quant.calibrate import SampleSource
from compiler.quant.plan import node_label
from compiler.quant.smooth_paths import broadcast_index, index_back, index_vector, varying_axis
from compiler.quant.smooth_search import ROW_CAP, Scorer, SearchSetting, collect, smoothing_scales

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
_SMOOTH = 1e-4  # max |log s| of a group that is smooth already (a second run: s = 1 up to rounding)
_GAIN_DB = 0.01  # auto smooths a group when that gains more than this over no smoothing
_NORMS = ("LayerNormalization", "RMSNormalization")


@dataclass(frozen=True)
class Site:
    """The constant input ``port`` of node ``node``, times s[index]**power along its ``axis``.

    ``index`` None: s itself (position j takes s_j); else position i takes s[index[i]], 1 where -1.
    """

    node: int
    port: int
    axis: int
    power: int  # -1: the producer's side (X / s); +1: a reader's weight rows (s W)
    index: tuple[int, ...] | None = None  # the channel of s per position along axis (-1: none)


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


def _fold_sites(graph: Graph, v: Value, index: np.ndarray) -> tuple[list[Site], str] | str | None:
    """The constants of ``v``'s producer that absorb 1/s[index] (a vector along the last axis)."""
    p = v.producer
    ins = graph.inputs_of(p)
    what = f"{p.qualified_op} '{node_label(p)}'"
    n = len(index)
    at = None if np.array_equal(index, np.arange(n)) else tuple(int(i) for i in index)
    if not p.domain and p.op in _NORMS and v.port == 0:
        if p.attrs.axis not in (-1, len(v.type.shape or ()) - 1):
            return f"produced by {what}, which normalizes over more than the channel axis"
        sites = []
        for port in (1, 2) if p.op == "LayerNormalization" else (1,):
            if port < len(ins) and ins[port] is not None:
                if not _channel_const(_const(ins[port]), n):
                    return f"produced by {what}, whose input {port} is not a per-channel constant"
                sites.append(Site(p.id, port, -1, -1, at))
        return sites, p.op
    if not p.domain and p.op in ("Mul", "Add") and len(ins) == 2:
        consts = [i for i, x in enumerate(ins) if _channel_const(_const(x), n)]
        if len(consts) != 1 or _const(ins[1 - consts[0]]) is not None:
            return f"produced by {what} without one per-channel constant operand"
        site = Site(p.id, consts[0], -1, -1, at)
        if p.op == "Mul":
            return [site], "Mul"
        a = ins[1 - consts[0]]
        assert a is not None
        if not _sole_reader(graph, a, p):
            return f"produced by {what}, whose other input is read elsewhere too"
        ja = broadcast_index(index.reshape((1,) * (len(v.type.shape or ()) - 1) + (n,)), _dims(v), _dims(a))
        if isinstance(ja, str):
            return f"produced by {what}: {ja}"
        inner = _producer_sites(graph, a, ja)
        if isinstance(inner, str):
            return inner
        return [*inner[0], site], f"{inner[1]}+Add"
    if _linear(graph, p) and v.port == 0:
        w = _const(ins[1])
        assert w is not None
        axis = 0 if p.op == "Gemm" and p.attrs.transB else 1
        if w.shape[axis] != n:
            return f"produced by {what} with {w.shape[axis]} output columns"
        sites = [Site(p.id, 1, axis, -1, at)]
        if p.op == "Gemm" and len(ins) > 2 and ins[2] is not None:
            if not _channel_const(_const(ins[2]), n, rows=True):
                return f"produced by {what}, whose bias is not constant"
            sites.append(Site(p.id, 2, -1, -1, at))
        return sites, p.op
    return None


def _dims(v: Value) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else -1 for d in v.type.shape or ())


def _producer_sites(graph: Graph, v: Value, j: np.ndarray) -> tuple[list[Site], str] | str:
    """The constants that absorb 1/s[j] for ``v`` (channel index ``j``, :mod:`smooth_paths`); or why none.

    A producer with per-channel constants takes s along the last axis; an op that moves values
    (:data:`~compiler.quant.smooth_paths.MOVES`) hands the index on to its input, read by it alone.
    """
    p = v.producer
    what = f"{p.qualified_op} '{node_label(p)}'"
    shape = v.type.shape
    if not shape or not isinstance(shape[-1], int):
        return f"produced by {what}, whose output has no static last dim"
    index = index_vector(j, int(shape[-1]))
    folded = _fold_sites(graph, v, index) if index is not None else None
    if folded is not None:
        return folded
    moved = index_back(graph, p, v, j)
    if moved is None or isinstance(moved, str):
        if index is None and isinstance(_fold_sites(graph, v, np.arange(int(shape[-1]))), tuple):
            return (
                f"produced by {what}, whose constants are per channel while the scale varies "
                f"along axis {varying_axis(j)} of '{v.name}'"
            )
        if moved is None:
            return f"produced by {what}, which has no per-channel parameters to fold 1/s into"
        return f"produced by {what}: {moved}"
    port, j_in = moved
    a = graph.inputs_of(p)[port]
    assert a is not None
    if not _sole_reader(graph, a, p):
        return f"produced by {what}, whose input is read elsewhere too"
    inner = _producer_sites(graph, a, j_in)
    return inner if isinstance(inner, str) else (inner[0], f"{inner[1]}>{p.op}")


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
    prod = _producer_sites(graph, x, np.arange(k).reshape((1,) * (len(shape) - 1) + (k,)))
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
        m = s if site.index is None else np.append(s, 1.0)[np.asarray(site.index)]
        c64 = np.full(m.shape, float(c), np.float64) if c.ndim == 0 else c.astype(np.float64)
        shape = [1] * c64.ndim
        shape[site.axis] = -1
        new = (c64 * np.power(m, site.power).reshape(shape)).astype(c.dtype)
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
    method: CalibMethod | None = None,
) -> SmoothReport:
    """Smooth every foldable group of ``graph`` in place; ``alpha`` None searches it per group."""
    groups, skipped = find_groups(graph)
    report = SmoothReport(
        "auto" if alpha is None else f"{alpha:g}", not_smoothed=skipped, samples=len(samples)
    )
    if not groups or not len(samples):
        return report
    cfg = SearchSetting(act_dtype, symmetric, per_channel, method or CalibMethod())
    stats = collect(graph, [g.x for g in groups], [g.channels for g in groups], samples)
    for g in groups:
        st = stats[g.x]
        score = Scorer(st, _weights(graph, g), cfg)
        off = score(None)
        grid = ALPHAS if alpha is None else (alpha,)
        tried = {a: score(a) for a in grid}
        best = max(tried, key=lambda a: (tried[a], -a))
        g.sqnr_db = {"off": off, f"{best:g}": tried[best]}
        s = smoothing_scales(st.xmax(), score.wmax, best)
        smooth = float(np.abs(np.log(s)).max()) <= _SMOOTH  # already smoothed with this alpha
        if not smooth and (alpha is not None or tried[best] > off + _GAIN_DB):
            _apply(graph, g, s)
            g.alpha, g.scale_range = best, (float(s.min()), float(s.max()))
        log.info("smooth-quant %s: alpha %s, %s", g.x, g.alpha, g.sqnr_db)
        report.groups.append(g.as_json(graph))
    return report
