"""Decompositions of the opset-23 transformer ops (static shapes).

* rotary-embedding: with (c, s) = (cos, sin)[position_ids] (or the caches as given) broadcast
  over heads, the first d features of each head split into (x1, x2) -- halves, or even/odd
  pairs when ``interleaved`` (a Reshape to [..., d/2, 2] and two unit Slices) -- and
  y = Concat(c·x1 - s·x2, s·x1 + c·x2, x[..., d:]). A 3-D X is viewed as [batch, seq, heads, head].
* attention: Q, K, V are viewed as [batch, heads, seq, head] (3-D: Reshape then Transpose),
  K = Concat(past_K, K), V = Concat(past_V, V) along the sequence (these are the present
  outputs); grouped-query heads repeat K and V as Reshape [b, h_kv, 1, t, d] -> Expand
  [b, h_kv, r, t, d] -> Reshape [b, h_kv·r, t, d] (head j reads kv head j // r, as np.repeat);
  qk = (Q·Kᵀ)·scale, capped = tanh(qk / softcap)·softcap (softcap > 0), bias = mask (float) or
  Where(mask, 0, lowest) (bool), then Where(causal_allowed, bias, lowest) when ``is_causal``;
  P = Softmax(capped + bias) and Y = P·V.
* attention-dead-rows: the same, for a float mask that may hold -inf on a whole row, plus
  P = Where(ReduceMax(bias) = -inf, 0, P) (the op gives 0 where every key is masked out).

Both refuse a mask shorter than the key sequence (the op pads it) and dynamic shapes.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, ints, replace_outputs, static_reason

__all__ = ["ROTARY_EMBEDDING", "ATTENTION", "ATTENTION_DEAD_ROWS"]


def _ins(graph: Graph, node: Node) -> list[Value | None]:
    ins = list(graph.inputs_of(node))
    return ins + [None] * (6 - len(ins))


def _shape(v: Value) -> tuple[int, ...]:
    shape = v.type.shape
    assert shape is not None and all(isinstance(d, int) for d in shape), "the check requires static shapes"
    return tuple(int(d) for d in shape)


def _c(rw: Rewriter, like: Value, v: float | np.ndarray, name: str) -> Value:
    return rw.const(np.asarray(v, like.type.dtype.numpy), name)


# -- RotaryEmbedding ------------------------------------------------------------------------------


def _rotary_check(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if not x.type.dtype.is_float:
        return "X is not float"
    return static_reason(graph, node)


def _rotary_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, cos, sin, pos = _ins(graph, node)[:4]
    assert x is not None and cos is not None and sin is not None
    b, a = base_name(node), node.attrs
    xs = _shape(x)
    if len(xs) == 3:  # [batch, seq, heads·head] -> [batch, seq, heads, head]
        h = rw.op("Reshape", [x, ints(rw, [xs[0], xs[1], a.num_heads, -1], f"{b}_4d")], name=f"{b}_heads")
    else:
        h = x
    hs = _shape(h)
    head = hs[3]
    d = a.rotary_embedding_dim or head
    if pos is not None:
        cos = rw.op("Gather", [cos, pos], {"axis": 0}, name=f"{b}_cos")
        sin = rw.op("Gather", [sin, pos], {"axis": 0}, name=f"{b}_sin")
    batch, seq = hs[0], (hs[1] if len(xs) == 3 else hs[2])
    # (c, s): [batch, seq, d/2] broadcast over the heads axis (and the pair axis when interleaved)
    cs_shape = [batch, seq, 1, d // 2] if len(xs) == 3 else [batch, 1, seq, d // 2]
    if a.interleaved:
        cs_shape.append(1)
    c = rw.op("Reshape", [cos, ints(rw, cs_shape, f"{b}_cs_shape")], name=f"{b}_c")
    s = rw.op("Reshape", [sin, ints(rw, cs_shape, f"{b}_cs_shape")], name=f"{b}_s")

    def cut(v: Value, lo: int, hi: int, axis: int, nm: str) -> Value:
        starts, ends, axes = (
            ints(rw, [lo], f"{nm}_lo"),
            ints(rw, [hi], f"{nm}_hi"),
            ints(rw, [axis], f"{nm}_ax"),
        )
        return rw.op("Slice", [v, starts, ends, axes], name=nm)

    rot = cut(h, 0, d, 3, f"{b}_rot") if d < head else h
    if a.interleaved:
        pairs = rw.op("Reshape", [rot, ints(rw, [*hs[:3], d // 2, 2], f"{b}_pairs_shape")], name=f"{b}_pairs")
        x1, x2 = cut(pairs, 0, 1, 4, f"{b}_x1"), cut(pairs, 1, 2, 4, f"{b}_x2")
    else:
        x1, x2 = cut(rot, 0, d // 2, 3, f"{b}_x1"), cut(rot, d // 2, d, 3, f"{b}_x2")
    re = rw.op(
        "Sub",
        [rw.op("Mul", [c, x1], name=f"{b}_cx1"), rw.op("Mul", [s, x2], name=f"{b}_sx2")],
        name=f"{b}_re",
    )
    im = rw.op(
        "Add",
        [rw.op("Mul", [s, x1], name=f"{b}_sx1"), rw.op("Mul", [c, x2], name=f"{b}_cx2")],
        name=f"{b}_im",
    )
    y = rw.op("Concat", [re, im], {"axis": -1}, name=f"{b}_rotated")
    if a.interleaved:
        y = rw.op("Reshape", [y, ints(rw, [*hs[:3], d], f"{b}_rot_shape")], name=f"{b}_unpaired")
    if d < head:
        y = rw.op("Concat", [y, cut(h, d, head, 3, f"{b}_pass")], {"axis": -1}, name=f"{b}_joined")
    if len(xs) == 3:
        y = rw.op("Reshape", [y, ints(rw, list(xs), f"{b}_3d")], name=b)
    replace_outputs(rw, node, [y])


ROTARY_EMBEDDING = register_decomposition(
    Decomposition(
        "rotary-embedding",
        "RotaryEmbedding",
        ("Gather", "Reshape", "Slice", "Mul", "Sub", "Add", "Concat"),
        _rotary_check,
        _rotary_rewrite,
        "y = (c·x1 - s·x2, s·x1 + c·x2, x[d:]) with (c, s) = caches[position_ids]",
    )
)


# -- Attention ------------------------------------------------------------------------------------


def _dead_rows_possible(mask: Value | None) -> bool:
    """Whether the float mask may mask out a whole row with -inf (unknown unless constant)."""
    if mask is None or mask.type.dtype == DType.BOOL:
        return False
    m = mask.const
    if m is None:
        return True
    return bool(np.any(np.all(np.isneginf(m), axis=-1)))


def _attention_check(graph: Graph, node: Node, dead_rows: bool) -> str | None:
    q, k, _v, mask = _ins(graph, node)[:4]
    assert q is not None and k is not None
    if not q.type.dtype.is_float:
        return "Q is not float"
    why = static_reason(graph, node)
    if why:
        return why
    ins = _ins(graph, node)
    if (ins[4] is None) != (ins[5] is None):
        return "only one of past_key / past_value is given"
    if mask is not None:
        total = _shape(k)[2 if len(_shape(k)) == 4 else 1] + (_shape(ins[4])[2] if ins[4] is not None else 0)
        if _shape(mask)[-1] != total:
            return f"the mask covers {_shape(mask)[-1]} of {total} keys (the op pads it)"
    if _dead_rows_possible(mask) != dead_rows:
        return "a float mask may mask whole rows with -inf" if not dead_rows else "no row can be fully masked"
    return None


def _to4(rw: Rewriter, x: Value, heads: int | None, nm: str) -> Value:
    """[batch, seq, heads·head] -> [batch, heads, seq, head]; a 4-D value is returned as is."""
    xs = _shape(x)
    if len(xs) == 4:
        return x
    assert heads
    split = rw.op(
        "Reshape", [x, ints(rw, [xs[0], xs[1], heads, xs[2] // heads], f"{nm}_split")], name=f"{nm}_s"
    )
    return rw.op("Transpose", [split], {"perm": (0, 2, 1, 3)}, name=f"{nm}_4d")


def _repeat_heads(rw: Rewriter, x: Value, reps: int, nm: str) -> Value:
    """Repeat each of x's heads ``reps`` times in place: [b, h, t, d] -> [b, h·reps, t, d]."""
    if reps == 1:
        return x
    bb, h, t, d = _shape(x)
    one = rw.op("Reshape", [x, ints(rw, [bb, h, 1, t, d], f"{nm}_g")], name=f"{nm}_g")
    many = rw.op("Expand", [one, ints(rw, [bb, h, reps, t, d], f"{nm}_e")], name=f"{nm}_e")
    return rw.op("Reshape", [many, ints(rw, [bb, h * reps, t, d], f"{nm}_r")], name=f"{nm}_rep")


