"""fuse-quantized-conv: a QDQ convolution region becomes one integer kiln::QConv.

With dq(q; s, z) = (q - z) s, s_w per output channel and s_b = s_x s_w (Kiln's bias grid):

* q_y(act(conv(dq(x_q), dq(W_q), dq(b_q)) + dq(r_q))) = QConv(x_q, W_q, b_q, r_q){out = y's dtype}
  since conv(dq(x_q), dq(W_q)) + dq(b_q) = (conv(x_q - z_x, W_q) + b_q) * s_x s_w exactly in
  real arithmetic (float rounding aside);
* a conv whose output is not quantized alone (float tail, ``--keep-float`` consumer, or a
  value also read in float) becomes QConv{out = float32}.

Both need constant per-tensor activation parameters, int8 weights with zero point 0 (per
tensor or per output channel), an int32 bias on the s_x s_w grid, rank-4 data and group 1
or depthwise. DequantizeLinear nodes left without users are removed by the rewriter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.conv import ConvAttrs
from compiler.ops.fused import KILN, FusedConvAttrs
from compiler.ops.qconv import QConvAttrs, qconv_multiplier
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Const, Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["FuseQuantizedConv", "QuantizedConv", "FloatOutConv"]

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


def _weights(graph: Graph, conv: Node) -> tuple[Value, tuple[float, ...]] | str:
    dq = _dq_source(graph, graph.inputs_of(conv)[1], "weight")
    if isinstance(dq, str):
        return dq
    node, w, s, zp = dq
    if w.const is None or w.type.dtype != DType.INT8:
        return "weight is not an int8 constant"
    if s.const is None or s.const.dtype != np.float32:
        return "weight scale is not a float32 constant"
    if zp is not None and (zp.const is None or np.any(zp.const != 0)):
        return "weight zero point is not 0"
    oc = w.const.shape[0]
    if s.const.size != 1 and (s.const.ndim != 1 or s.const.size != oc or node.attrs.axis not in (0, -4)):
        return "weight scales are neither per tensor nor per output channel"
    return w, tuple(float(v) for v in s.const.reshape(-1))


def _bias(graph: Graph, conv: Node, x_scale: float, w_scales: tuple[float, ...]) -> Value | None | str:
    ins = graph.inputs_of(conv)
    if len(ins) < 3 or ins[2] is None:
        return None
    dq = _dq_source(graph, ins[2], "bias")
    if isinstance(dq, str):
        return dq
    _, b, s, zp = dq
    if b.const is None or b.type.dtype != DType.INT32:
        return "bias is not an int32 constant"
    if s.const is None or (zp is not None and (zp.const is None or np.any(zp.const != 0))):
        return "bias scale is not constant or its zero point is not 0"
    want = np.broadcast_to(qconv_multiplier(x_scale, w_scales), b.const.shape).astype(np.float64)
    got = np.broadcast_to(s.const.reshape(-1), b.const.shape).astype(np.float64)
    if not np.allclose(got, want, rtol=_BIAS_RTOL, atol=0.0):
        return "bias scale is not x_scale * w_scale"
    return b


def _operands(graph: Graph, conv: Node) -> _Operands | str:
    """The integer operands of a QDQ conv, or why it is not one."""
    a: ConvAttrs = conv.attrs
    ins = graph.inputs_of(conv)
    x = _activation(graph, ins[0], "input x")
    if isinstance(x, str):
        return x
    tx = x.value.type
    if tx.rank != 4:
        return f"input x has rank {tx.rank}, not 4"
    channels = tx.shape[1] if tx.shape is not None else None
    if a.group != 1 and a.group != channels:
        return f"group {a.group} is neither 1 nor depthwise"
    w = _weights(graph, conv)
    if isinstance(w, str):
        return w
    bias = _bias(graph, conv, x.scale, w[1])
    if isinstance(bias, str):
        return bias
    residual = None
    if len(ins) > 3 and ins[3] is not None:
        r = _activation(graph, ins[3], "residual")
        if isinstance(r, str):
            return r
        residual = r
    if _may_overflow(x, w[0], bias):
        return "the int32 accumulator may overflow"
    return _Operands(x, w[0], w[1], bias, residual)


def _may_overflow(x: _QParam, w: Value, bias: Value | None) -> bool:
    """Worst case |acc| = max|x_q - z_x| * sum|W_oc| + |b_oc| beyond int32."""
    info = np.iinfo(x.value.type.dtype.numpy)
    span = max(info.max - x.zero, x.zero - info.min)
    assert w.const is not None
    worst = span * np.abs(w.const.astype(np.int64)).reshape(w.const.shape[0], -1).sum(axis=1)
    if bias is not None and bias.const is not None:
        worst = worst + np.abs(bias.const.astype(np.int64))
    return bool(worst.max(initial=0) > _INT32_MAX)


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
    return rw.op("QConv", ins, attrs, domain=KILN, like=conv)


class QuantizedConv(Rule):
    """q_y(conv(dq(x), dq(W), dq(b), dq(r))) -> QConv{out = y's dtype}."""

    name = "quantized-conv"
    pattern = Op(
        "QuantizeLinear",
        (Op("Conv", name="conv", shared=True), Const("y_scale"), Const("y_zero", optional=True)),
    )

    def check(self, graph: Graph, m: Match) -> str | None:
        conv = m.node("conv")
        y = graph.value(conv)
        if len(graph.users(y)) != 1 or graph.is_output(y):
            return "conv output has users besides the QuantizeLinear"
        s, z = m.const("y_scale"), m.const("y_zero")
        assert s is not None
        if s.size != 1 or (z is not None and z.size != 1) or m.root.attrs.block_size:
            return "output is not quantized per tensor"
        if s.dtype != np.float32:
            return f"output scale is {s.dtype}, not float32"
        if m.root.output_types[0].dtype not in _ACT_TYPES:
            return f"output is quantized to {m.root.output_types[0].dtype.short}, not uint8/int8"
        ops = _operands(graph, conv)
        return ops if isinstance(ops, str) else None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        conv = m.node("conv")
        ops = _operands(rw.graph, conv)
        assert not isinstance(ops, str)
        s, z = m.const("y_scale"), m.const("y_zero")
        assert s is not None
        y = _QParam(rw.graph.value(m.root), float(s.reshape(())), 0 if z is None else int(z.reshape(())))
        out = _ACT_TYPES[m.root.output_types[0].dtype]
        rw.replace(rw.graph.value(m.root), _qconv(rw, conv, ops, out, y), take_name=True)


class QuantizedFusedConv(QuantizedConv):
    """The same for kiln::FusedConv."""

    pattern = Op(
        "QuantizeLinear",
        (
            Op("FusedConv", name="conv", domain=KILN, shared=True),
            Const("y_scale"),
            Const("y_zero", optional=True),
        ),
    )


class FloatOutConv(Rule):
    """conv(dq(x), dq(W), dq(b), dq(r)) whose output stays float -> QConv{out = float32}."""

    name = "float-out-conv"
    pattern = Op("Conv", name="conv")

    def check(self, graph: Graph, m: Match) -> str | None:
        ops = _operands(graph, m.root)
        return ops if isinstance(ops, str) else None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        ops = _operands(rw.graph, m.root)
        assert not isinstance(ops, str)
        rw.replace(rw.graph.value(m.root), _qconv(rw, m.root, ops, "float32", None), take_name=True)


class FloatOutFusedConv(FloatOutConv):
    """The same for kiln::FusedConv."""

    pattern = Op("FusedConv", name="conv", domain=KILN)


@register_pass
@dataclass(frozen=True)
class FuseQuantizedConv(Pass):
    """Turn QDQ conv regions into kiln::QConv (quantized output first, then float output)."""

    name = "fuse-quantized-conv"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        result = apply_rules(graph, [QuantizedConv(), QuantizedFusedConv()], near_misses=ctx.near_misses)
        result.merge(apply_rules(graph, [FloatOutConv(), FloatOutFusedConv()], near_misses=ctx.near_misses))
        return result
