"""Converters of onnxruntime's transformer contrib ops (domain com.microsoft) into plain ops.

* Gelu(x) = gelu(x) (erf form); BiasGelu(a, b) = gelu(a + b);
  FastGelu(x[, b]) = gelu_tanh(x + b) = 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)));
* SkipLayerNormalization(x, skip, γ[, β[, bias]]): s = x + skip (+ bias),
  y = LayerNorm(s, γ, β; last axis, epsilon); outputs y, mean, 1/σ, s;
* EmbedLayerNormalization(ids, segment_ids, word, position, segment, γ, β[, mask[, position_ids]]):
  e = word[ids] + position[position_ids, else 0..S-1] + segment[segment_ids] (when both are given),
  y = LayerNorm(e, γ, β; last axis, epsilon); outputs y, mask_index = #{s : mask[b, s] = 1}
  per row (int32 [B], zeros without a mask, as onnxruntime counts), e;
* Attention(x, W[, b[, mask_index[, past[, attention_bias]]]]) with N heads:
  Q, K, V = split(x W + b) (``qkv_hidden_sizes``, else equal thirds), each [B, N, S, h];
  P = softmax(scale Q Kᵀ + M + attention_bias) with scale = 1/√h unless set, and
  Y = merge_heads(P V). M is additive: ``mask_filter_value`` where a key is masked by
  mask_index (1-D [B]: keys at or past each row's end; 2-D [B, T] / 3-D [B, S, T]: keys
  whose mask is 0), plus ``mask_filter_value`` above the diagonal when unidirectional (as
  onnxruntime adds them). Past state, present output, rotary embedding, 1-D [2B] and 4-D
  masks are refused with the reason.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from frontends.onnx.converter import NodeContext, converter

__all__: list[str] = []

MS = "com.microsoft"


def _op(
    ctx: NodeContext, name: str, ins: list[Value | None], attrs: dict[str, object] | None = None
) -> Value:
    return ctx.emit(name, ins, attrs, final=False)[0]


@converter("Gelu", since=1, domain=MS, needs=("Gelu",))
def gelu(ctx: NodeContext) -> list[Value]:
    """gelu(x), erf form."""
    return ctx.emit("Gelu", [ctx.require(0)], num_outputs=1)


@converter("BiasGelu", since=1, domain=MS, needs=("Add", "Gelu"))
def bias_gelu(ctx: NodeContext) -> list[Value]:
    """gelu(a + b), erf form."""
    s = _op(ctx, "Add", [ctx.require(0), ctx.require(1)])
    return ctx.emit("Gelu", [s], num_outputs=1)


@converter("FastGelu", since=1, domain=MS, needs=("Add", "Gelu"))
def fast_gelu(ctx: NodeContext) -> list[Value]:
    """gelu_tanh(x [+ bias])."""
    x = ctx.require(0)
    b = ctx.input(1)
    if b is not None:
        x = _op(ctx, "Add", [x, b])
    return ctx.emit("Gelu", [x], {"approximate": "tanh"}, num_outputs=1)


@converter("SkipLayerNormalization", since=1, domain=MS, needs=("Add", "LayerNormalization"))
def skip_layer_normalization(ctx: NodeContext) -> list[Value | None]:
    """LayerNorm(x + skip (+ bias)); the sum is output 3, mean and 1/σ outputs 1 and 2."""
    eps = float(ctx.pop("epsilon", 1e-12))
    s = _op(ctx, "Add", [ctx.require(0), ctx.require(1)])
    bias = ctx.input(4)
    if bias is not None:
        s = _op(ctx, "Add", [s, bias])
    n = ctx.num_outputs
    stats = n > 1 and any(ctx.proto.output[i] for i in range(1, min(n, 3)))
    outs: list[Value | None] = list(
        ctx.emit(
            "LayerNormalization",
            [s, ctx.require(2), ctx.input(3)],
            {"axis": -1, "epsilon": eps},
            num_outputs=3 if stats else 1,
        )
    )
    outs += [None] * (3 - len(outs))
    if n > 3 and ctx.proto.output[3]:
        ctx.graph.rename(s, ctx.proto.output[3])
        outs.append(s)
    return outs[:n]


@converter(
    "EmbedLayerNormalization",
    since=1,
    domain=MS,
    needs=("Gather", "Add", "LayerNormalization", "Equal", "Cast", "ReduceSum"),
)
def embed_layer_normalization(ctx: NodeContext) -> list[Value | None]:
    """LayerNorm(word[ids] + position[pos] + segment[seg]); mask_index counts each row's ones."""
    eps = float(ctx.pop("epsilon", 1e-12))
    ctx.pop("mask_index_type")  # onnxruntime computes mask_index either way
    ids = ctx.require(0)
    batch, seq = _static(ctx, 0, 2, "input_ids")
    positions = ctx.input(8)
    if positions is None:
        positions = ctx.constant(np.arange(seq, dtype=np.int32), "position_ids")
    e = _op(
        ctx,
        "Add",
        [_op(ctx, "Gather", [ctx.require(2), ids]), _op(ctx, "Gather", [ctx.require(3), positions])],
    )
    if ctx.input(1) is not None and ctx.input(4) is not None:
        e = _op(ctx, "Add", [e, _op(ctx, "Gather", [ctx.require(4), ctx.require(1)])])
    y = ctx.emit(
        "LayerNormalization", [e, ctx.require(5), ctx.require(6)], {"axis": -1, "epsilon": eps}, num_outputs=1
    )
    outs: list[Value | None] = [y[0]] + [None] * (ctx.num_outputs - 1)
    if ctx.num_outputs > 1 and ctx.proto.output[1]:
        mask = ctx.input(7)
        if mask is None:
            count = ctx.constant(np.zeros(batch, np.int32), "mask_index")
        else:
            ones = _op(ctx, "Equal", [mask, ctx.constant(np.ones((), mask.type.dtype.numpy), "one")])
            as_int = _op(ctx, "Cast", [ones], {"to": int(DType.INT32)})
            count = _op(ctx, "ReduceSum", [as_int, ctx.ints([1], "seq_axis")], {"keepdims": 0})
        ctx.graph.rename(count, ctx.proto.output[1])
        outs[1] = count
    if ctx.num_outputs > 2 and ctx.proto.output[2]:
        ctx.graph.rename(e, ctx.proto.output[2])
        outs[2] = e
    return outs


