"""fuse-attention: the scaled-dot-product chain of 4-D tensors becomes one ONNX Attention node.

    MatMul(s_q·Q, s_k·Kᵀ) · s_1 ... / d_1 ... (+ M_1 + M_2 ...) -> Softmax(axis = last) -> MatMul(·, V)
    = Attention(Q, K, V, M_1 + M_2 ...){scale = s_q·s_k·s_1···/d_1···}

for Q [B, H, S, D], Kᵀ [B, H, D, T] and V [B, H, T, Dv] (equal batch and head dims), scalar
constants s and d (Mul by, Div by), and float masks M (a mask, T5's position bias) that each
broadcast to the scores without widening them (several are added up first: rounded once more;
a constant added through Reshape to [1, *scores.shape] and back, as Swin's shifted-window mask, is
one of them).
K is Transpose(Kᵀ, [0, 1, 3, 2]); when Kᵀ is itself a Transpose, the two permutations are
composed into one. Every intermediate value must have the chain as its only
reader. Attention's rows whose scores are all -inf give 0 where Softmax gives NaN (the only
difference, on a row with no finite score).

It runs in a backend's legalization after decompose, so an Attention the backend refuses is
decomposed first and its chain, now 4-D, comes back here: ``backend`` names the table whose check
must accept the fused node (the pass leaves the chain alone otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.backend import get_backend
from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult, Rewriter

__all__ = ["FuseAttention", "AttentionChain", "match_attention"]


@dataclass(frozen=True)
class AttentionChain:
    """What the chain ending at ``out`` (the P·V MatMul) computes."""

    q: Value
    kt: Value
    v: Value
    masks: tuple[Value | np.ndarray, ...]  # added to the scores in this order (arrays: constants)
    scale: float
    nodes: tuple[Node, ...]  # the chain's nodes, the final MatMul last
    out: Node


def _scalar(v: Value | None) -> float | None:
    c = None if v is None else v.const
    if c is None or c.size != 1 or not np.issubdtype(c.dtype, np.floating):
        return None
    return float(c.reshape(-1)[0])


def _producer(graph: Graph, v: Value | None, op: str) -> Node | None:
    """``v``'s producer when it is an ``op`` node read only by one node."""
    if v is None or v.producer.op != op or v.producer.domain != "":
        return None
    return v.producer if len(graph.users(v)) == 1 and not graph.is_output(v) else None


def _strip_scale(graph: Graph, v: Value, nodes: list[Node]) -> tuple[Value, float]:
    """``v`` without a chain of Mul/Div by scalar constants (single reader each); their factor."""
    factor = 1.0
    while True:
        node = _producer(graph, v, "Mul") or _producer(graph, v, "Div")
        if node is None:
            return v, factor
        a, b = graph.inputs_of(node)
        sb = _scalar(b)
        sa = _scalar(a) if node.op == "Mul" else None
        if sb is not None and a is not None and a.type.shape == v.type.shape:
            factor *= sb if node.op == "Mul" else 1.0 / sb
            v = a
        elif sa is not None and b is not None and b.type.shape == v.type.shape:
            factor *= sa
            v = b
        else:
            return v, factor
        nodes.append(node)


def _scores_like(graph: Graph, v: Value) -> bool:
    """True when ``v`` can be the score side of an Add: a single-reader MatMul, Mul, Div or Add."""
    return any(_producer(graph, v, op) is not None for op in ("MatMul", "Mul", "Div", "Add"))


def _lifted_constant_add(graph: Graph, x: Value) -> tuple[Value, np.ndarray, list[Node]] | None:
    """Reshape(Reshape(y, [1, *y.shape]) + c, y.shape) = y + c[0] for a float32 constant c of at
    most that rank (a leading axis of 1): (y, c[0] broadcast-ready, the three nodes)."""
    outer = _producer(graph, x, "Reshape")
    add = _producer(graph, graph.inputs_of(outer)[0], "Add") if outer is not None else None
    if outer is None or add is None:
        return None
    a, b = graph.inputs_of(add)
    assert a is not None and b is not None
    lifted, c = (a, b) if b.const is not None else (b, a)
    inner = _producer(graph, lifted, "Reshape")
    cv = c.const
    if inner is None or cv is None or cv.dtype != np.float32:
        return None
    y = graph.inputs_of(inner)[0]
    assert y is not None
    ys = y.type.shape
    if ys is None or ys != x.type.shape or lifted.type.shape != (1, *ys) or cv.ndim > len(ys) + 1:
        return None
    if cv.ndim == len(ys) + 1:
        if cv.shape[0] != 1:
            return None
        cv = cv.reshape(cv.shape[1:])
    return y, cv, [outer, add, inner]


def _static4(v: Value) -> tuple[int, ...] | None:
    s = v.type.shape
    if s is None or len(s) != 4 or not all(isinstance(d, int) for d in s):
        return None
    return tuple(int(d) for d in s)


