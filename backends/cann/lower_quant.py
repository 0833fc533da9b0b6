"""Lower Kiln's int8 forms to Ascend's quantized ops.

``legalize-cann`` starts with ``fuse-quantized-ops{matmul=0}``, so every QDQ conv and Gemm region
the pass accepts arrives here as ``kiln::QConv`` / ``kiln::QGemm`` and everything else is
QuantizeLinear / DequantizeLinear. Ascend holds 8-bit data on an int8 grid: a uint8 grid (s, z)
moves to ``z' = z - 128`` and ``q' = q - 128``, so ``q' - z' = q - z`` and every dequantized
value is unchanged.

* ``QuantizeLinear(x, s, z)`` -> ``AscendQuant`` with ``scale = 1/s``, ``offset = z'``,
  ``round_mode = "Round"``, ``dst_type = 2`` (C++ DT_INT8) and the exact step ``_kiln_scale = s``.
* ``DequantizeLinear`` of such a value (the output of a QuantizeLinear, QConv or QGemm on the same
  grid) -> ``AscendAntiQuant`` (``y = (x + offset) * scale`` with ``scale = s``, ``offset = -z'``),
  emitted only where a float op reads it. A ``dq`` of a constant is folded into a float32 Const,
  computed exactly as DequantizeLinear computes it, so the numbers do not change.
* ``QConv(x_q, W_q, b_q, r_q)`` -> ``Conv2D(x_q, W_q, b_q)`` (int32 y, ``offset_x = z_x'``, exact
  weight steps in ``_kiln_weight_scale``) -> ``AscendDequant`` whose ``deq_scale`` (uint64, one per
  channel or one) holds the float32 bits of m = s_x * s_w (:func:`qconv_multiplier`) in its low 32
  bits (high bits zero: no requant N, no weight offset) -> ``Add`` of ``AscendAntiQuant(r_q)`` -> the
  activation (a plain ReLU without residual folds into ``relu_flag``) -> ``AscendQuant(s_y, z_y')``
  unless the output is float32. Read back, that is q_y(act(conv(dq(x_q), dq(W_q), dq(b_q; m)) +
  dq(r_q))), the QDQ region the QConv stands for.
* ``QGemm(x_q, W_q, b_q)`` (2-D x) -> ``FullyConnection`` the same way (``transpose = !trans_b``).
* A QDQ conv / Gemm / MatMul the pass refused stays in Q/DQ form and is written in float (its
  DequantizeLinear inputs as above); :func:`qdq_fallbacks` names each with the pass's reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from backends.cann.lower import Lowerer, Step, lowering
from backends.cann.nn_attrs import activation_steps, conv2d_attrs, conv2d_reason, fc_attrs
from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.qconv import qconv_multiplier
from compiler.ops.registry import get_op
from compiler.pattern import NearMiss
from passes.fuse_quantized_ops import FloatOutConv, FloatOutGemm
from schemas.cann.om_graph import Attr

__all__ = ["Grid", "grid_of", "value_grid", "deq_scale_bits", "qdq_fallbacks"]

_ACT_DTYPES = (DType.UINT8, DType.INT8)
_QUANTIZED = ("kiln::QConv", "kiln::QGemm")
_INT8_READERS = ("DequantizeLinear", *_QUANTIZED)  # what may read Ascend's shifted uint8 data
_QDQ_PRODUCTS = ("Conv", "kiln::FusedConv", "Gemm", "MatMul")
_FUSION_RULES = (FloatOutConv.name, FloatOutGemm.name)  # the last rule each such node met


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


def _grid(scale: float, zero: int, dtype: DType) -> Grid:
    """A :class:`Grid` whose scale is the float32 value of ``scale`` (as DequantizeLinear reads it)."""
    return Grid(float(np.float32(scale)), int(zero), dtype)


def _is(node: Node, op: str) -> bool:
    return node.op == op and not node.domain


def grid_of(graph: Graph, node: Node) -> Grid | None:
    """The per-tensor 8-bit grid of a QuantizeLinear/DequantizeLinear node (None if it has none)."""
    ins = graph.inputs_of(node)
    s = ins[1].const if ins[1] is not None else None
    zv = ins[2] if len(ins) > 2 else None
    z = zv.const if zv is not None else None
    if s is None or (zv is not None and z is None) or node.attrs.block_size != 0:
        return None
    if s.size != 1 or (z is not None and z.size != 1):
        return None
    q = graph.value(node) if _is(node, "QuantizeLinear") else ins[0]
    assert q is not None
    if q.type.dtype not in _ACT_DTYPES:
        return None
    zero = int(z.reshape(())) if z is not None else 0
    return _grid(float(s.reshape(())), zero, q.type.dtype)


def value_grid(graph: Graph, v: Value) -> Grid | None:
    """The grid of an 8-bit value Ascend holds as an AscendQuant output (a QuantizeLinear's, or a
    QConv's / QGemm's quantized output), else None."""
    node = v.producer
    if _is(node, "QuantizeLinear"):
        return grid_of(graph, node)
    if node.qualified_op in _QUANTIZED and v.type.dtype in _ACT_DTYPES:
        return _grid(node.attrs.y_scale, node.attrs.y_zero, v.type.dtype)
    return None


def deq_scale_bits(deq: np.ndarray) -> np.ndarray:
    """AscendDequant's uint64 deq_scale: the float32 bits of each scale in the low 32 bits."""
    return np.ascontiguousarray(deq, dtype=np.float32).reshape(-1).view(np.uint32).astype(np.uint64)


