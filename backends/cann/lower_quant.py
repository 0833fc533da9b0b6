"""Lower Kiln's int8 QDQ form to Ascend's quantized ops.

Kiln's QDQ graph (``--quantize int8``) rounds every quantized value as
``dq(q(x))`` and feeds convolutions ``dq`` of int8 weights and int32 biases. On Ascend:

* ``QuantizeLinear(x, s, z)`` -> ``AscendQuant`` with ``scale = 1/s``, ``offset = z'``,
  ``round_mode = "Round"``, ``dst_type = 2`` (C++ DT_INT8) and the exact step
  ``_kiln_scale = s``. A uint8 grid is moved to int8: ``z' = z - 128`` and ``q' = q - 128``,
  so ``q' - z' = q - z`` and every dequantized value is unchanged.
* ``DequantizeLinear`` of such a value -> ``AscendAntiQuant`` (``y = (x + offset) * scale``
  with ``scale = s``, ``offset = -z'``), emitted only where a float op reads it.
* A Conv / FusedConv / Gemm whose input is ``dq(q(x))``, whose weight is ``dq`` of int8
  (zero point 0, per output channel or per tensor) and whose bias is absent or ``dq`` of
  int32 -> ``Conv2D`` / ``FullyConnection`` (int8 x, int8 filter, int32 bias, int32 y,
  ``offset_x = z'``, exact weight steps in ``_kiln_weight_scale``), then
  ``AscendDequant`` whose ``deq_scale`` (uint64, one per channel or one) holds the float32
  bits of s_x * s_w in its low 32 bits (high bits zero: no requant N, no weight offset),
  then the residual Add and the activation; a plain ReLU folds into ``relu_flag``.
* Any other ``dq`` of a constant is folded into a float32 Const, computed exactly as
  DequantizeLinear computes it, so the numbers do not change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.cann.lower import Lowerer, Step, lowering
from backends.cann.nn_attrs import activation_steps, conv2d_attrs, fc_attrs
from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.registry import get_op
from schemas.cann.om_graph import Attr

__all__ = ["Grid", "WeightedMatch", "match_weighted", "lower_weighted_int8", "deq_scale_bits"]

_ACT_DTYPES = (DType.UINT8, DType.INT8)
_BIAS_RTOL = 1e-6  # s_b must equal s_x * s_w (float32 rounding aside)


@dataclass(frozen=True)
class Grid:
    """A per-tensor 8-bit activation grid: real = (q - zero_point) * scale."""

    scale: float  # float32 value
    zero_point: int
    dtype: DType

    @property
    def offset(self) -> int:
        """The zero point on the int8 grid Ascend uses (uint8 grids shift by -128)."""
        return self.zero_point - 128 if self.dtype is DType.UINT8 else self.zero_point


@dataclass(frozen=True)
class WeightedMatch:
    """A quantized Conv/Gemm: its int8 input value and grid, int8 weight, int32 bias."""

    x_q: Value
    grid: Grid
    w_q: Value
    w_scale: np.ndarray  # float32, 1-D (per channel) or 0-d
    b_q: Value | None
    b_scale: np.ndarray | None


def _is(node: Node, op: str) -> bool:
    return node.op == op and not node.domain


def _qparams(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Constant (scale, zero point) inputs of a Q/DQ node, or None when not constant."""
    ins = graph.inputs_of(node)
    s = ins[1].const if ins[1] is not None else None
    z = ins[2].const if len(ins) > 2 and ins[2] is not None else None
    if s is None or (len(ins) > 2 and ins[2] is not None and z is None):
        return None
    return np.asarray(s, np.float32), None if z is None else np.asarray(z)


