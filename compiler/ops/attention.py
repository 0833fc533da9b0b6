"""Transformer ops of opset 23: RotaryEmbedding and Attention.

RotaryEmbedding: with (c, s) = (cos_cache, sin_cache)[position_ids] (or the caches
themselves, [batch, seq, d/2], without position ids), the first d =
rotary_embedding_dim features of each head are split into halves (x1, x2) -- or
even/odd features when ``interleaved`` -- and become (c·x1 - s·x2, s·x1 + c·x2);
the rest pass through. X is [batch, heads, seq, head] or [batch, seq, heads·head].

Attention: K and V are appended to the past cache (present_key/value), repeated
to Q's head count (grouped-query attention), and
Y = softmax(softcap(scale · Q Kᵀ) + bias) V, where bias adds a float mask, and the
dtype's lowest value (as onnxruntime) where a bool mask is false and, when
``is_causal``, replaces the bias where key j > query i + past length.
A row whose bias is -inf everywhere gives 0. 3-D Q/K/V are [batch, seq, heads·head]
(``q_num_heads``/``kv_num_heads`` give the head counts). The optional 4th output
is the score after the matmul (mode 0), the softcap (1), the bias (2) or the softmax (3).
References compute in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Dim, TensorType
from compiler.ops.inputs import arg, first
from compiler.ops.registry import InferContext, OpDef, register
from compiler.ops.shapes import UNKNOWN, sum_dims

__all__ = ["RotaryEmbeddingAttrs", "AttentionAttrs"]


@dataclass(frozen=True)
class RotaryEmbeddingAttrs:
    """RotaryEmbedding: ``num_heads`` (3-D input), rotated features (0 = all), interleaving."""

    interleaved: int = 0
    num_heads: int = 0
    rotary_embedding_dim: int = 0


@dataclass(frozen=True)
class AttentionAttrs:
    """Attention (opset 23); ``scale`` defaults to 1/sqrt(head size)."""

    is_causal: int = 0
    kv_num_heads: int | None = None
    q_num_heads: int | None = None
    qk_matmul_output_mode: int = 0
    scale: float | None = None
    softcap: float = 0.0
    softmax_precision: int | None = None


def _infer_rotary(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if t.rank is not None and t.rank not in (3, 4):
        raise ctx.fail(f"X must be 3-D or 4-D, got rank {t.rank}")
    if t.rank == 3 and ctx.attrs.num_heads < 1:
        raise ctx.fail("a 3-D X needs num_heads")
    return [t]


def _ref_rotary(ins: list[np.ndarray | None], a: RotaryEmbeddingAttrs, n: int) -> list[np.ndarray]:
    x, cos, sin, pos = first(ins), np.asarray(arg(ins, 1)), np.asarray(arg(ins, 2)), arg(ins, 3)
    h = x.transpose(0, 2, 1, 3) if x.ndim == 4 else x.reshape(*x.shape[:2], a.num_heads, -1)
    h = h.astype(np.float64)  # [batch, seq, heads, head]
    d = a.rotary_embedding_dim or h.shape[-1]
    if pos is not None:
        cos, sin = cos[np.asarray(pos)], sin[np.asarray(pos)]
    if cos.shape[-1] != d // 2 or sin.shape[-1] != d // 2:
        raise ValueError(f"cos/sin caches end in {cos.shape[-1]}/{sin.shape[-1]}, expected {d // 2}")
    c, s = cos.astype(np.float64)[:, :, None], sin.astype(np.float64)[:, :, None]
    rot = h[..., :d]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if a.interleaved else (rot[..., : d // 2], rot[..., d // 2 :])
    re, im = c * x1 - s * x2, s * x1 + c * x2
    rot = np.stack([re, im], -1).reshape(rot.shape) if a.interleaved else np.concatenate([re, im], -1)
    y = np.concatenate([rot, h[..., d:]], -1)
    y = y.transpose(0, 2, 1, 3) if x.ndim == 4 else y.reshape(x.shape)
    return [y.astype(x.dtype)]


def _heads(ctx: InferContext, shape: tuple[Dim, ...], heads: int | None, what: str) -> tuple[Dim, ...]:
    """A 3-D [batch, seq, heads·head] shape as the 4-D [batch, heads, seq, head]."""
    if len(shape) == 4:
        return shape
    if not heads:
        raise ctx.fail(f"3-D {what} needs its head count attribute")
    hidden = shape[2]
    return (shape[0], heads, shape[1], hidden // heads if isinstance(hidden, int) else UNKNOWN)


def _infer_attention(ctx: InferContext) -> list[TensorType]:
    a: AttentionAttrs = ctx.attrs
    tq = ctx.type(0)
    if not tq.dtype.is_float:
        raise ctx.fail(f"Q must be float, got {tq.dtype.short}")
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if not len(q) == len(k) == len(v) or len(q) not in (3, 4):
        raise ctx.fail(f"Q, K, V must all be 3-D or all 4-D, got {q}, {k}, {v}")
    if a.qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ctx.fail(f"qk_matmul_output_mode must be 0..3, got {a.qk_matmul_output_mode}")
    q4 = _heads(ctx, q, a.q_num_heads, "Q")
    k4, v4 = _heads(ctx, k, a.kv_num_heads, "K"), _heads(ctx, v, a.kv_num_heads, "V")
    past = ctx.shape(4)[2] if ctx.has(4) else 0
    total = sum_dims([past, k4[2]])
    y: tuple[Dim, ...] = (q4[0], q4[1], q4[2], v4[3])
    if len(q) == 3:
        y3 = y[3]
        y = (q[0], q[1], q4[1] * y3 if isinstance(q4[1], int) and isinstance(y3, int) else UNKNOWN)
    outs = [
        tq.with_shape(y),
        tq.with_shape((k4[0], k4[1], total, k4[3])),
        tq.with_shape((v4[0], v4[1], total, v4[3])),
        tq.with_shape((q4[0], q4[1], q4[2], total)),
    ]
    return outs[: ctx.num_outputs]


def _to4(x: np.ndarray, heads: int | None) -> np.ndarray:
    if x.ndim == 4:
        return x
    assert heads, "3-D attention inputs need q_num_heads and kv_num_heads"
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)


def _ref_attention(ins: list[np.ndarray | None], a: AttentionAttrs, n: int) -> list[np.ndarray]:
    q0 = first(ins)
    q = _to4(q0, a.q_num_heads).astype(np.float64)
    k = _to4(np.asarray(arg(ins, 1)), a.kv_num_heads)
    v = _to4(np.asarray(arg(ins, 2)), a.kv_num_heads)
    mask, past_k, past_v = arg(ins, 3), arg(ins, 4), arg(ins, 5)
    if past_k is not None and past_v is not None:
        k, v = np.concatenate([past_k, k], 2), np.concatenate([past_v, v], 2)
    present_k, present_v = k, v
    sq, skv = q.shape[2], k.shape[2]
    bias = np.zeros((sq, skv))
    low = float(np.finfo(q0.dtype).min)  # how onnxruntime masks (bool mask, causal)
    if mask is not None:
        m = np.asarray(mask)
        pad = [(0, 0)] * (m.ndim - 1) + [(0, skv - m.shape[-1])]
        m = np.pad(m, pad, constant_values=False if m.dtype == np.bool_ else -np.inf)
        bias = bias + (np.where(m, 0.0, low) if m.dtype == np.bool_ else m.astype(np.float64))
    if a.is_causal:
        offset = 0 if past_k is None else past_k.shape[2]
        allowed = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + offset
        bias = np.where(allowed, bias, low)
    reps = q.shape[1] // k.shape[1]
    kf, vf = np.repeat(k.astype(np.float64), reps, 1), np.repeat(v.astype(np.float64), reps, 1)
    scale = a.scale if a.scale is not None else 1.0 / np.sqrt(q.shape[3])
    qk = (q @ kf.transpose(0, 1, 3, 2)) * scale
    capped = np.tanh(qk / a.softcap) * a.softcap if a.softcap > 0 else qk
    scores = capped + bias
    top = np.max(scores, -1, keepdims=True)
    dead = np.isneginf(np.max(np.broadcast_to(bias, scores.shape), -1, keepdims=True))
    e = np.exp(scores - np.where(np.isneginf(top), 0.0, top))
    total = e.sum(-1, keepdims=True)
    p = np.where(dead, 0.0, e / np.where(total == 0, 1.0, total))
    y = p @ vf
    if q0.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    qk_out = {0: qk, 1: capped, 2: scores, 3: p}[a.qk_matmul_output_mode]
    dt = q0.dtype
    return [y.astype(dt), present_k.astype(dt), present_v.astype(dt), qk_out.astype(dt)][:n]


register(
    OpDef(
        "RotaryEmbedding",
        _infer_rotary,
        _ref_rotary,
        RotaryEmbeddingAttrs,
        inputs=(3, 4),
        min_opset=23,
        doc="rotate feature pairs (x1, x2) of each head by the cached (cos, sin) of its position",
    )
)
register(
    OpDef(
        "Attention",
        _infer_attention,
        _ref_attention,
        AttentionAttrs,
        inputs=(3, 6),
        outputs=(1, 4),
        min_opset=23,
        doc="Y = softmax(softcap(scale·Q·Kᵀ) + mask/causal bias)·V with a KV cache and grouped-query heads",
    )
)
