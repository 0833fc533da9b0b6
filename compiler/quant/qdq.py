"""Insert QuantizeLinear/DequantizeLinear pairs around the planned nodes (QDQ form).

For a quantized node n:

* each activation input x becomes dq(q(x)) with its calibrated (s_x, z_x);
* a constant weight W becomes dq(W_q) with W_q = round(W / s_w) per output
  channel (int8, symmetric), and a constant bias b becomes dq(b_q) with
  b_q = round(b / (s_x * s_w)) in int32;
* each float output y is replaced, for every consumer, by dq(q(y)), so the value
  exists only on its int8 grid, as an integer kernel would produce it.

Constant operands of ACTIVATION ops (e.g. the constant of an Add) are int8
per-tensor like weights. PASSTHROUGH ops (Reshape, Transpose, MaxPool...) carry
their input's parameters to their output, so no requantization happens there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.registry import QuantPolicy, get_op
from compiler.quant.params import QParams, bias_params, quantize, range_params, weight_params
from compiler.quant.plan import QuantPlan, activation_ports, node_label

__all__ = ["activation_params", "insert_qdq", "QdqResult", "MissingScaleError"]


class MissingScaleError(KeyError):
    """An activation needed by the plan has no calibrated range or scale."""


@dataclass
class QdqResult:
    """Parameters actually used: activations by value name, weights by node label."""

    activations: dict[str, QParams] = field(default_factory=dict)
    weights: dict[str, QParams] = field(default_factory=dict)
    quantized_nodes: list[str] = field(default_factory=list)


def activation_params(
    graph: Graph, ranges: Mapping[str, tuple[float, float]], dtype: DType, *, symmetric: bool
) -> dict[str, QParams]:
    """Per-tensor parameters from calibrated ranges, propagated through PASSTHROUGH ops."""
    params = {name: range_params(lo, hi, dtype, symmetric=symmetric) for name, (lo, hi) in ranges.items()}
    for node in graph.ops():
        if get_op(node.op, node.domain).quant != QuantPolicy.PASSTHROUGH:
            continue
        src = graph.inputs_of(node)[0] if node.num_inputs else None
        if src is not None and src.name in params:
            for v in graph.outputs_of(node):
                if v.type.dtype.is_float:
                    params[v.name] = params[src.name]
    return params


class _Inserter:
    def __init__(self, graph: Graph, params: Mapping[str, QParams], per_channel: bool) -> None:
        self.g = graph
        self.params = params
        self.per_channel = per_channel
        self.dq_cache: dict[tuple[int, int], Value] = {}
        self.result = QdqResult()

    def _qdq_consts(self, p: QParams, base: str) -> tuple[Value, Value]:
        return self.g.add_constant(p.scale, f"{base}_scale"), self.g.add_constant(p.zero_point, f"{base}_zp")

    def dq_of(self, v: Value) -> Value:
        """dq(q(v)) for an activation value (created once per value)."""
        key = (v.node, v.port)
        if key in self.dq_cache:
            return self.dq_cache[key]
        p = self.params.get(v.name)
        if p is None:
            raise MissingScaleError(f"no scale for activation {v.name!r} (calibrate, or add it to --scales)")
        self.result.activations[v.name] = p
        s, z = self._qdq_consts(p, v.name)
        q = self.g.add_node("QuantizeLinear", [v, s, z], name=f"{v.name}_q", output_names=[f"{v.name}_q"])
        dq = self.g.add_node(
            "DequantizeLinear", [self.g.value(q), s, z], name=f"{v.name}_dq", output_names=[f"{v.name}_dq"]
        )
        out = self.g.value(dq)
        self.dq_cache[key] = out
        return out

    def const_dq(self, arr: np.ndarray, p: QParams, base: str) -> Value:
        """dq(c_q) for a constant quantized with ``p``."""
        qc = self.g.add_constant(quantize(arr, p), f"{base}_quantized")
        s, z = self._qdq_consts(p, base)
        attrs = {"axis": p.axis} if p.axis is not None else None
        node = self.g.add_node(
            "DequantizeLinear", [qc, s, z], attrs, name=f"{base}_dq", output_names=[f"{base}_dq"]
        )
        return self.g.value(node)

    def quantize_node(self, node: Node) -> None:
        opdef = get_op(node.op, node.domain)
        ins = self.g.inputs_of(node)
        label = node_label(node)
        x_params: QParams | None = None
        for port in activation_ports(node, self.g):
            v = ins[port]
            assert v is not None
            c = v.const
            if c is not None:
                wp = weight_params(c, None)
                self.g.set_input(node, port, self.const_dq(c, wp, f"{label}_in{port}"))
                continue
            self.g.set_input(node, port, self.dq_of(v))
            if port == 0:
                x_params = self.params[v.name]
        spec = opdef.qspec
        if opdef.quant == QuantPolicy.WEIGHTED and spec is not None and spec.weight is not None:
            w = ins[spec.weight]
            assert w is not None and w.const is not None
            arr = w.const
            axis = spec.weight_axis(node.attrs, arr.ndim) if self.per_channel else None
            wp = weight_params(arr, axis)
            self.result.weights[label] = wp
            self.g.set_input(node, spec.weight, self.const_dq(arr, wp, f"{label}_w"))
            b = ins[spec.bias] if spec.bias is not None and spec.bias < len(ins) else None
            if b is not None and b.const is not None and x_params is not None and self._bias_ok(node, b, wp):
                bp = bias_params(x_params.scale, wp)
                assert spec.bias is not None
                self.g.set_input(node, spec.bias, self.const_dq(b.const, bp, f"{label}_b"))
        self.result.quantized_nodes.append(label)

    def _bias_ok(self, node: Node, b: Value, wp: QParams) -> bool:
        c = b.const
        assert c is not None
        channels = wp.scale.size if wp.per_channel else None
        if c.ndim != 1 or (channels is not None and c.shape[0] != channels):
            return False
        return not (node.op == "Gemm" and float(getattr(node.attrs, "beta", 1.0)) != 1.0)

    def quantize_outputs(self, node: Node) -> None:
        for v in self.g.outputs_of(node):
            if v.type.dtype.is_float:
                dq = self.dq_of(v)
                q = dq.producer
                quant = self.g.inputs_of(q)[0]
                assert quant is not None
                self.g.replace_all_uses(v, dq, keep=[quant.producer])


def insert_qdq(
    graph: Graph, plan: QuantPlan, params: Mapping[str, QParams], *, per_channel: bool = True
) -> QdqResult:
    """Rewrite ``graph`` in place into QDQ form for the planned nodes."""
    ins = _Inserter(graph, params, per_channel)
    nodes = [graph.node(i) for i in plan.nodes if graph.has_node(i)]
    for node in nodes:
        ins.quantize_node(node)
    for node in nodes:
        ins.quantize_outputs(node)
    # q(dq(q(x))) chains of the same parameters arise only via passthrough ops; they are exact, keep them.
    return ins.result
