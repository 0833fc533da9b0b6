"""fold-batchnorm: fold inference BatchNormalization and per-channel affines into weights.

BN(y) = y * k + c per channel, with k = g / s, c = beta - mu * k and s = sqrt(var + eps). So

* conv-bn: BN(conv(x, W) + b) = conv(x, W * k) + (b - mu) * g / s + beta = conv(x, W * k) + b * k + c,
  W scaled along its output-channel axis (Conv: axis 0; ConvTranspose, weights [C_in, M/group, ...]:
  axis 1 within each group). conv-mul and conv-add are the cases c = 0 and k = 1.
* gemm-bn: BN(alpha * A' @ B' + beta * C) = alpha * A' @ (B' * k) + (beta * C * k + c).
* matmul-bn: BN(x @ W) = Gemm(x, W * k, c) for 2-D x (for rank > 2 BN's axis 1 is not W's axis).
* bn-affine: any other BN becomes Mul(x, k) + c with constants of shape [C, 1, ..., 1] when every
  channel has |mu| <= 4 s, else the centered (x - mu) * k + beta (Sub, Mul, Add). For x near a
  large mean mu, x * k rounds at the scale |mu| * k and the following + c cancels it, losing about
  log2(1 + |mu| / s) bits of the result; folding c into a following conv (add-conv) is worse still,
  since the conv then accumulates the uncentered x and cancels only at the end. x - mu is exact
  there (Sterbenz) and every later rounding is at the result's own scale. add-conv folds Add only,
  so the Sub stays in front of a conv that absorbs k and beta.
* mul-conv: conv(x * k, W) = conv(x, W * k) along W's input channels, exact with zero padding
  since 0 * k = 0; grouped and depthwise convs map W[m, j] to input channel (m // (M/group)) * C/group + j.
* add-conv: conv(x + c, W) + b = conv(x, W) + b + sum_{j,t} W[m, j, t] * c[j] only when the conv does
  not pad (a padded border would add W * 0 instead of W * c).

New weights and biases are computed in float64 and cast back to the weights' dtype.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Const, Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["FoldBatchNorm", "RULES", "CENTER_ABOVE"]

CONVS = ("Conv", "ConvTranspose")
# bn-affine writes the centered form once some channel's |mu| / s exceeds this (> 2.3 bits lost)
CENTER_ABOVE = 4.0


def _bn(producer: Op | Any_) -> Op:
    """BatchNormalization(producer, scale, B, mean, var)."""
    return Op("BatchNormalization", (producer, Any_("g"), Any_("beta"), Any_("mu"), Any_("var")))


def _conv(ops: str | tuple[str, ...] = CONVS, shared: bool = True) -> Op:
    return Op(ops, (Any_("x"), Any_("w"), Any_("b", optional=True)), name="conv", shared=shared)


def _bn_affine(graph: Graph, m: Match) -> tuple[np.ndarray, np.ndarray] | None:
    """(k, c) in float64 of the bound BN, or None if a parameter is not constant."""
    params = [m.value(n).const for n in ("g", "beta", "mu", "var")]
    if any(p is None for p in params):
        return None
    g, beta, mu, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
    k = g / np.sqrt(var + float(m.root.attrs.epsilon))
    return k, beta - mu * k


def _single_user(graph: Graph, v: Value) -> bool:
    return len(graph.users(v)) == 1 and not graph.is_output(v)


def _per_channel(arr: np.ndarray, rank: int | None, channels: int) -> np.ndarray | None:
    """The length-``channels`` float64 vector of a constant varying at most along axis 1, else None."""
    if rank is None or rank < 2 or arr.ndim > rank:
        return None
    shape = (1,) * (rank - arr.ndim) + tuple(arr.shape)
    if shape[0] != 1 or any(d != 1 for d in shape[2:]) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(np.asarray(arr, np.float64).reshape(-1), (channels,)).copy()


def _out_channels(conv: Node, w: np.ndarray) -> int:
    return int(w.shape[0]) if conv.op == "Conv" else int(w.shape[1]) * int(conv.attrs.group)


def _scale_outputs(conv: Node, w: np.ndarray, k: np.ndarray) -> np.ndarray:
    """W scaled by k along the output channels (Conv axis 0; ConvTranspose axis 1 per group)."""
    w64, tail = w.astype(np.float64), (1,) * (w.ndim - 2)
    if conv.op == "Conv":
        return w64 * k.reshape(-1, 1, *tail)
    group, cin, mg = int(conv.attrs.group), w.shape[0], w.shape[1]
    wg = w64.reshape(group, cin // group, mg, *w.shape[2:])
    return (wg * k.reshape(group, 1, mg, *tail)).reshape(w.shape)


def _grouped(w: np.ndarray, group: int) -> np.ndarray:
    """Conv weights [M, C/group, ...] as float64 [group, M/group, C/group, prod(kernel)]."""
    return w.astype(np.float64).reshape(group, w.shape[0] // group, w.shape[1], -1)


def _conv_reason(graph: Graph, m: Match, *, shared_ok: bool = False) -> str | None:
    """Why the bound conv's weights cannot be rewritten."""
    if not shared_ok and not _single_user(graph, m.value("conv")):
        return "conv output has other users"
    if m.value("w").const is None:
        return "weights are not constant"
    b = m.values.get("b")
    return "bias is not constant" if b is not None and b.const is None else None


