"""GPTQ rounding of MNN weight-only int8/int4 weights (``--mnn-weights int8|int4 --calib DATA``).

The grid is exactly the one :func:`backends.mnn.weights.quantize_weights` picks for nearest
rounding (per output channel or per block, symmetric or asymmetric, fp32 or fp16 scales);
only the integer levels change. Per weight (row r, column k) the grid is

    w ≈ (q - t) · s_rk + m_rk,  q ∈ [lo, hi],

symmetric: m = 0, t = 0, q ∈ [-(2^(b-1) - 1), 2^(b-1) - 1]; asymmetric: m = the group's min,
t = -2^(b-1), q ∈ [-2^(b-1), 2^(b-1) - 1] (s and m are the values of the row's block).
GPTQ (Frantar et al. 2022) minimises ||(W - Ŵ) X||²_F with H = Σ_n x_n x_nᵀ over the layer's
calibration inputs: columns are rounded one at a time by decreasing diag H,

    q_k = clip(rint((w_k - m_k) / s_k) + t, lo, hi),   e_k = (w_k - ŵ_k) / U_kk,
    w_j ← w_j - e_k U_kj (j after k),   H⁻¹ = Uᵀ U (H damped by ``DAMP`` · mean diag H),

the division done in float32 as ``quantize_weights`` does, so a diagonal H (no coupling)
gives nearest rounding bit for bit. H per layer: Conv / FusedConv from the im2col patches
of its input (one H per group, :func:`compiler.quant.gptq.conv_patches`), Gemm / MatMul with
a constant B from the rows of A; other weight layers (ConvTranspose, whose MNN rows are
input channels) and rows longer than ``MAX_COLUMNS`` (a K x K Hessian would not fit; pan_mnv3s
has a 3x3 conv over 3136 channels, K = 28224) keep nearest rounding. The float model runs in
onnxruntime, single-threaded, so the levels (and the file) are the same on every run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import SimpleNamespace

import numpy as np

from backends.mnn.lower.registry import WeightView
from backends.mnn.options import MnnOptions
from backends.mnn.precision import WeightPlan, layer_count, plan_weights, weight_layers
from backends.mnn.weights import WeightStorage, quantize_weights
from compiler.errors import KilnError
from compiler.ir.graph import Graph, Node, Value
from compiler.ops.shapes import resolve_pads, window_params
from compiler.quant.gptq import DAMP, conv_patches, gptq_columns
from schemas.mnn.quantized_weights import QuantizedWeights

__all__ = [
    "grid_gptq_levels",
    "gptq_quantized",
    "layer_hessians",
    "gptq_storage",
    "gptq_plan",
    "CONV_OPS",
    "LINEAR_OPS",
    "MAX_COLUMNS",
]

log = logging.getLogger(__name__)

CONV_OPS = frozenset({"Conv", "FusedConv"})
LINEAR_OPS = frozenset({"Gemm", "MatMul"})
MAX_COLUMNS = 4096  # K x K float64 Hessians and their inverse: 128 MiB at this size
_CHUNK_ELEMS = 1 << 21  # patch elements per Hessian product


def _grid(qw: QuantizedWeights, k: int) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Per-weight scale s and offset m ([rows, K] float32), shift t and level range of ``qw``."""
    rows = qw.q.shape[0]
    per = k * rows // qw.groups
    half = 1 << (qw.bits - 1)
    if qw.asymmetric:
        mins, scale = qw.alpha[0::2], qw.alpha[1::2]
        m = np.repeat(mins, per).reshape(rows, k).astype(np.float32)
        return np.repeat(scale, per).reshape(rows, k).astype(np.float32), m, -half, -half, half - 1
    s = np.repeat(qw.alpha, per).reshape(rows, k).astype(np.float32)
    return s, np.zeros_like(s), 0, -(half - 1), half - 1


