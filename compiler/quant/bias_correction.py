"""Empirical bias correction (Nagel et al. 2019, "Data-Free Quantization", section 4.2, with data).

For a quantized weighted layer y = W ⊛ x + b (+ z, a fused residual), int8 turns it into
ỹ = W̃ ⊛ x̃ + b (+ z̃) with W̃ = dq(q(W)) per output channel and x̃ = dq(q(x)), z̃ = dq(q(z))
on the calibrated activation grid. The error ε = ỹ - y has a systematic part per output
channel c,

    Δ_c = E[ε_c] = E[(W̃ ⊛ x̃ + z̃)_c - (W ⊛ x + z)_c],

the expectation taken over the calibration samples and every other output position
(batch and spatial axes). It is estimated on the float inputs x of the float graph
(both terms see the same x, so the upstream error does not enter) and removed from the
bias before it is quantized:

    b'_c = b_c - Δ_c,   so that E[W̃ ⊛ x̃ + b' + z̃] = E[W ⊛ x + b + z].

The correction is applied before the activation (it is the pre-activation sum that
shifts); it only touches layers with a constant 1-D bias of one entry per output channel
(what :func:`insert_qdq` quantizes to int32). The output quantization of the layer is
not corrected: after a nonlinearity a bias cannot undo it.

All Δ are computed in one onnxruntime run per sample of the float graph extended with,
for each layer, ReduceMean(linear(x̃, W̃) - linear(x, W)) over every axis but the channel
axis 1, where ``linear`` is the layer with its bias and fused activation removed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.registry import QuantPolicy, get_op
from compiler.quant.calibrate import graph_runner
from compiler.quant.params import QParams, dequantize, fit_weight_to_bias, quantize, weight_params
from compiler.quant.plan import QuantPlan, activation_ports, node_label
from compiler.quant.qdq import share_grids

__all__ = ["estimate_bias_corrections", "apply_bias_corrections", "correctable", "correction_summary"]

log = logging.getLogger(__name__)


def correctable(graph: Graph, node: Node) -> bool:
    """A WEIGHTED node with constant weight and a constant 1-D bias, one entry per output channel."""
    opdef = get_op(node.op, node.domain)
    spec = opdef.qspec
    if opdef.quant != QuantPolicy.WEIGHTED or spec is None or spec.weight is None or spec.bias is None:
        return False
    ins = graph.inputs_of(node)
    w = ins[spec.weight] if spec.weight < len(ins) else None
    b = ins[spec.bias] if spec.bias < len(ins) else None
    if w is None or w.const is None or b is None or b.const is None or b.const.ndim != 1:
        return False
    out = node.output_types[0]
    if out.shape is None or len(out.shape) < 2 or out.shape[1] != b.const.shape[0]:
        return False
    if node.op == "Gemm" and float(getattr(node.attrs, "beta", 1.0)) != 1.0:
        return False
    return all(v.const is None for v in _act_inputs(graph, node))


def _qdq(g: Graph, v: Value, p: QParams, cache: dict[str, Value]) -> Value:
    if v.name in cache:
        return cache[v.name]
    s = g.add_constant(p.scale, f"{v.name}_bc_scale")
    z = g.add_constant(p.zero_point, f"{v.name}_bc_zp")
    q = g.add_node("QuantizeLinear", [v, s, z], name=f"{v.name}_bc_q")
    cache[v.name] = g.value(g.add_node("DequantizeLinear", [g.value(q), s, z], name=f"{v.name}_bc_dq"))
    return cache[v.name]


def _linear(g: Graph, node: Node, inputs: list[Value | None], name: str) -> Value:
    """The node without bias and fused activation, on ``inputs``."""
    attrs = node.attrs
    if dataclasses.is_dataclass(attrs) and any(f.name == "activation" for f in dataclasses.fields(attrs)):
        attrs = dataclasses.replace(attrs, activation="none")  # type: ignore[type-var]
    return g.value(g.add_node(node.op, inputs, attrs, domain=node.domain, name=name))


def _delta_branch(
    g: Graph, node: Node, params: Mapping[str, QParams], per_channel: bool, cache: dict[str, Value]
) -> Value:
    """ReduceMean(linear(x̃, W̃) - linear(x, W)) per output channel, added to the clone ``g``."""
    spec = get_op(node.op, node.domain).qspec
    assert spec is not None and spec.weight is not None and spec.bias is not None
    ins = g.inputs_of(node)
    w = ins[spec.weight]
    assert w is not None and w.const is not None
    axis = spec.weight_axis(node.attrs, w.const.ndim) if per_channel else None
    wp = weight_params(w.const, axis)
    x, b = ins[0], ins[spec.bias]
    if x is not None and x.name in params and b is not None and b.const is not None:
        wp = fit_weight_to_bias(wp, params[x.name].scale, b.const)  # as insert_qdq does
    float_ins: list[Value | None] = list(ins)
    float_ins[spec.bias] = None
    quant_ins = list(float_ins)
    quant_ins[spec.weight] = g.add_constant(dequantize(quantize(w.const, wp), wp), f"{w.name}_bc_w")
    for p in activation_ports(node, g):
        v = ins[p]
        assert v is not None
        quant_ins[p] = _qdq(g, v, params[v.name], cache)
    label = node_label(node)
    yq = _linear(g, node, quant_ins, f"{label}_bc_quant")
    yf = _linear(g, node, float_ins, f"{label}_bc_float")
    diff = g.value(g.add_node("Sub", [yq, yf], name=f"{label}_bc_diff"))
    rank = len(node.output_types[0].shape or ())
    axes = g.add_constant(np.array([a for a in range(rank) if a != 1], np.int64), f"{label}_bc_axes")
    mean = g.add_node("ReduceMean", [diff, axes], {"keepdims": 0}, name=f"{label}_bc_mean")
    return g.value(mean)


def estimate_bias_corrections(
    float_graph: Graph,
    plan: QuantPlan,
    params: Mapping[str, QParams],
    samples: Sequence[Mapping[str, np.ndarray]],
    *,
    per_channel: bool = True,
) -> dict[int, np.ndarray]:
    """Corrected float biases b' = b - Δ by node id, for every correctable node of the plan.

    The activation grids are those :func:`insert_qdq` will use for ``plan`` (shared grids included).
    """
    g = float_graph.clone()
    params = share_grids(g, plan, params)
    nodes = [g.node(n) for n in plan.nodes if correctable(g, g.node(n))]
    nodes = [n for n in nodes if all(v.name in params for v in _act_inputs(g, n))]
    if not nodes or not samples:
        return {}
    cache: dict[str, Value] = {}
    means = {n.id: _delta_branch(g, n, params, per_channel, cache) for n in nodes}
    run = graph_runner(g, [v.name for v in means.values()])
    biases = {n.id: _bias(float_graph, n.id) for n in nodes}
    total = {nid: np.zeros(b.shape, np.float64) for nid, b in biases.items()}
    for feeds in samples:
        got = run(feeds)
        for nid, v in means.items():
            total[nid] += np.asarray(got[v.name], np.float64).reshape(-1)
    out = {
        nid: (b.astype(np.float64) - total[nid] / len(samples)).astype(b.dtype) for nid, b in biases.items()
    }
    log.info("bias correction: %d layers", len(out))
    return out


def _bias(graph: Graph, nid: int) -> np.ndarray:
    node = graph.node(nid)
    spec = get_op(node.op, node.domain).qspec
    assert spec is not None and spec.bias is not None
    b = graph.inputs_of(node)[spec.bias]
    assert b is not None and b.const is not None
    return b.const


def _act_inputs(g: Graph, node: Node) -> list[Value]:
    ins = g.inputs_of(node)
    return [v for p in activation_ports(node, g) if (v := ins[p]) is not None]


def apply_bias_corrections(graph: Graph, corrections: Mapping[int, np.ndarray], nodes: Sequence[int]) -> None:
    """Replace the bias constant of each of ``nodes`` that has a correction (in place)."""
    for nid in nodes:
        b = corrections.get(nid)
        if b is None or not graph.has_node(nid):
            continue
        node = graph.node(nid)
        spec = get_op(node.op, node.domain).qspec
        assert spec is not None and spec.bias is not None
        graph.set_input(node, spec.bias, graph.add_constant(b, f"{node_label(node)}_bias_corrected"))


def correction_summary(float_graph: Graph, corrections: Mapping[int, np.ndarray]) -> dict[str, float]:
    """Layers corrected and the largest |Δ_c| = |b_c - b'_c|, for the manifest."""
    worst = 0.0
    for nid, b in corrections.items():
        if b.size:
            worst = max(worst, float(np.max(np.abs(b.astype(np.float64) - _bias(float_graph, nid)))))
    return {"layers": len(corrections), "max_abs_shift": round(worst, 6)}
