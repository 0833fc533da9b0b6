"""Insert QuantizeLinear/DequantizeLinear pairs around the planned nodes (QDQ form).

For a quantized node n:

* each activation input x becomes dq(q(x)) with its calibrated (s_x, z_x);
* a constant weight W becomes dq(W_q) with W_q = round(W / s_w) per output
  channel (int8, symmetric, s_w = max|W_c| / 127), and a constant bias b becomes
  dq(b_q) with b_q = round(b / (s_x s_w)) in int32 (s_w raised where b_q would
  leave int32);
* each float output y is replaced, for every consumer, by dq(q(y)), so the value
  exists only on its int8 grid, as an integer kernel would produce it.

Further constant weights (an RNN's R, ``QuantSpec.weights``) are quantized like W. A node in
``plan.weight_only`` gets only its weights quantized, and an op whose ``QuantSpec.float_output``
is set (a recurrent state) keeps its outputs float: each quantized reader quantizes its input.

A constant operand of an ACTIVATION op (the c of Add(x, c)) is quantized per tensor
on its own [min c, max c] with the type and symmetry of the activation it meets
(uint8: 256 levels over a one-signed constant, where symmetric int8 has 128).

Which grids are shared (each sharing removes a rounding, and none adds one):

* PASSTHROUGH ops (Reshape, Transpose, MaxPool...) carry their input's parameters
  to their output, so their requantization is exact; when their input is int8, their
  outputs are quantized too (DQ -> Transpose -> Q, as onnxruntime's quantizer writes it),
  so a DequantizeLinear never leads through them into a float op or a graph output;
* an op whose QuantSpec ``shares_output_grid`` (Concat, Relu, Clip) hands its output's
  parameters back to each input that it alone reads (through passthrough chains):
  concat(q_G(a), q_G(b)) = q_G(concat(a, b)), and for a clamp to [0, b] the grid's
  ends perform relu(x). This is onnxruntime's removable-activation rule, applied
  without deleting the op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.registry import QuantPolicy, get_op
from compiler.quant.params import (
    QParams,
    bias_params,
    fit_weight_to_bias,
    quantize,
    range_params,
    weight_params,
)
from compiler.quant.plan import QuantPlan, activation_ports, node_label

__all__ = ["activation_params", "share_grids", "insert_qdq", "QdqResult", "MissingScaleError"]


class MissingScaleError(KeyError):
    """An activation needed by the plan has no calibrated range or scale."""


@dataclass
class QdqResult:
    """Parameters actually used: activations by value name, weights by node label."""

    activations: dict[str, QParams] = field(default_factory=dict)
    weights: dict[str, QParams] = field(default_factory=dict)
    quantized_nodes: list[str] = field(default_factory=list)


def _passthrough(node: Node) -> bool:
    return get_op(node.op, node.domain).quant == QuantPolicy.PASSTHROUGH and node.num_inputs > 0


def _propagate(graph: Graph, params: dict[str, QParams]) -> None:
    """Forward: a PASSTHROUGH op's float outputs take its first input's parameters."""
    for node in graph.ops():
        if not _passthrough(node):
            continue
        src = graph.inputs_of(node)[0]
        if src is not None and src.name in params:
            for v in graph.outputs_of(node):
                if v.type.dtype.is_float:
                    params[v.name] = params[src.name]


def activation_params(
    graph: Graph, ranges: Mapping[str, tuple[float, float]], dtype: DType, *, symmetric: bool
) -> dict[str, QParams]:
    """Per-tensor parameters from calibrated ranges, propagated through PASSTHROUGH ops."""
    params = {name: range_params(lo, hi, dtype, symmetric=symmetric) for name, (lo, hi) in ranges.items()}
    _propagate(graph, params)
    return params


def _sole_reader(graph: Graph, v: Value, node: Node) -> bool:
    users = graph.users(v)
    return bool(users) and all(u.id == node.id for u, _ in users) and not graph.is_output(v)


def share_grids(graph: Graph, plan: QuantPlan, params: Mapping[str, QParams]) -> dict[str, QParams]:
    """``params`` with the grid sharing of ``shares_output_grid`` ops applied (see the module doc).

    Planned ops are visited in reverse topological order, so a chain (Relu -> Concat)
    hands the last grid all the way back; then passthrough outputs are re-propagated.
    """
    out = dict(params)
    planned = set(plan.nodes)
    for node in reversed([graph.node(i) for i in plan.nodes if graph.has_node(i)]):
        spec = get_op(node.op, node.domain).qspec
        if spec is None or not spec.shares_output_grid:
            continue
        grid = out.get(graph.value(node).name)
        if grid is None:
            continue
        ins = graph.inputs_of(node)
        for port in activation_ports(node, graph):
            v, reader = ins[port], node
            while v is not None and v.const is None and v.name in out and _sole_reader(graph, v, reader):
                out[v.name] = grid
                reader = v.producer
                if not _passthrough(reader) or reader.id in planned:
                    break
                v = graph.inputs_of(reader)[0]
    _propagate(graph, out)
    return out


class _Inserter:
    def __init__(
        self,
        graph: Graph,
        params: Mapping[str, QParams],
        per_channel: bool,
        weight_only: frozenset[int] = frozenset(),
    ) -> None:
        self.g = graph
        self.params = params
        self.per_channel = per_channel
        self.weight_only = weight_only
        self.dq_cache: dict[tuple[int, int], Value] = {}
        self.dq_nodes: set[int] = set()  # the activation DequantizeLinear nodes created
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
        self.dq_nodes.add(dq.id)
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
        ports = [] if node.id in self.weight_only else activation_ports(node, self.g)
        x_params: QParams | None = None
        meets: QParams | None = None  # the parameters of the first non-constant activation
        for port in ports:
            v = ins[port]
            assert v is not None
            if v.const is None:
                meets = meets or self.params.get(v.name)
                if port == 0:
                    x_params = self.params.get(v.name)
        for port in ports:
            v = ins[port]
            assert v is not None
            c = v.const
            if c is not None:
                self.g.set_input(node, port, self.const_dq(c, _const_params(c, meets), f"{label}_in{port}"))
            else:
                self.g.set_input(node, port, self.dq_of(v))
        spec = opdef.qspec
        if opdef.quant == QuantPolicy.WEIGHTED and spec is not None and spec.weight is not None:
            w = ins[spec.weight]
            assert w is not None and w.const is not None
            arr = w.const
            axis = spec.weight_axis(node.attrs, arr.ndim) if self.per_channel else None
            wp = weight_params(arr, axis)
            b = ins[spec.bias] if spec.bias is not None and spec.bias < len(ins) else None
            bc = b.const if b is not None else None
            if bc is not None and x_params is not None and self._bias_ok(node, bc, wp):
                assert spec.bias is not None
                wp = fit_weight_to_bias(wp, x_params.scale, bc)
                self.g.set_input(
                    node, spec.bias, self.const_dq(bc, bias_params(x_params.scale, wp), f"{label}_b")
                )
            self.result.weights[label] = wp
            self.g.set_input(node, spec.weight, self.const_dq(arr, wp, f"{label}_w"))
            for port in spec.weights:
                self._extra_weight(node, port, ins, spec.weight_axis, f"{label}_w{port}")
        self.result.quantized_nodes.append(label)

    def _extra_weight(
        self, node: Node, port: int, ins: list[Value | None], axis_of: Callable[[Any, int], int], base: str
    ) -> None:
        """A further constant weight (``QuantSpec.weights``): int8, per channel like the first."""
        v = ins[port] if port < len(ins) else None
        if v is None or v.const is None or not v.type.dtype.is_float:
            return
        arr = v.const
        wp = weight_params(arr, axis_of(node.attrs, arr.ndim) if self.per_channel else None)
        self.result.weights[f"{node_label(node)}:in{port}"] = wp
        self.g.set_input(node, port, self.const_dq(arr, wp, base))

    def float_out(self, node: Node) -> bool:
        """The node computes in float (weight-only, or a float state): its outputs stay float."""
        spec = get_op(node.op, node.domain).qspec
        return node.id in self.weight_only or (spec is not None and spec.float_output)

    @staticmethod
    def _bias_ok(node: Node, c: np.ndarray, wp: QParams) -> bool:
        channels = wp.scale.size if wp.per_channel else None
        if c.ndim != 1 or (channels is not None and c.shape[0] != channels):
            return False
        return not (node.op == "Gemm" and float(getattr(node.attrs, "beta", 1.0)) != 1.0)

    def carry(self, node: Node) -> None:
        """A passthrough op fed by an int8 value: its outputs go back onto the (same) grid."""
        src = self.g.inputs_of(node)[0]
        if src is not None and src.node in self.dq_nodes:
            self.quantize_outputs(node)

    def quantize_outputs(self, node: Node) -> None:
        for v in self.g.outputs_of(node):
            if v.type.dtype.is_float:
                dq = self.dq_of(v)
                q = dq.producer
                quant = self.g.inputs_of(q)[0]
                assert quant is not None
                self.g.replace_all_uses(v, dq, keep=[quant.producer])


def _const_params(c: np.ndarray, meets: QParams | None) -> QParams:
    """A constant operand's per-tensor parameters: its own range, the activation's type."""
    dtype = meets.dtype if meets is not None and meets.dtype in (DType.UINT8, DType.INT8) else DType.UINT8
    lo, hi = (float(c.min()), float(c.max())) if c.size else (0.0, 0.0)
    return range_params(lo, hi, dtype, symmetric=dtype == DType.INT8)


def insert_qdq(
    graph: Graph,
    plan: QuantPlan,
    params: Mapping[str, QParams],
    *,
    per_channel: bool = True,
) -> QdqResult:
    """Rewrite ``graph`` in place into QDQ form for the planned nodes (grids shared first)."""
    ins = _Inserter(graph, share_grids(graph, plan, params), per_channel, plan.weight_only)
    nodes = [graph.node(i) for i in plan.nodes if graph.has_node(i)]
    for node in nodes:
        ins.quantize_node(node)
    int8_readers = _int8_readers(graph, plan) if plan.float_tail else set(plan.nodes) | set(plan.carried)
    for node in nodes:
        if node.id in int8_readers and not ins.float_out(node):
            ins.quantize_outputs(node)
    for node in [graph.node(i) for i in plan.carried if graph.has_node(i)]:
        if node.id in int8_readers:
            ins.carry(node)
    return ins.result


def _int8_readers(graph: Graph, plan: QuantPlan) -> set[int]:
    """Planned or carried nodes whose output some quantized node reads (directly or through carried ops).

    A quantized node whose output only float ops read dequantizes in its epilogue
    (int32 accumulator * scale + bias -> float): no 8-bit rounding of that output.
    """
    planned, carried = set(plan.nodes), set(plan.carried)
    int8_in = planned - plan.weight_only  # a weight-only node reads float activations
    readers: set[int] = set()
    for node in reversed(graph.ops()):
        if node.id not in planned and node.id not in carried:
            continue
        for v in graph.outputs_of(node):
            for user, _ in graph.users(v):
                if user.id in int8_in or (user.id in carried and user.id in readers):
                    readers.add(node.id)
    return readers