def grid_gptq_levels(w: np.ndarray, h: np.ndarray, qw: QuantizedWeights, *, damp: float = DAMP) -> np.ndarray:
    """GPTQ levels ([rows, K] int32) of ``w`` on the grid of ``qw`` (its scales, offsets, bits); H (K x K).

    ``qw`` is the nearest rounding of ``w`` (or of any rows sharing its grid); its ``q`` is not read.
    """
    k = np.asarray(w).shape[1]
    s, m, t, lo, hi = _grid(qw, k)
    live = s > 0
    safe = np.where(live, s, np.float32(1.0)).astype(np.float32)

    def level(i: int, col: np.ndarray) -> np.ndarray:
        qi = np.rint((col.astype(np.float32) - m[:, i]) / safe[:, i]).astype(np.float64) + t
        return np.asarray(np.where(live[:, i], np.clip(qi, lo, hi), float(t)))

    def decode(i: int, qi: np.ndarray) -> np.ndarray:
        return np.asarray((qi - t) * s[:, i].astype(np.float64) + m[:, i].astype(np.float64))

    return gptq_columns(w, h, level, decode, damp=damp).astype(np.int32)


def gptq_quantized(
    rows: np.ndarray,
    h: np.ndarray,
    bits: int,
    asymmetric: bool,
    block_elems: int | None = None,
    fp16_scales: bool = False,
    *,
    damp: float = DAMP,
) -> QuantizedWeights:
    """``quantize_weights(rows, ...)`` with GPTQ levels; ``h`` is (G, K, K): one H per group of rows."""
    rows = np.asarray(rows, np.float32)
    near = quantize_weights(rows, bits, asymmetric, block_elems, fp16_scales)
    g = h.shape[0]
    if rows.shape[0] % g or h.shape[1:] != (rows.shape[1], rows.shape[1]):
        raise ValueError(f"Hessians {h.shape} do not fit weight rows {rows.shape}")
    per = rows.shape[0] // g
    width = 2 if asymmetric else 1
    blocks = near.groups // rows.shape[0]
    levels = []
    for i in range(g):
        part = slice(i * per, (i + 1) * per)
        alpha = near.alpha.reshape(rows.shape[0], blocks * width)[part].reshape(-1)
        sub = QuantizedWeights(near.q[part], alpha, bits, asymmetric, per * blocks)
        levels.append(grid_gptq_levels(rows[part], h[i], sub, damp=damp))
    return QuantizedWeights(np.concatenate(levels), near.alpha, bits, asymmetric, near.groups)


# ------------------------------------------------------------------------- Hessians
def _conv_attrs(graph: Graph, node: Node) -> SimpleNamespace:
    x, w = graph.inputs_of(node)[0], graph.inputs_of(node)[1]
    assert x is not None and w is not None and w.const is not None
    a = node.attrs
    kernel = tuple(int(d) for d in w.const.shape[2:])
    strides, dilations, pads = window_params(2, kernel, a.strides, a.dilations, a.pads)
    pads = resolve_pads(a.auto_pad, x.type.static_shape[2:], kernel, strides, dilations, pads)
    return SimpleNamespace(
        kernel_shape=kernel, strides=strides, dilations=dilations, pads=pads, group=int(a.group)
    )


def _kind(node: Node, view: WeightView) -> str | None:
    """The Hessian kind of a layer: conv, linear, or None (the layer keeps nearest rounding)."""
    if view.rows.shape[1] > MAX_COLUMNS:
        return None
    if node.op in CONV_OPS and view.rows.shape[1] == view.channels * view.area:
        return "conv"
    if node.op in LINEAR_OPS and view.area == 1:
        return "linear"
    return None


def _accumulate(total: np.ndarray | None, p: np.ndarray) -> np.ndarray:
    """total + Σ_p x_p x_pᵀ per group for patches ``p`` (P, G, K), in float64 chunks."""
    _, g, k = p.shape
    out = np.zeros((g, k, k), np.float64) if total is None else total
    step = max(1, _CHUNK_ELEMS // max(1, g * k))
    for lo in range(0, p.shape[0], step):
        c = p[lo : lo + step].astype(np.float64)
        if g == 1:
            flat = np.ascontiguousarray(c[:, 0, :])
            out[0] += flat.T @ flat
        else:
            out += np.einsum("pgk,pgl->gkl", c, c)
    return out


def _session(graph: Graph, names: Sequence[str]) -> tuple[object, list[str]]:
    """A single-threaded onnxruntime session over ``graph`` that returns the computed ``names``."""
    import onnxruntime as ort

    from compiler.onnx_export import export_onnx, model_bytes

    by_name = {v.name: v for n in graph.nodes() for v in graph.outputs_of(n)}
    probe = graph.clone()
    probe.set_outputs([Value(by_name[n].node, by_name[n].port, probe) for n in names], names=list(names))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model_bytes(export_onnx(probe)), so, providers=["CPUExecutionProvider"])
    return sess, [i.name for i in sess.get_inputs()]