def _attention_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    q0, k0, v0, mask, past_k, past_v = _ins(graph, node)
    assert q0 is not None and k0 is not None and v0 is not None
    b, a = base_name(node), node.attrs
    q = _to4(rw, q0, a.q_num_heads, f"{b}_q")
    k = _to4(rw, k0, a.kv_num_heads, f"{b}_k")
    v = _to4(rw, v0, a.kv_num_heads, f"{b}_v")
    if past_k is not None and past_v is not None:
        k = rw.op("Concat", [past_k, k], {"axis": 2}, name=f"{b}_present_k")
        v = rw.op("Concat", [past_v, v], {"axis": 2}, name=f"{b}_present_v")
    present_k, present_v = k, v
    qs, ks = _shape(q), _shape(k)
    reps = qs[1] // ks[1]
    kt = rw.op("Transpose", [_repeat_heads(rw, k, reps, f"{b}_kr")], {"perm": (0, 1, 3, 2)}, name=f"{b}_kt")
    scale = a.scale if a.scale is not None else 1.0 / float(np.sqrt(qs[3]))
    qk = rw.op(
        "Mul", [rw.op("MatMul", [q, kt], name=f"{b}_qkt"), _c(rw, q0, scale, f"{b}_scale")], name=f"{b}_qk"
    )
    capped = qk
    if a.softcap > 0:
        cap = _c(rw, q0, a.softcap, f"{b}_cap")
        t = rw.op("Tanh", [rw.op("Div", [qk, cap], name=f"{b}_qk_cap")], name=f"{b}_tanh")
        capped = rw.op("Mul", [t, cap], name=f"{b}_capped")
    low = float(np.finfo(q0.type.dtype.numpy).min)
    bias: Value | None = None
    if mask is not None:
        if mask.type.dtype == DType.BOOL:
            zero, lowest = _c(rw, q0, 0.0, f"{b}_zero"), _c(rw, q0, low, f"{b}_lowest")
            bias = rw.op("Where", [mask, zero, lowest], name=f"{b}_mask_bias")
        else:
            bias = mask
    if a.is_causal:
        sq, total = qs[2], ks[2]
        past = 0 if past_k is None else _shape(past_k)[2]
        allowed = np.arange(total)[None, :] <= np.arange(sq)[:, None] + past
        if bias is None:
            bias = _c(rw, q0, np.where(allowed, 0.0, low), f"{b}_causal_bias")
        else:
            keep = rw.const(allowed, f"{b}_causal")
            bias = rw.op("Where", [keep, bias, _c(rw, q0, low, f"{b}_lowest_c")], name=f"{b}_causal_bias")
    scores = capped if bias is None else rw.op("Add", [capped, bias], name=f"{b}_scores")
    p = rw.op("Softmax", [scores], {"axis": -1}, name=f"{b}_p")
    if _dead_rows_possible(mask):
        assert bias is not None
        top = rw.op("ReduceMax", [bias, ints(rw, [-1], f"{b}_last")], name=f"{b}_bias_max")
        dead = rw.op("Equal", [top, _c(rw, q0, -np.inf, f"{b}_neginf")], name=f"{b}_dead")
        p = rw.op("Where", [dead, _c(rw, q0, 0.0, f"{b}_zero_p"), p], name=f"{b}_p_live")
    y = rw.op("MatMul", [p, _repeat_heads(rw, v, reps, f"{b}_vr")], name=f"{b}_y4")
    if len(_shape(q0)) == 3:
        ys = _shape(y)
        yt = rw.op("Transpose", [y], {"perm": (0, 2, 1, 3)}, name=f"{b}_yt")
        y = rw.op("Reshape", [yt, ints(rw, [ys[0], ys[2], ys[1] * ys[3]], f"{b}_y3")], name=b)
    scores_out = {0: qk, 1: capped, 2: scores, 3: p}[a.qk_matmul_output_mode]
    outs: list[Value | None] = [y, present_k, present_v, scores_out]
    replace_outputs(rw, node, outs[: len(graph.outputs_of(node))])


_ATTN_OPS = (
    "Reshape",
    "Transpose",
    "Concat",
    "Expand",
    "MatMul",
    "Mul",
    "Div",
    "Tanh",
    "Where",
    "Add",
    "Softmax",
)
ATTENTION = register_decomposition(
    Decomposition(
        "attention",
        "Attention",
        _ATTN_OPS,
        lambda g, n: _attention_check(g, n, dead_rows=False),
        _attention_rewrite,
        "Y = Softmax(softcap(scale·Q·Kᵀ) + bias)·V, K/V with the past cache and repeated heads",
    )
)
ATTENTION_DEAD_ROWS = register_decomposition(
    Decomposition(
        "attention-dead-rows",
        "Attention",
        (*_ATTN_OPS, "ReduceMax", "Equal"),
        lambda g, n: _attention_check(g, n, dead_rows=True),
        _attention_rewrite,
        "attention, with P = 0 on rows whose float mask is -inf everywhere",
    )
)
