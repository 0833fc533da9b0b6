"""Attention (ONNX opset 23) on 4-D float32 Q, K, V with one head count and an optional additive
mask: ``Y = softmax(scale · Q Kᵀ + M) V``, rows without a finite score giving 0.

CPU targets run Kiln's fused attention kernel (:mod:`backends.tvm.kernels.attention`): Kᵀ and
the mask padded along the keys to whole vectors (zero keys, -inf mask), Q (and a per-row
mask) along the queries to whole row tiles, the padded rows sliced off after. Other
targets take the Relax matmul / softmax / matmul. What the rule refuses (3-D inputs, a KV cache,
grouped-query heads, softcap, causal, a bool mask...) is decomposed by ``decompose`` and, as a
4-D chain, fused back by ``fuse-attention``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.table import LowerContext, lowers
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType

__all__: list[str] = []


def _static(graph: Graph, node: Node, port: int) -> tuple[int, ...] | None:
    ins = graph.inputs_of(node)
    v = ins[port] if port < len(ins) else None
    if v is None:
        return None
    s = v.type.shape
    if s is None or not all(isinstance(d, int) for d in s):
        return None
    return tuple(int(d) for d in s)


def _attention_reason(graph: Graph, node: Node) -> str | None:
    a = node.attrs
    ins = graph.inputs_of(node)
    if node.num_outputs > 1 or any(ins[i] is not None for i in (4, 5) if i < len(ins)):
        return "Attention with a KV cache or extra outputs lowers only decomposed"
    if a.softcap > 0 or a.is_causal:
        return "Attention with softcap or is_causal lowers only decomposed"
    shapes = [_static(graph, node, i) for i in range(3)]
    if any(s is None or len(s) != 4 for s in shapes):
        return "only 4-D static Attention lowers natively"
    q, k, v = (s for s in shapes if s is not None)
    if q[:2] != k[:2] or k[:3] != v[:3] or q[3] != k[3]:
        return "Attention with broadcast batch or grouped-query heads lowers only decomposed"
    if any(x is not None and x.type.dtype != DType.FLOAT32 for x in ins[:4]):
        return "only float32 Attention lowers natively"
    m = _static(graph, node, 3) if len(ins) > 3 else None
    if len(ins) > 3 and ins[3] is not None:
        if m is None or len(m) > 4:
            return "the Attention mask is not static"
        full = (1,) * (4 - len(m)) + m
        scores = (q[0], q[1], q[2], k[2])
        if any(d not in (1, e) for d, e in zip(full, scores, strict=True)):
            return "the Attention mask does not broadcast to the scores"
    return None


def _op() -> Any:
    from tvm import relax

    return relax.op


def _pad(ctx: LowerContext, x: Any, axis: int, extra: int, value: float) -> Any:
    """``x`` with ``extra`` trailing entries of ``value`` along ``axis`` of a 4-D tensor."""
    if extra == 0:
        return x
    width = [0] * 8
    width[2 * axis + 1] = extra
    return ctx.emit(_op().nn.pad(x, width, "constant", value))


@lowers("Attention", check=_attention_reason)
def _attention(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    op = _op()
    q_shape = _static(ctx.graph, node, 0)
    k_shape = _static(ctx.graph, node, 1)
    v_shape = _static(ctx.graph, node, 2)
    assert q_shape is not None and k_shape is not None and v_shape is not None
    b, h, s, d = q_shape
    t, dv = k_shape[2], v_shape[3]
    scale = float(node.attrs.scale) if node.attrs.scale is not None else 1.0 / float(np.sqrt(d))
    mask = ins[3] if len(ins) > 3 else None
    kt = ctx.emit(op.permute_dims(ins[1], [0, 1, 3, 2]))
    if not ctx.target.is_cpu:
        scores = ctx.emit(op.multiply(op.matmul(ins[0], kt), ctx.scalar(scale, "float32")))
        if mask is not None:
            scores = ctx.emit(op.add(scores, mask))
        return [ctx.emit(op.matmul(op.nn.softmax(scores, -1), ins[2]))]
    from backends.tvm.kernels.attention import AttentionSpec, attention_kernel, pick_attention_rows

    lanes = ctx.target.lanes
    rows = pick_attention_rows(s, dv, lanes)
    tp = -(-t // lanes) * lanes
    sp = -(-s // rows) * rows
    if mask is None:
        m = np.zeros((1, 1, 1, tp), np.float32)
        m[..., t:] = -np.inf
        mask4, mshape = ctx.const(m), (1, 1, 1)
    else:
        m_shape = _static(ctx.graph, node, 3)
        assert m_shape is not None
        full = (1,) * (4 - len(m_shape)) + m_shape
        mask4 = mask if len(m_shape) == 4 else ctx.emit(op.reshape(mask, full))
        if full[3] != t:
            mask4 = ctx.emit(op.broadcast_to(mask4, (*full[:3], t)))
        mask4 = _pad(ctx, mask4, 3, tp - t, float("-inf"))
        if full[2] > 1:
            mask4 = _pad(ctx, mask4, 2, sp - s, 0.0)
        mshape = (full[0], full[1], sp if full[2] > 1 else 1)
    spec = AttentionSpec(b, h, sp, d, t, tp, dv, mshape, scale, rows)
    args = [_pad(ctx, ins[0], 2, sp - s, 0.0), _pad(ctx, kt, 3, tp - t, 0.0), ins[2], mask4]
    y = ctx.call_kernel(attention_kernel(spec, ctx.target), args)
    if sp != s:
        y = ctx.emit(op.strided_slice(y, [2], [0], [s]))
    return [y]