def layer_hessians(
    graph: Graph, layers: Sequence[tuple[Node, WeightView]], samples: Sequence[Mapping[str, np.ndarray]]
) -> dict[int, np.ndarray]:
    """H (G, K, K, float64) per GPTQ-able layer (node id) from its float inputs over ``samples``."""
    kinds = {node.id: _kind(node, view) for node, view in layers}
    inputs: dict[int, str] = {}
    for node, _ in layers:
        src = graph.inputs_of(node)[0]
        if kinds[node.id] is not None and src is not None:
            inputs[node.id] = src.name
    graph_inputs = {v.name for v in graph.inputs}
    computed = sorted({n for n in inputs.values() if n not in graph_inputs})
    sess, feed_names = _session(graph, computed) if computed else (None, [])
    attrs = {nid: _conv_attrs(graph, graph.node(nid)) for nid in inputs if kinds[nid] == "conv"}
    total: dict[int, np.ndarray] = {}
    for feeds in samples:
        acts = {k: np.asarray(v, np.float32) for k, v in feeds.items() if k in graph_inputs}
        if sess is not None:
            outs = sess.run(computed, {k: feeds[k] for k in feed_names})  # type: ignore[attr-defined]
            acts.update({n: np.asarray(o, np.float32) for n, o in zip(computed, outs, strict=True)})
        for nid, name in inputs.items():
            x = acts[name]
            p = conv_patches(x, attrs[nid]) if kinds[nid] == "conv" else x.reshape(-1, 1, x.shape[-1])
            total[nid] = _accumulate(total.get(nid), p)
    return total


def gptq_storage(
    graph: Graph,
    layers: Sequence[tuple[Node, WeightView]],
    options: MnnOptions,
    samples: Sequence[Mapping[str, np.ndarray]],
) -> dict[int, WeightStorage]:
    """Per-node int8/int4 storage whose ``levels`` are GPTQ-rounded on MNN's grid (nearest elsewhere)."""
    base = WeightStorage.of(options)
    if base.bits is None:
        raise ValueError("GPTQ rounding applies to int8/int4 weights")
    if not samples:
        raise KilnError("GPTQ rounding needs at least one calibration sample")
    hessians = layer_hessians(graph, layers, samples)
    out: dict[int, WeightStorage] = {}
    for node, view in layers:
        h = hessians.get(node.id)
        if h is None:
            continue
        qw = gptq_quantized(
            view.rows, h, base.bits, base.asymmetric, view.block_elems(options.block_size), base.fp16_scales
        )
        out[node.id] = WeightStorage(base.kind, base.asymmetric, base.fp16_scales, qw)
    log.info("MNN %s weights: GPTQ rounding of %d of %d layers", options.weights, len(out), len(layers))
    return out


def gptq_plan(
    graph: Graph, options: MnnOptions, feeds: Mapping[str, np.ndarray] | None, source: str = ""
) -> WeightPlan:
    """The weight plan of ``graph`` with GPTQ levels from ``options.calib``: every layer's storage.

    The fp16 fallback (``plan_weights``) is measured on ``feeds`` with the GPTQ levels decoded;
    layers it keeps in fp16 lose their levels. ``feeds`` None: no fallback (target cosine 0).
    Node ids are those of ``graph`` (``write_mnn``'s folding of weight dequantization keeps them).
    """
    from backends.mnn.lower.graph import check_supported
    from backends.mnn.lower.quant import fold_weight_dequant
    from compiler.calibration.dataset import load_calibration

    if options.calib is None:
        raise ValueError("gptq_plan needs MnnOptions.calib")
    graph = fold_weight_dequant(graph)
    check_supported(graph, source)
    samples = load_calibration(
        options.calib, graph.input_types(), count=options.calib_count, preprocess=options.preprocess
    )
    layers = weight_layers(graph)
    rounded = gptq_storage(graph, layers, options, samples)
    if feeds is None or options.target_cosine <= 0.0:
        return WeightPlan(storage=dict(rounded), layers=layer_count(layers))
    return plan_weights(graph, options, feeds, rounded)
