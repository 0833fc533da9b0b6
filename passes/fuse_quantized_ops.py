"""fuse-quantized-ops: a QDQ convolution or matrix-product region becomes one integer kiln op.

With dq(q; s, z) = (q - z) s, s_w per output channel and s_b = s_x s_w (Kiln's bias grid):

* q_y(act(conv(dq(x_q), dq(W_q), dq(b_q)) + dq(r_q))) = QConv(x_q, W_q, b_q, r_q){out = y's dtype}
  since conv(dq(x_q), dq(W_q)) + dq(b_q) = (conv(x_q - z_x, W_q) + b_q) * s_x s_w exactly in
  real arithmetic (float rounding aside);
* q_y(dq(x_q) @ dq(W_q) + dq(b_q)) = QGemm(x_q, W_q, b_q){out = y's dtype} by the same identity,
  for MatMul and for Gemm with alpha = beta = 1 and transA = 0 (W's columns are the channels);
* a conv or product whose output is not quantized alone (float tail, ``--keep-float`` consumer,
  or a value also read in float) becomes QConv/QGemm{out = float32}.

Both need constant per-tensor activation parameters, int8 weights with zero point 0 (per
tensor or per output channel), an int32 bias on the s_x s_w grid and an int32 accumulator
that cannot overflow; a conv also needs rank-4 data (or, with ``conv1d=1``, rank-3: the 1-D conv
becomes Squeeze(QConv2d(Unsqueeze(x_q, [2]), W_q[:, :, None]; window (1, k)), [2]), exact as the
2-D window reads the 1-D one's elements only) and group 1 or depthwise. DequantizeLinear
nodes left without users are removed by the rewriter. Every refusal is recorded with its reason
in ``ctx.near_misses``.

Options (a backend's legalization pipeline picks them): ``depthwise=0`` keeps depthwise convs
in QDQ form (MNN: its int8 depthwise kernel is wrong), ``float_out=0`` keeps regions whose
output stays float, ``gemm=0`` keeps Gemm/MatMul in QDQ form, ``matmul=0`` keeps MatMul in
QDQ form (CANN: its FullyConnection reads 2-D data, and MatMul may be batched), ``conv1d=1``
fuses 1-D convs too (TVM: a whisper-style conv front end then runs on the int8 conv kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.conv import ConvAttrs
from compiler.ops.fused import KILN, FusedConvAttrs
from compiler.ops.linalg import GemmAttrs
from compiler.ops.qconv import QConvAttrs, qconv_multiplier
from compiler.ops.qgemm import QGemmAttrs
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Const, Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter
from passes.decompositions.spatial import attrs_2d

__all__ = [
    "FuseQuantizedOps",
    "QuantizedConv",
    "FloatOutConv",
    "QuantizedGemm",
    "FloatOutGemm",
    "is_depthwise",
]

_ACT_TYPES = {DType.UINT8: "uint8", DType.INT8: "int8"}
_BIAS_RTOL = 1e-6  # bias scale vs float32(s_x * s_w): Kiln writes them equal, other tools may round
_INT32_MAX = float(2**31 - 1)


@dataclass(frozen=True)
class _QParam:
    value: Value
    scale: float
    zero: int


@dataclass(frozen=True)
class _Operands:
    x: _QParam
    w: Value
    w_scales: tuple[float, ...]
    bias: Value | None
    residual: _QParam | None


def _dq_source(graph: Graph, v: Value | None, what: str) -> tuple[Node, Value, Value, Value | None] | str:
    """(DequantizeLinear producing ``v``, its q, scale, zero point or None), or why there is none.

    Per-axis forms are checked by the caller; blocked ones are rejected here.
    """
    if v is None:
        return f"{what} is absent"
    node = v.producer
    if node.op != "DequantizeLinear" or node.domain:
        return f"{what} is not produced by a DequantizeLinear"
    if node.attrs.block_size:
        return f"{what} is block-quantized"
    ins = graph.inputs_of(node)
    q, s = ins[0], ins[1]
    assert q is not None and s is not None
    return node, q, s, ins[2] if len(ins) > 2 else None


def _activation(graph: Graph, v: Value | None, what: str) -> _QParam | str:
    """A uint8/int8 activation with constant per-tensor scale and zero point."""
    dq = _dq_source(graph, v, what)
    if isinstance(dq, str):
        return dq
    _, q, s, zp = dq
    if q.type.dtype not in _ACT_TYPES:
        return f"{what} is {q.type.dtype.short}, not uint8/int8"
    if s.const is None or (zp is not None and zp.const is None):
        return f"{what}: scale or zero point is not a constant"
    if s.const.size != 1 or (zp is not None and zp.const is not None and zp.const.size != 1):
        return f"{what} is not quantized per tensor"
    if s.const.dtype != np.float32:
        return f"{what}: scale is {s.const.dtype}, not float32"
    zero = 0 if zp is None or zp.const is None else int(zp.const.reshape(()))
    return _QParam(q, float(s.const.reshape(())), zero)


def _weights(graph: Graph, v: Value | None, axis: int) -> tuple[Value, tuple[float, ...]] | str:
    """The int8 constant weight behind ``v`` and its scales (per tensor or per output ``axis``)."""
    dq = _dq_source(graph, v, "weight")
    if isinstance(dq, str):
        return dq
    node, w, s, zp = dq
    if w.const is None or w.type.dtype != DType.INT8:
        return "weight is not an int8 constant"
    if s.const is None or s.const.dtype != np.float32:
        return "weight scale is not a float32 constant"
    if zp is not None and (zp.const is None or np.any(zp.const != 0)):
        return "weight zero point is not 0"
    channels = w.const.shape[axis]
    if s.const.size != 1 and (
        s.const.ndim != 1 or s.const.size != channels or node.attrs.axis % w.const.ndim != axis
    ):
        return "weight scales are neither per tensor nor per output channel"
    return w, tuple(float(v) for v in s.const.reshape(-1))


def _bias(
    graph: Graph, v: Value | None, x_scale: float, w_scales: tuple[float, ...], n: int
) -> Value | None | str:
    """The int32 constant bias behind ``v`` (``n`` values on the s_x s_w grid), None if absent."""
    if v is None:
        return None
    dq = _dq_source(graph, v, "bias")
    if isinstance(dq, str):
        return dq
    _, b, s, zp = dq
    if b.const is None or b.type.dtype != DType.INT32:
        return "bias is not an int32 constant"
    if b.const.shape != (n,):
        return f"bias has shape {b.const.shape}, not ({n},)"
    if s.const is None or (zp is not None and (zp.const is None or np.any(zp.const != 0))):
        return "bias scale is not constant or its zero point is not 0"
    want = np.broadcast_to(qconv_multiplier(x_scale, w_scales), b.const.shape).astype(np.float64)
    got = np.broadcast_to(s.const.reshape(-1), b.const.shape).astype(np.float64)
    if not np.allclose(got, want, rtol=_BIAS_RTOL, atol=0.0):
        return "bias scale is not x_scale * w_scale"
    return b


def _may_overflow(x: _QParam, w_abs: np.ndarray, bias: Value | None) -> bool:
    """Worst case |acc| = max|x_q - z_x| * sum|W_oc| + |b_oc| beyond int32 (``w_abs``: sum|W_oc|)."""
    info = np.iinfo(x.value.type.dtype.numpy)
    span = max(info.max - x.zero, x.zero - info.min)
    worst = span * w_abs
    if bias is not None and bias.const is not None:
        worst = worst + np.abs(bias.const.astype(np.int64))
    return bool(worst.max(initial=0) > _INT32_MAX)


def _abs_sums(w: Value, axis: int) -> np.ndarray:
    """sum |W| per index of ``axis`` (int64)."""
    assert w.const is not None
    return np.abs(np.moveaxis(w.const.astype(np.int64), axis, 0)).reshape(w.const.shape[axis], -1).sum(axis=1)


def is_depthwise(graph: Graph, conv: Node) -> bool:
    """group = input channels = output channels (a 1-channel conv included)."""
    x, w = graph.inputs_of(conv)[:2]
    if x is None or w is None or x.type.shape is None or w.type.shape is None:
        return False
    return conv.attrs.group == x.type.shape[1] == w.type.shape[0]


def _conv_operands(graph: Graph, conv: Node, depthwise: bool, conv1d: bool = False) -> _Operands | str:
    """The integer operands of a QDQ conv (rank-3 x too with ``conv1d``), or why it is not one."""
    a: ConvAttrs = conv.attrs
    ins = graph.inputs_of(conv)
    x = _activation(graph, ins[0], "input x")
    if isinstance(x, str):
        return x
    tx = x.value.type
    if tx.rank != 4 and not (conv1d and tx.rank == 3):
        return f"input x has rank {tx.rank}, not {'3 or 4' if conv1d else 4}"
    channels = tx.shape[1] if tx.shape is not None else None
    if a.group != 1 and a.group != channels:
        return f"group {a.group} is neither 1 nor depthwise"
    if not depthwise and is_depthwise(graph, conv):
        return "depthwise convs are not fused (depthwise=0)"
    w = _weights(graph, ins[1], 0)
    if isinstance(w, str):
        return w
    oc = w[0].type.static_shape[0]
    bias = _bias(graph, ins[2] if len(ins) > 2 else None, x.scale, w[1], oc)
    if isinstance(bias, str):
        return bias
    residual = None
    if len(ins) > 3 and ins[3] is not None:
        r = _activation(graph, ins[3], "residual")
        if isinstance(r, str):
            return r
        residual = r
    if _may_overflow(x, _abs_sums(w[0], 0), bias):
        return "the int32 accumulator may overflow"
    return _Operands(x, w[0], w[1], bias, residual)


def _gemm_operands(graph: Graph, node: Node, matmul: bool) -> tuple[_Operands, int] | str:
    """The integer operands of a QDQ Gemm/MatMul and its ``trans_b``, or why it is not one."""
    if node.op == "MatMul" and not matmul:
        return "MatMul is not fused (matmul=0)"
    ins = graph.inputs_of(node)
    trans_b = 0
    if node.op == "Gemm":
        g: GemmAttrs = node.attrs
        if g.transA or g.alpha != 1.0 or (len(ins) > 2 and ins[2] is not None and g.beta != 1.0):
            return "Gemm has transA, alpha != 1 or beta != 1"
        trans_b = int(bool(g.transB))
    x = _activation(graph, ins[0], "input x")
    if isinstance(x, str):
        return x
    if x.value.type.rank is None or x.value.type.rank < 2:
        return f"input x has rank {x.value.type.rank}, not >= 2"
    if ins[1] is None or ins[1].type.rank != 2:
        return "weight is not 2-D"
    axis = 0 if trans_b else 1
    w = _weights(graph, ins[1], axis)
    if isinstance(w, str):
        return w
    n = w[0].type.static_shape[axis]
    bias = _bias(graph, ins[2] if len(ins) > 2 else None, x.scale, w[1], n)
    if isinstance(bias, str):
        return bias
    if _may_overflow(x, _abs_sums(w[0], axis), bias):
        return "the int32 accumulator may overflow"
    return _Operands(x, w[0], w[1], bias, None), trans_b


def _output_reason(graph: Graph, m: Match) -> str | None:
    """Why the QuantizeLinear root of ``m`` cannot be folded into the op ``m.node("op")``."""
    y = graph.value(m.node("op"))
    if len(graph.users(y)) != 1 or graph.is_output(y):
        return "output has users besides the QuantizeLinear"
    s, z = m.const("y_scale"), m.const("y_zero")
    assert s is not None
    if s.size != 1 or (z is not None and z.size != 1) or m.root.attrs.block_size:
        return "output is not quantized per tensor"
    if s.dtype != np.float32:
        return f"output scale is {s.dtype}, not float32"
    if m.root.output_types[0].dtype not in _ACT_TYPES:
        return f"output is quantized to {m.root.output_types[0].dtype.short}, not uint8/int8"
    return None


def _output_grid(m: Match) -> tuple[_QParam, str]:
    """The output grid of the QuantizeLinear root of ``m`` and its dtype name."""
    s, z = m.const("y_scale"), m.const("y_zero")
    assert s is not None
    zero = 0 if z is None else int(z.reshape(()))
    return _QParam(m.value("op"), float(s.reshape(())), zero), _ACT_TYPES[m.root.output_types[0].dtype]


def _q_pattern(op: str, domain: str = "") -> Op:
    return Op(
        "QuantizeLinear",
        (Op(op, name="op", domain=domain, shared=True), Const("y_scale"), Const("y_zero", optional=True)),
    )


def _qconv(rw: Rewriter, conv: Node, ops: _Operands, out: str, y: _QParam | None) -> Value:
    """Add the kiln::QConv node for ``conv`` with output type ``out``."""
    a = conv.attrs
    fields = {f: getattr(a, f) for f in FusedConvAttrs.__dataclass_fields__ if hasattr(a, f)}
    attrs = QConvAttrs(
        **fields,
        x_scale=ops.x.scale,
        x_zero=ops.x.zero,
        w_scales=ops.w_scales,
        y_scale=y.scale if y is not None else 1.0,
        y_zero=y.zero if y is not None else 0,
        out_dtype=out,
        r_scale=ops.residual.scale if ops.residual is not None else 1.0,
        r_zero=ops.residual.zero if ops.residual is not None else 0,
    )
    ins: list[Value | None] = [ops.x.value, ops.w, ops.bias, ops.residual.value if ops.residual else None]
    while ins[-1] is None:
        ins.pop()
    if ops.x.value.type.rank != 3:
        return rw.op("QConv", ins, attrs, domain=KILN, like=conv)
    # 1-D: the 2-D conv on [N, C, 1, L] with the window (1, k) (see the module docstring)
    base = conv.name or conv.output_names[0]
    axes = rw.const(np.asarray([2], np.int64), f"{base}_h")
    assert ops.w.const is not None
    ins[1] = rw.const(np.expand_dims(ops.w.const, 2), f"{base}_w2d")
    ins[0] = rw.op("Unsqueeze", [ops.x.value, axes], name=f"{base}_x2d")
    if ops.residual is not None:
        ins[3] = rw.op("Unsqueeze", [ops.residual.value, axes], name=f"{base}_r2d")
    y2d = rw.op("QConv", ins, attrs_2d(attrs), domain=KILN, name=f"{base}_2d")
    return rw.op("Squeeze", [y2d, axes], name=f"{base}_1d")


def _qgemm(rw: Rewriter, node: Node, ops: _Operands, trans_b: int, out: str, y: _QParam | None) -> Value:
    """Add the kiln::QGemm node for the Gemm/MatMul ``node`` with output type ``out``."""
    attrs = QGemmAttrs(
        trans_b=trans_b,
        x_scale=ops.x.scale,
        x_zero=ops.x.zero,
        w_scales=ops.w_scales,
        y_scale=y.scale if y is not None else 1.0,
        y_zero=y.zero if y is not None else 0,
        out_dtype=out,
    )
    ins = [ops.x.value, ops.w] + ([ops.bias] if ops.bias is not None else [])
    return rw.op("QGemm", ins, attrs, domain=KILN, like=node)


class _Fusion(Rule):
    """One QDQ fusion: ``operands`` reads the integer operands (or says why not), ``build`` adds
    the fused op; ``quantized_out`` rules take the region's QuantizeLinear as their root."""

    option: bool = True  # depthwise for convs, matmul for Gemm/MatMul
    quantized_out = True

    def operands(self, graph: Graph, node: Node) -> Any:
        raise NotImplementedError

    def build(self, rw: Rewriter, node: Node, ops: Any, out: str, y: _QParam | None) -> Value:
        raise NotImplementedError

    def check(self, graph: Graph, m: Match) -> str | None:
        node = m.node("op")
        reason = _output_reason(graph, m) if self.quantized_out else None
        ops = reason or self.operands(graph, node)
        return ops if isinstance(ops, str) else None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        node = m.node("op")
        ops = self.operands(rw.graph, node)
        assert not isinstance(ops, str)
        y, out = _output_grid(m) if self.quantized_out else (None, "float32")
        rw.replace(rw.graph.value(m.root), self.build(rw, node, ops, out, y), take_name=True)