def grid_of(graph: Graph, node: Node) -> Grid | None:
    """The per-tensor 8-bit grid of a QuantizeLinear/DequantizeLinear node (None if it has none)."""
    p = _qparams(graph, node)
    if p is None or node.attrs.block_size != 0:
        return None
    s, z = p
    if s.size != 1 or (z is not None and z.size != 1):
        return None
    if _is(node, "QuantizeLinear"):
        dt = graph.value(node).type.dtype
    else:
        q = graph.inputs_of(node)[0]
        assert q is not None
        dt = q.type.dtype
    if dt not in _ACT_DTYPES:
        return None
    return Grid(float(s.reshape(())), int(z.reshape(())) if z is not None else 0, dt)


def deq_scale_bits(deq: np.ndarray) -> np.ndarray:
    """AscendDequant's uint64 deq_scale: the float32 bits of each scale in the low 32 bits."""
    return np.ascontiguousarray(deq, dtype=np.float32).reshape(-1).view(np.uint32).astype(np.uint64)


def _quantize_reason(graph: Graph, node: Node) -> str | None:
    grid = grid_of(graph, node)
    x = graph.inputs_of(node)[0]
    assert x is not None
    if grid is None or x.type.dtype is not DType.FLOAT32 or node.attrs.saturate != 1:
        return "only per-tensor float32 -> uint8/int8 QuantizeLinear maps to AscendQuant"
    out = graph.value(node)
    if grid.dtype is DType.UINT8:
        strangers = [u for u, _ in out.users if not _is(u, "DequantizeLinear")]
        if strangers or graph.is_output(out):
            return "its uint8 output is read by a non-DequantizeLinear op or is a graph output"
    return None


@lowering("QuantizeLinear", check=_quantize_reason)
def _quantize(low: Lowerer, node: Node) -> None:
    grid = grid_of(low.g, node)
    x = low.g.inputs_of(node)[0]
    assert x is not None and grid is not None
    attrs = {
        "scale": Attr.f(float(np.float32(1.0) / np.float32(grid.scale))),
        "offset": Attr.f(grid.offset),
        "sqrt_mode": Attr.b(False),
        "round_mode": Attr.s("Round"),
        "dst_type": Attr.i(2),  # C++ ge::DT_INT8
        "_kiln_scale": Attr.f(grid.scale),
    }
    low.chain(node, [low.ref_of(x)], [Step("AscendQuant", [], attrs, DType.INT8)])


@lowering("DequantizeLinear")
def _dequantize(low: Lowerer, node: Node) -> None:
    """Deferred: emitted only when a float op reads the value (see :func:`_emit_dequantize`)."""
    low.deferred[node.id] = lambda v: _emit_dequantize(low, node)


def _emit_dequantize(low: Lowerer, node: Node) -> str:
    ins = low.g.inputs_of(node)
    q = ins[0]
    assert q is not None
    out = low.g.value(node)
    if q.const is not None:
        consts = [v.const if v is not None else None for v in ins]
        folded = get_op("DequantizeLinear").reference(consts, node.attrs, 1)[0]
        return low.emit(out.name, "Const", [], [low.desc(out.type, node)], value=np.asarray(folded))
    grid = grid_of(low.g, node)
    src = q.producer
    if grid is None or not _is(src, "QuantizeLinear") or grid_of(low.g, src) != grid:
        raise low.fail(node, "an activation DequantizeLinear must read a QuantizeLinear of the same grid")
    attrs = {
        "scale": Attr.f(grid.scale),
        "offset": Attr.f(-grid.offset),
        "dtype": Attr.i(0),  # C++ ge::DT_FLOAT
        "sqrt_mode": Attr.b(False),
    }
    r = low.emit(out.name, "AscendAntiQuant", [low.ref_of(q)], [low.desc(out.type, node)], attrs)
    return r


def _const_dq(low: Lowerer, v: Value | None, dtype: DType) -> tuple[Value, np.ndarray, int | None] | None:
    """(quantized const, scale, axis) when ``v`` is dq of a ``dtype`` constant with zero point 0."""
    if v is None or not _is(v.producer, "DequantizeLinear"):
        return None
    dq = v.producer
    q = low.g.inputs_of(dq)[0]
    p = _qparams(low.g, dq)
    if q is None or q.const is None or q.type.dtype is not dtype or p is None or dq.attrs.block_size:
        return None
    s, z = p
    if z is not None and np.any(z != 0):
        return None
    if s.size == 1 and s.ndim <= 1:
        return q, s.reshape(()), None
    rank = q.type.rank or 0
    axis = dq.attrs.axis + rank if dq.attrs.axis < 0 else dq.attrs.axis
    return q, s, axis