def _new_conv(rw: Rewriter, m: Match, w: np.ndarray, b: np.ndarray | None) -> Value:
    """A copy of the bound conv with new weights and bias (cast to the weights' dtype)."""
    conv, dt, base = m.node("conv"), m.value("w").type.dtype.numpy, m.root.output_names[0]
    ins: list[Value | None] = [m.value("x"), rw.const(w.astype(dt), f"{base}_w")]
    ins.append(None if b is None else rw.const(b.astype(dt), f"{base}_b"))
    return rw.op(conv.op, ins, conv.attrs, like=conv)


def _affine_after_conv(rw: Rewriter, m: Match, k: np.ndarray | None, c: np.ndarray | None) -> None:
    """Replace root = conv * k + c by a conv with W * k and b * k + c."""
    conv, w = m.node("conv"), m.value("w").const
    assert w is not None
    b_v = m.values.get("b")
    b = None if b_v is None or b_v.const is None else b_v.const.astype(np.float64)
    if k is not None:
        w = _scale_outputs(conv, w, k)
        b = None if b is None else b * k
    if c is not None:
        b = c if b is None else b + c
    rw.replace(rw.graph.value(m.root), _new_conv(rw, m, w, b), take_name=True)


class ConvBN(Rule):
    """BN(conv(x, W) + b) = conv(x, W * k) + b * k + c (Conv and ConvTranspose, any group)."""

    name = "conv-bn"
    pattern = _bn(_conv())

    def check(self, graph: Graph, m: Match) -> str | None:
        if _bn_affine(graph, m) is None:
            return "BN parameters are not constant"
        return _conv_reason(graph, m)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        kc = _bn_affine(rw.graph, m)
        assert kc is not None
        _affine_after_conv(rw, m, *kc)


class GemmBN(Rule):
    """BN(alpha * A' @ B' + beta * C) = Gemm(A, B' * k, beta * C * k + c; alpha, beta=1)."""

    name = "gemm-bn"
    pattern = _bn(Op("Gemm", (Any_("a"), Any_("w"), Any_("cc", optional=True)), name="gemm", shared=True))

    def check(self, graph: Graph, m: Match) -> str | None:
        if _bn_affine(graph, m) is None:
            return "BN parameters are not constant"
        if not _single_user(graph, m.value("gemm")):
            return "Gemm output has other users"
        if m.value("w").const is None:
            return "weights are not constant"
        cc = m.values.get("cc")
        return "C is not constant" if cc is not None and cc.const is None else None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        kc = _bn_affine(rw.graph, m)
        w = m.value("w").const
        assert kc is not None and w is not None
        k, c = kc
        gemm, dt = m.node("gemm"), w.dtype
        w2 = w.astype(np.float64) * (k[:, None] if gemm.attrs.transB else k[None, :])
        cc = m.values.get("cc")
        if cc is not None and cc.const is not None and gemm.attrs.beta != 0.0:
            c = gemm.attrs.beta * cc.const.astype(np.float64) * k + c
        base = m.root.output_names[0]
        ins = [m.value("a"), rw.const(w2.astype(dt), f"{base}_w"), rw.const(c.astype(dt), f"{base}_b")]
        new = rw.op("Gemm", ins, dataclasses.replace(gemm.attrs, beta=1.0), like=gemm)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