@dataclass
class _ConvFusion(_Fusion):
    option: bool = True
    conv1d: bool = False  # fuse rank-3 (1-D) convs as 2-D ones on [N, C, 1, L]

    def operands(self, graph: Graph, node: Node) -> _Operands | str:
        return _conv_operands(graph, node, self.option, self.conv1d)

    def build(self, rw: Rewriter, node: Node, ops: _Operands, out: str, y: _QParam | None) -> Value:
        return _qconv(rw, node, ops, out, y)


@dataclass
class _GemmFusion(_Fusion):
    option: bool = True

    def operands(self, graph: Graph, node: Node) -> tuple[_Operands, int] | str:
        return _gemm_operands(graph, node, self.option)

    def build(
        self, rw: Rewriter, node: Node, ops: tuple[_Operands, int], out: str, y: _QParam | None
    ) -> Value:
        return _qgemm(rw, node, *ops, out, y)


@dataclass
class QuantizedConv(_ConvFusion):
    """q_y(conv(dq(x), dq(W), dq(b), dq(r))) -> QConv{out = y's dtype} (option: fuse depthwise)."""

    name = "quantized-conv"
    pattern = _q_pattern("Conv")


@dataclass
class QuantizedFusedConv(QuantizedConv):
    """The same for kiln::FusedConv."""

    pattern = _q_pattern("FusedConv", KILN)