def match_weighted(low: Lowerer, node: Node) -> WeightedMatch | None:
    """The int8 pattern of a Conv/FusedConv/Gemm node, or None (then it is lowered in float)."""
    ins = low.g.inputs_of(node)
    x = ins[0]
    if x is None or not _is(x.producer, "DequantizeLinear"):
        return None
    dq_x = x.producer
    x_q = low.g.inputs_of(dq_x)[0]
    grid = grid_of(low.g, dq_x)
    if x_q is None or grid is None or not _is(x_q.producer, "QuantizeLinear"):
        return None
    if grid_of(low.g, x_q.producer) != grid:
        return None
    w = _const_dq(low, ins[1], DType.INT8)
    if w is None:
        return None
    w_q, w_scale, w_axis = w
    channels = w_q.type.static_shape[0 if node.op != "Gemm" or node.attrs.transB else 1]
    out_axis = 0 if node.op != "Gemm" or node.attrs.transB else 1
    if w_axis is not None and (w_axis != out_axis or w_scale.shape != (channels,)):
        return None
    b_q: Value | None = None
    b_scale: np.ndarray | None = None
    if len(ins) > 2 and ins[2] is not None:
        b = _const_dq(low, ins[2], DType.INT32)
        if b is None:
            return None
        b_q, b_scale, _ = b
        want = np.float32(grid.scale) * w_scale.astype(np.float32)
        if b_scale.size not in (1, channels) or not np.allclose(b_scale, want, rtol=_BIAS_RTOL, atol=0):
            return None
    return WeightedMatch(x_q, grid, w_q, w_scale, b_q, b_scale)


def lower_weighted_int8(low: Lowerer, node: Node, m: WeightedMatch) -> None:
    """AscendQuant'd input -> Conv2D/FullyConnection (int8) -> AscendDequant -> residual -> activation."""
    out = low.g.value(node)
    ins = low.g.inputs_of(node)
    deq = m.b_scale if m.b_scale is not None else np.float32(m.grid.scale) * m.w_scale.astype(np.float32)
    deq_ref = low.const(deq_scale_bits(np.asarray(deq, np.float32)), f"{out.name}/deq_scale")
    w_shape = m.w_q.type.static_shape
    if node.op == "Gemm":
        kind = "FullyConnection"
        attrs = fc_attrs(w_shape[0 if node.attrs.transB else 1], node.attrs.transB, m.grid.offset)
    else:
        kind = "Conv2D"
        attrs = conv2d_attrs(node.attrs, w_shape)
        attrs["offset_x"] = Attr.i(m.grid.offset)
    attrs["_kiln_weight_scale"] = Attr.lf(np.atleast_1d(m.w_scale))
    residual = ins[3] if node.domain and len(ins) > 3 else None
    act = (node.attrs.activation, node.attrs.alpha, node.attrs.beta) if node.domain else ("none", 0.0, 0.0)
    fold_relu = act[0] == "relu" and residual is None
    steps = [
        Step(kind, [low.ref_of(m.w_q), low.ref_of(m.b_q)], attrs, DType.INT32),
        Step(
            "AscendDequant",
            [deq_ref],
            {"sqrt_mode": Attr.b(False), "relu_flag": Attr.b(fold_relu), "dtype": Attr.i(0)},
        ),
    ]
    if residual is not None:
        steps.append(Step("Add", [low.ref_of(residual)], {}))
    if not fold_relu:
        steps += activation_steps(low, node, *act)
    low.chain(node, [low.ref_of(m.x_q)], steps)