class MatMulBN(Rule):
    """BN(x @ W) = Gemm(x, W * k, c) for 2-D x and constant 2-D W."""

    name = "matmul-bn"
    pattern = _bn(Op("MatMul", (Any_("x"), Any_("w")), name="matmul", shared=True))

    def check(self, graph: Graph, m: Match) -> str | None:
        if _bn_affine(graph, m) is None:
            return "BN parameters are not constant"
        if not _single_user(graph, m.value("matmul")):
            return "MatMul output has other users"
        w = m.value("w").const
        if w is None:
            return "weights are not constant"
        if w.ndim != 2:
            return "weights are not 2-D"
        return None if m.value("x").type.rank == 2 else "input is not 2-D (BN axis 1 is not W's column axis)"

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        kc = _bn_affine(rw.graph, m)
        w = m.value("w").const
        assert kc is not None and w is not None
        k, c = kc
        base = m.root.output_names[0]
        w2 = rw.const((w.astype(np.float64) * k[None, :]).astype(w.dtype), f"{base}_w")
        b2 = rw.const(c.astype(w.dtype), f"{base}_b")
        new = rw.op("Gemm", [m.value("x"), w2, b2], like=m.node("matmul"))
        rw.replace(rw.graph.value(m.root), new, take_name=True)


class BNToAffine(Rule):
    """BN(x) = x * k + c, or (x - mu) * k + beta when some |mu| > 4 s (constants of shape [C, 1, ..., 1])."""

    name = "bn-affine"
    pattern = _bn(Any_("x"))

    def check(self, graph: Graph, m: Match) -> str | None:
        if _bn_affine(graph, m) is None:
            return "BN parameters are not constant"
        return None if m.value("x").type.rank is not None else "rank of x is unknown"

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        kc = _bn_affine(rw.graph, m)
        x = m.value("x")
        assert kc is not None and x.type.rank is not None
        shape, dt = (-1, *(1,) * (x.type.rank - 2)), x.type.dtype.numpy
        base = m.root.output_names[0]

        def const(v: np.ndarray, suffix: str) -> Value:
            return rw.const(v.reshape(shape).astype(dt), f"{base}_{suffix}")

        k, c = kc
        mu, var = (np.asarray(m.value(n).const, np.float64).reshape(-1) for n in ("mu", "var"))
        if np.all(np.abs(mu) <= CENTER_ABOVE * np.sqrt(var + float(m.root.attrs.epsilon))):
            scaled = rw.op("Mul", [x, const(k, "k")], name=f"{base}_scale")
            new = rw.op("Add", [scaled, const(c, "c")], like=m.root)
        else:
            beta = np.asarray(m.value("beta").const, np.float64).reshape(-1)
            centered = rw.op("Sub", [x, const(np.broadcast_to(mu, k.shape), "mu")], name=f"{base}_centered")
            scaled = rw.op("Mul", [centered, const(k, "k")], name=f"{base}_scale")
            new = rw.op("Add", [scaled, const(np.broadcast_to(beta, k.shape), "beta")], like=m.root)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


class _AfterConv(Rule):
    """Shared check of conv-mul / conv-add: a per-channel constant applied to a single-use conv output."""

    def check(self, graph: Graph, m: Match) -> str | None:
        reason = _conv_reason(graph, m)
        if reason:
            return reason
        w, kv = m.value("w").const, m.value("k").const
        assert w is not None
        if kv is None:
            return "the constant operand is not constant"
        rank = m.value("conv").type.rank
        if _per_channel(kv, rank, _out_channels(m.node("conv"), w)) is None:
            return "the constant is not per-channel"
        if m.root.output_types[0] != m.value("conv").type:
            return "the constant broadcasts the output"
        return None

    def _vector(self, m: Match) -> np.ndarray:
        w, kv = m.value("w").const, m.value("k").const
        assert w is not None and kv is not None
        v = _per_channel(kv, m.value("conv").type.rank, _out_channels(m.node("conv"), w))
        assert v is not None
        return v