@dataclass
class FloatOutConv(_ConvFusion):
    """conv(dq(x), dq(W), dq(b), dq(r)) whose output stays float -> QConv{out = float32}."""

    name = "float-out-conv"
    pattern = Op("Conv", name="op")
    quantized_out = False


@dataclass
class FloatOutFusedConv(FloatOutConv):
    """The same for kiln::FusedConv."""

    pattern = Op("FusedConv", name="op", domain=KILN)


@dataclass
class QuantizedGemm(_GemmFusion):
    """q_y(dq(x) @ dq(W) + dq(b)) (Gemm or MatMul) -> QGemm{out = y's dtype} (option: fuse MatMul)."""

    name = "quantized-gemm"
    pattern = Op(
        "QuantizeLinear",
        (Op(("Gemm", "MatMul"), name="op", shared=True), Const("y_scale"), Const("y_zero", optional=True)),
    )


@dataclass
class FloatOutGemm(_GemmFusion):
    """dq(x) @ dq(W) + dq(b) whose output stays float -> QGemm{out = float32}."""

    name = "float-out-gemm"
    pattern = Op(("Gemm", "MatMul"), name="op")
    quantized_out = False


@register_pass
@dataclass(frozen=True)
class FuseQuantizedOps(Pass):
    """Turn QDQ conv and Gemm/MatMul regions into kiln::QConv / kiln::QGemm (quantized output
    first, then float output)."""

    name = "fuse-quantized-ops"
    depthwise: bool = True  # fuse depthwise convs (group = in = out channels)
    float_out: bool = True  # fuse regions whose output stays float (QConv/QGemm{out = float32})
    gemm: bool = True  # fuse Gemm/MatMul into QGemm
    matmul: bool = True  # with gemm: fuse MatMul too (else only Gemm)
    conv1d: bool = False  # fuse 1-D convs (rank-3 x) as 2-D QConvs with H = 1

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        dw, c1 = self.depthwise, self.conv1d
        quantized: list[Rule] = [QuantizedConv(dw, c1), QuantizedFusedConv(dw, c1)]
        float_out: list[Rule] = [FloatOutConv(dw, c1), FloatOutFusedConv(dw, c1)]
        if self.gemm:
            quantized.append(QuantizedGemm(self.matmul))
            float_out.append(FloatOutGemm(self.matmul))
        result = apply_rules(graph, quantized, near_misses=ctx.near_misses)
        if self.float_out:
            result.merge(apply_rules(graph, float_out, near_misses=ctx.near_misses))
        return result