def qdq_fallbacks(graph: Graph, near_misses: Iterable[NearMiss]) -> dict[str, str]:
    """Each QDQ Conv / FusedConv / Gemm / MatMul that stays in Q/DQ form (so is written in float),
    with the reason fuse-quantized-ops gave for not fusing it."""
    reasons = {m.node: m.reason for m in near_misses if m.rule in _FUSION_RULES}
    out: dict[str, str] = {}
    for node in graph.nodes():
        x = graph.inputs_of(node)[0] if node.qualified_op in _QDQ_PRODUCTS else None
        if x is not None and _is(x.producer, "DequantizeLinear"):
            name = node.name or node.output_names[0]
            out[name] = reasons.get(name, "fuse-quantized-ops did not fuse it")
    return out


# ------------------------------------------------------------------ checks
def _uint8_output_reason(graph: Graph, node: Node) -> str | None:
    out = graph.value(node)
    if out.type.dtype is not DType.UINT8:
        return None
    if graph.is_output(out) or any(u.qualified_op not in _INT8_READERS for u, _ in out.users):
        return (
            "its uint8 output (int8 on Ascend) is read by an op other than DequantizeLinear/QConv/QGemm "
            "or is a graph output"
        )
    return None


def _quantize_reason(graph: Graph, node: Node) -> str | None:
    grid = grid_of(graph, node)
    x = graph.inputs_of(node)[0]
    assert x is not None
    if grid is None or x.type.dtype is not DType.FLOAT32 or node.attrs.saturate != 1:
        return "only per-tensor float32 -> uint8/int8 QuantizeLinear maps to AscendQuant"
    return _uint8_output_reason(graph, node)


def _int8_operand_reason(graph: Graph, v: Value | None, scale: float, zero: int, what: str) -> str | None:
    assert v is not None
    if value_grid(graph, v) != _grid(scale, zero, v.type.dtype):
        return (
            f"{what} is not the output of a QuantizeLinear, QConv or QGemm on its grid "
            f"(scale {scale:g}, zero point {zero}), the AscendQuant data Ascend's int8 ops read"
        )
    return None


def _weighted_reason(graph: Graph, node: Node) -> str | None:
    a = node.attrs
    x = graph.inputs_of(node)[0]
    return _int8_operand_reason(graph, x, a.x_scale, a.x_zero, "input x") or _uint8_output_reason(graph, node)


def _qconv_reason(graph: Graph, node: Node) -> str | None:
    a = node.attrs
    if a.is_blocked:
        return f"blocked layout {a.layout} -> {a.output_layout} (Conv2D reads NCHW)"
    ins = graph.inputs_of(node)
    why = conv2d_reason(graph, node) or _weighted_reason(graph, node)
    if why is None and len(ins) > 3:
        why = _int8_operand_reason(graph, ins[3], a.r_scale, a.r_zero, "residual")
    return why