def _static(ctx: NodeContext, port: int, rank: int, what: str) -> tuple[int, ...]:
    t = ctx.type(port)
    if not t.is_static or len(t.static_shape) != rank:
        raise ctx.fail(f"{what} must have a static rank-{rank} shape, got {t.shape}")
    return t.static_shape


def _mask(ctx: NodeContext, batch: int, seq: int, mfv: float, causal: bool) -> Value | None:
    """The additive mask M, broadcastable to [B, N, S, T] (None when nothing is masked)."""
    m = ctx.input(3)
    zero, fill = (
        ctx.constant(np.array(0, np.float32), "zero"),
        ctx.constant(np.array(mfv, np.float32), "mask_filter"),
    )
    out: Value | None = None
    if m is not None:
        shape = m.type.shape
        if shape == (batch,):
            keys = ctx.constant(np.arange(seq, dtype=np.int32).reshape(1, seq), "key_positions")
            ends = _op(
                ctx, "Unsqueeze", [_op(ctx, "Cast", [m], {"to": int(DType.INT32)}), ctx.ints([1], "ax1")]
            )
            keep = _op(ctx, "Less", [keys, ends])
            out = _op(
                ctx, "Reshape", [_op(ctx, "Where", [keep, zero, fill]), ctx.ints([batch, 1, 1, seq], "m4")]
            )
        elif shape is not None and len(shape) in (2, 3):
            keep = _op(ctx, "Greater", [m, ctx.constant(np.zeros((), m.type.dtype.numpy), "mask_zero")])
            out = _op(ctx, "Unsqueeze", [_op(ctx, "Where", [keep, zero, fill]), ctx.ints([1], "head_axis")])
            if len(shape) == 2:
                out = _op(ctx, "Unsqueeze", [out, ctx.ints([2], "query_axis")])
        else:
            raise ctx.fail(
                f"mask_index of shape {shape} is not supported (1-D [batch] end positions, 2-D [batch, seq] "
                f"and 3-D [batch, seq, seq] masks are; 1-D [2*batch] start/end and 4-D masks are not)"
            )
    if causal:
        tri = np.triu(np.full((seq, seq), mfv, np.float32), k=1)
        c = ctx.constant(tri, "causal_mask")
        out = c if out is None else _op(ctx, "Add", [out, c])
    return out