class ConvMul(_AfterConv):
    """conv(x, W) * k = conv(x, W * k) with b * k, k per output channel."""

    name = "conv-mul"
    pattern = Op("Mul", (_conv(), Any_("k")), commutative=True)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        _affine_after_conv(rw, m, self._vector(m), None)


class ConvAdd(_AfterConv):
    """conv(x, W) + b + c = conv(x, W) with bias b + c, c per output channel."""

    name = "conv-add"
    pattern = Op("Add", (_conv(), Any_("k")), commutative=True)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        _affine_after_conv(rw, m, None, self._vector(m))


class _BeforeConv(Rule):
    """Shared check of mul-conv / add-conv: a per-input-channel constant applied just before a Conv."""

    def check(self, graph: Graph, m: Match) -> str | None:
        reason = _conv_reason(graph, m, shared_ok=True)
        if reason:
            return reason
        if m.value("pre").type != m.value("x").type:
            return "the constant broadcasts the input"
        w, kv = m.value("w").const, m.const("k")
        assert w is not None and kv is not None
        cin = int(w.shape[1]) * int(m.root.attrs.group)
        if _per_channel(kv, m.value("x").type.rank, cin) is None:
            return "the constant is not per-channel"
        return None

    def _vector(self, m: Match) -> np.ndarray:
        w, kv = m.value("w").const, m.const("k")
        assert w is not None and kv is not None
        v = _per_channel(kv, m.value("x").type.rank, int(w.shape[1]) * int(m.root.attrs.group))
        assert v is not None
        return v


class MulConv(_BeforeConv):
    """conv(x * k, W) = conv(x, W * k), W scaled along its input channels (exact: 0 * k = 0 at pads)."""

    name = "mul-conv"
    pattern = Op(
        "Conv",
        (
            Op("Mul", (Any_("x"), Const("k")), name="pre", commutative=True),
            Any_("w"),
            Any_("b", optional=True),
        ),
        name="conv",
    )

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        w = m.value("w").const
        assert w is not None
        group = int(m.root.attrs.group)
        wg = _grouped(w, group) * self._vector(m).reshape(group, 1, -1, 1)
        b = m.values.get("b")
        bias = None if b is None or b.const is None else b.const.astype(np.float64)
        rw.replace(rw.graph.value(m.root), _new_conv(rw, m, wg.reshape(w.shape), bias), take_name=True)


class AddConv(_BeforeConv):
    """conv(x + c, W) + b = conv(x, W) + b + sum_{j,t} W[m, j, t] * c[j], only without padding."""

    name = "add-conv"
    pattern = Op(
        "Conv",
        (
            Op("Add", (Any_("x"), Const("k")), name="pre", commutative=True),
            Any_("w"),
            Any_("b", optional=True),
        ),
        name="conv",
    )

    def check(self, graph: Graph, m: Match) -> str | None:
        a, w = m.root.attrs, m.value("w").const
        kernel = a.kernel_shape or (() if w is None else w.shape[2:])
        explicit = a.auto_pad == "NOTSET" and any(a.pads)
        if explicit or (a.auto_pad.startswith("SAME") and any(k != 1 for k in kernel)):
            return "conv pads with zeros"
        return super().check(graph, m)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        w = m.value("w").const
        assert w is not None
        group = int(m.root.attrs.group)
        shift = (_grouped(w, group) * self._vector(m).reshape(group, 1, -1, 1)).sum(axis=(2, 3)).reshape(-1)
        b = m.values.get("b")
        bias = shift if b is None or b.const is None else b.const.astype(np.float64) + shift
        rw.replace(rw.graph.value(m.root), _new_conv(rw, m, w.astype(np.float64), bias), take_name=True)


RULES: list[Rule] = [ConvBN(), GemmBN(), MatMulBN(), BNToAffine(), ConvMul(), ConvAdd(), MulConv(), AddConv()]


@register_pass
@dataclass(frozen=True)
class FoldBatchNorm(Pass):
    """Fold BatchNormalization and per-channel Mul/Add into Conv, ConvTranspose, Gemm and MatMul weights."""

    name = "fold-batchnorm"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return apply_rules(graph, RULES, near_misses=ctx.near_misses)