def _broadcasts_into(v: Value, scores: tuple[int, ...]) -> bool:
    """True when ``v``'s static shape broadcasts into ``scores`` without widening it."""
    s = v.type.shape
    if s is None or not all(isinstance(d, int) for d in s):
        return False
    mask = tuple(int(d) for d in s)
    if len(mask) > len(scores):
        return False
    full = (1,) * (len(scores) - len(mask)) + mask
    return all(m in (1, s) for m, s in zip(full, scores, strict=True))


def match_attention(graph: Graph, out: Node) -> AttentionChain | None:
    """The chain ending at the MatMul ``out``, or None when ``out`` does not end one."""
    if out.op != "MatMul" or out.domain != "":
        return None
    p, v = graph.inputs_of(out)
    nodes: list[Node] = []
    soft = _producer(graph, p, "Softmax")
    if soft is None or v is None:
        return None
    x = graph.inputs_of(soft)[0]
    assert x is not None
    shape = _static4(x)
    if shape is None or int(soft.attrs.axis) % 4 != 3 or x.type.dtype != DType.FLOAT32:
        return None
    nodes.append(soft)
    masks: list[Value | np.ndarray] = []
    while True:  # (s + m1) + m2 ...: masks m2, m1
        lifted = _lifted_constant_add(graph, x)
        if lifted is not None:  # Swin's window mask, added in 5-D
            x, const, extra = lifted
            full = (1,) * (4 - const.ndim) + const.shape
            if any(m not in (1, e) for m, e in zip(full, shape, strict=True)):
                return None
            nodes.extend(extra)
            masks.insert(0, const)
            continue
        add = _producer(graph, x, "Add")
        if add is None:
            break
        a, b = graph.inputs_of(add)
        assert a is not None and b is not None
        scores, mask = (a, b) if _scores_like(graph, a) else (b, a)
        if not _scores_like(graph, scores) or scores.type.shape != x.type.shape:
            return None
        if mask.type.dtype != DType.FLOAT32 or not _broadcasts_into(mask, shape):
            return None
        nodes.append(add)
        masks.insert(0, mask)
        x = scores
    x, scale = _strip_scale(graph, x, nodes)
    qk = _producer(graph, x, "MatMul")
    if qk is None:
        return None
    nodes.append(qk)
    q, kt = graph.inputs_of(qk)
    assert q is not None and kt is not None
    q, sq = _strip_scale(graph, q, nodes)
    kt, sk = _strip_scale(graph, kt, nodes)
    qs, ks, vs = _static4(q), _static4(kt), _static4(v)
    if qs is None or ks is None or vs is None:
        return None
    batch, heads, queries, depth = qs
    keys = ks[3]
    if ks[:3] != (batch, heads, depth) or vs[:3] != (batch, heads, keys) or shape != (*qs[:3], keys):
        return None
    if any(t.type.dtype != DType.FLOAT32 for t in (q, kt, v)):
        return None
    nodes.append(out)
    return AttentionChain(q, kt, v, tuple(masks), scale * sq * sk, tuple(nodes), out)


def _key(rw: Rewriter, graph: Graph, kt: Value, name: str) -> Value:
    """K = Kᵀ with its last two axes swapped (composed with Kᵀ's own Transpose, if any)."""
    perm = (0, 1, 3, 2)
    t = kt.producer
    if t.op == "Transpose" and t.domain == "" and t.attrs.perm is not None:
        inner = graph.inputs_of(t)[0]
        assert inner is not None
        composed = tuple(int(t.attrs.perm[i]) for i in perm)
        return rw.op("Transpose", [inner], {"perm": composed}, name=f"{name}_k")
    return rw.op("Transpose", [kt], {"perm": perm}, name=f"{name}_k")


@register_pass
@dataclass(frozen=True)
class FuseAttention(Pass):
    """Rewrite each attention chain into one Attention node (see the module docstring)."""

    name = "fuse-attention"
    backend: str = ""
    target: str = ""

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        table = ctx.capabilities
        if table is None and self.backend:
            table = get_backend(self.backend).capabilities(self.target or self.backend)
        with Rewriter(graph) as rw:
            for node in graph.ops():
                if not graph.has_node(node.id):
                    continue
                chain = match_attention(graph, node)
                if chain is None:
                    continue
                nm = node.name or node.output_names[0]
                k = _key(rw, graph, chain.kt, nm)
                masks = [
                    rw.const(m, f"{nm}_mask_c{i}") if isinstance(m, np.ndarray) else m
                    for i, m in enumerate(chain.masks)
                ]
                mask = masks[0] if masks else None
                for i, extra in enumerate(masks[1:]):
                    mask = rw.op("Add", [mask, extra], name=f"{nm}_mask{i + 1}")
                ins = [chain.q, k, chain.v] + ([mask] if mask is not None else [])
                y = rw.op("Attention", ins, {"scale": chain.scale}, name=f"{nm}_attention")
                if table is not None and table.reason(graph, y.producer) is not None:
                    rw.erase_dead(y.producer)
                    continue
                rw.replace(graph.value(node), y, take_name=True)
                rw.applied("fuse-attention")
        return rw.result