def _qgemm_reason(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if x.type.rank != 2:
        return f"FullyConnection reads a 2-D input (x has rank {x.type.rank})"
    return _weighted_reason(graph, node)


# --------------------------------------------------------------- lowerings
def _quant_step(grid: Grid) -> Step:
    attrs = {
        "scale": Attr.f(float(np.float32(1.0) / np.float32(grid.scale))),
        "offset": Attr.f(grid.offset),
        "sqrt_mode": Attr.b(False),
        "round_mode": Attr.s("Round"),
        "dst_type": Attr.i(2),  # C++ ge::DT_INT8
        "_kiln_scale": Attr.f(grid.scale),
    }
    return Step("AscendQuant", [], attrs, DType.INT8)


def _antiquant(low: Lowerer, name: str, q: Value, grid: Grid) -> str:
    attrs = {
        "scale": Attr.f(grid.scale),
        "offset": Attr.f(-grid.offset),
        "dtype": Attr.i(0),  # C++ ge::DT_FLOAT
        "sqrt_mode": Attr.b(False),
    }
    desc = low.desc(q.type, q.producer, DType.FLOAT32)
    return low.emit(name, "AscendAntiQuant", [low.ref_of(q)], [desc], attrs)


@lowering("QuantizeLinear", check=_quantize_reason)
def _quantize(low: Lowerer, node: Node) -> None:
    grid = grid_of(low.g, node)
    x = low.g.inputs_of(node)[0]
    assert x is not None and grid is not None
    low.chain(node, [low.ref_of(x)], [_quant_step(grid)])


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
    if grid is None or value_grid(low.g, q) != grid:
        raise low.fail(
            node, "an activation DequantizeLinear must read a QuantizeLinear, QConv or QGemm of the same grid"
        )
    return _antiquant(low, out.name, q, grid)


def _weighted(
    low: Lowerer, node: Node, kind: str, attrs: dict[str, Attr], act: tuple[str, float, float], r: str
) -> None:
    """x_q -> ``kind`` (int8 in, int32 out) -> AscendDequant -> [Add r] -> act -> [AscendQuant]."""
    a = node.attrs  # QConvAttrs or QGemmAttrs: the grids of x, W and y
    x, w, *rest = low.g.inputs_of(node)
    assert x is not None and w is not None
    out = low.g.value(node)
    attrs["offset_x"] = Attr.i(_grid(a.x_scale, a.x_zero, x.type.dtype).offset)
    attrs["_kiln_weight_scale"] = Attr.lf(a.w_scales)
    deq = low.const(deq_scale_bits(qconv_multiplier(a.x_scale, a.w_scales)), f"{out.name}/deq_scale")
    fold_relu = act[0] == "relu" and not r
    f32 = DType.FLOAT32
    dequant = {"sqrt_mode": Attr.b(False), "relu_flag": Attr.b(fold_relu), "dtype": Attr.i(0)}
    steps = [
        Step(kind, [low.ref_of(w), low.ref_of(rest[0] if rest else None)], attrs, DType.INT32),
        Step("AscendDequant", [deq], dequant, f32),
    ]
    if r:
        steps.append(Step("Add", [r], {}, f32))
    if not fold_relu:
        steps += activation_steps(low, node, *act, dtype=f32)
    if a.out_dtype != "float32":
        steps.append(_quant_step(_grid(a.y_scale, a.y_zero, out.type.dtype)))
    low.chain(node, [low.ref_of(x)], steps)


@lowering("kiln::QConv", check=_qconv_reason)
def _qconv(low: Lowerer, node: Node) -> None:
    a = node.attrs
    ins = low.g.inputs_of(node)
    w, r = ins[1], ins[3] if len(ins) > 3 else None
    assert w is not None
    residual = ""
    if r is not None:
        name = low.names.fresh(f"{low.g.value(node).name}/AscendAntiQuant")
        residual = _antiquant(low, name, r, _grid(a.r_scale, a.r_zero, r.type.dtype))
    act = (a.activation, a.alpha, a.beta)
    _weighted(low, node, "Conv2D", conv2d_attrs(a, w.type.static_shape), act, residual)


@lowering("kiln::QGemm", check=_qgemm_reason)
def _qgemm(low: Lowerer, node: Node) -> None:
    a = node.attrs
    w = low.g.inputs_of(node)[1]
    assert w is not None
    attrs = fc_attrs(w.type.static_shape[0 if a.trans_b else 1], a.trans_b)
    _weighted(low, node, "FullyConnection", attrs, ("none", 0.0, 0.0), "")