@converter(
    "Attention",
    since=1,
    domain=MS,
    needs=(
        "MatMul",
        "Add",
        "Split",
        "Reshape",
        "Transpose",
        "Mul",
        "Softmax",
        "Where",
        "Less",
        "Greater",
        "Unsqueeze",
        "Cast",
    ),
)
def attention(ctx: NodeContext) -> list[Value | None]:
    """Multi-head self-attention with a packed QKV weight (see the module docstring)."""
    heads = int(ctx.pop("num_heads"))
    causal = bool(ctx.pop("unidirectional", 0))
    mfv = float(ctx.pop("mask_filter_value", -10000.0))
    scale = float(ctx.pop("scale", 0.0))
    sizes = tuple(int(v) for v in ctx.pop("qkv_hidden_sizes", ()) or ())
    for name in ("do_rotary", "past_present_share_buffer", "rotary_embedding_dim"):
        if int(ctx.pop(name, 0)):
            raise ctx.fail(f"attribute {name} is not supported")
    if ctx.input(4) is not None or ctx.input(6) is not None:
        raise ctx.fail("past state (inputs past / past_sequence_length) is not supported")
    if ctx.num_outputs > 1 and ctx.proto.output[1]:
        raise ctx.fail("the present output is not supported")
    batch, seq, _ = _static(ctx, 0, 3, "input")
    total = _static(ctx, 1, 2, "weights")[1]
    if not sizes:
        sizes = (total // 3,) * 3
    if len(sizes) != 3 or sum(sizes) != total or sizes[0] != sizes[1] or any(d % heads for d in sizes):
        raise ctx.fail(f"qkv_hidden_sizes {sizes} do not split weights' {total} columns into {heads} heads")
    head = sizes[0] // heads
    qkv = _op(ctx, "MatMul", [ctx.require(0), ctx.require(1)])
    if ctx.input(2) is not None:
        qkv = _op(ctx, "Add", [qkv, ctx.input(2)])
    q, k, v = ctx.emit("Split", [qkv, ctx.ints(sizes, "qkv_sizes")], {"axis": -1}, num_outputs=3, final=False)

    def heads_of(x: Value, width: int, perm: tuple[int, ...]) -> Value:
        x = _op(ctx, "Reshape", [x, ctx.ints([batch, seq, heads, width // heads], f"heads{width}")])
        return _op(ctx, "Transpose", [x], {"perm": perm})

    qh, kt, vh = (
        heads_of(q, sizes[0], (0, 2, 1, 3)),
        heads_of(k, sizes[1], (0, 2, 3, 1)),
        heads_of(v, sizes[2], (0, 2, 1, 3)),
    )
    alpha = scale if scale else 1.0 / math.sqrt(head)
    scores = _op(
        ctx, "Mul", [_op(ctx, "MatMul", [qh, kt]), ctx.constant(np.array(alpha, np.float32), "scale")]
    )
    mask = _mask(ctx, batch, seq, mfv, causal)
    if mask is not None:
        scores = _op(ctx, "Add", [scores, mask])
    if ctx.input(5) is not None:
        scores = _op(ctx, "Add", [scores, ctx.input(5)])
    ctxv = _op(ctx, "MatMul", [_op(ctx, "Softmax", [scores], {"axis": -1}), vh])
    merged = _op(ctx, "Transpose", [ctxv], {"perm": (0, 2, 1, 3)})
    y = ctx.emit("Reshape", [merged, ctx.ints([batch, seq, sizes[2]], "merged_shape")], num_outputs=1)[0]
    return [y] + [None] * (ctx.num_outputs - 1)
