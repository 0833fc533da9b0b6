"""Recurrent ops: one layer of RNN, GRU or LSTM, forward, reverse or bidirectional.

With x_t the input at step t, H the previous hidden state, C the previous cell state,
W/R/Wb/Rb the gate blocks of W, R and B, ⊙ the elementwise product, and every gate
pre-activation clipped to [-clip, clip] when ``clip`` is set:

* RNN (gate i):       H' = f(x_t Wiᵀ + H Riᵀ + Wbi + Rbi)
* GRU (gates z, r, h): z = f(x_t Wzᵀ + H Rzᵀ + Wbz + Rbz), r likewise,
  h = g(x_t Whᵀ + (r ⊙ H) Rhᵀ + Rbh + Wbh), or with ``linear_before_reset``
  h = g(x_t Whᵀ + r ⊙ (H Rhᵀ + Rbh) + Wbh); H' = (1 - z) ⊙ h + z ⊙ H
* LSTM (gates i, o, f, c; peepholes P = [Pi, Po, Pf]):
  i = f(x_t Wiᵀ + H Riᵀ + Pi ⊙ C + Wbi + Rbi), f likewise (or 1 - i with
  ``input_forget``), c = g(x_t Wcᵀ + H Rcᵀ + Wbc + Rbc), C' = f ⊙ C + i ⊙ c,
  o = f(x_t Woᵀ + H Roᵀ + Po ⊙ C' + Wbo + Rbo), H' = o ⊙ h(C')

As onnxruntime, ``clip`` bounds the gate pre-activations only: h(C') sees C' unclipped.
X is [seq, batch, input] ([batch, seq, input] with ``layout=1``); Y is
[seq, num_directions, batch, hidden] ([batch, seq, num_directions, hidden]); Y_h, Y_c
and the initial states are [num_directions, batch, hidden] ([batch, num_directions,
hidden]). Direction 0 is forward, 1 reverse. ``sequence_lens`` gives each batch row's
length L: the reverse direction runs from step L-1 down to 0, Y is 0 at steps >= L, and
Y_h/Y_c are the states after the row's last valid step (0 when L = 0, as onnxruntime).

``activations`` lists one function per gate function (f[, g[, h]]) and direction; a list
for one direction serves both. ``activation_alpha``/``activation_beta`` are consumed in
list order by the functions that take them (Affine, LeakyRelu, ThresholdedRelu,
ScaledTanh, HardSigmoid, Elu), missing ones defaulting to the ONNX operator's default
(see :data:`ACTIVATIONS` for where onnxruntime differs).
Names are case-insensitive, as in onnxruntime. References compute in float32 (float64
for float64 inputs), as onnxruntime does, and cast to X's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Dim, DType, TensorType
from compiler.ops.inputs import arg, first
from compiler.ops.registry import InferContext, OpDef, QuantPolicy, QuantSpec, register
from compiler.ops.shapes import merge_dim

__all__ = ["RNNAttrs", "GRUAttrs", "LSTMAttrs", "ACTIVATIONS", "resolve_activations"]

Activation = Callable[[np.ndarray, float, float], np.ndarray]


def _sigmoid(x: np.ndarray, a: float, b: float) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(1 / (1 + np.exp(-x)), dtype=x.dtype)


def _typed(fn: Callable[[np.ndarray, float, float], np.ndarray]) -> Activation:
    def act(x: np.ndarray, a: float, b: float) -> np.ndarray:
        return np.asarray(fn(x, x.dtype.type(a), x.dtype.type(b)), dtype=x.dtype)

    return act


ACTIVATIONS: dict[str, tuple[Activation, float | None, float | None]] = {
    # lower-case name: (fn(x, alpha, beta), default alpha, default beta); None = not used
    "relu": (_typed(lambda x, a, b: np.maximum(x, 0)), None, None),
    "tanh": (_typed(lambda x, a, b: np.tanh(x)), None, None),
    "sigmoid": (_sigmoid, None, None),
    "affine": (_typed(lambda x, a, b: a * x + b), 1.0, 0.0),
    "leakyrelu": (_typed(lambda x, a, b: np.where(x >= 0, x, a * x)), 0.01, None),
    "thresholdedrelu": (_typed(lambda x, a, b: np.where(x > a, x, 0)), 1.0, None),
    "scaledtanh": (_typed(lambda x, a, b: a * np.tanh(b * x)), 1.0, 1.0),
    "hardsigmoid": (_typed(lambda x, a, b: np.clip(a * x + b, 0, 1)), 0.2, 0.5),
    "elu": (_typed(lambda x, a, b: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0)))), 1.0, None),
    "softsign": (_typed(lambda x, a, b: x / (1 + np.abs(x))), None, None),
    "softplus": (_typed(lambda x, a, b: np.logaddexp(0, x)), None, None),
}
"""The activation functions ONNX's recurrent ops name, with the ONNX operators' alpha/beta defaults.

onnxruntime differs where alpha/beta are left out for ThresholdedRelu, Affine and
ScaledTanh: it uses 0 for them (so ThresholdedRelu there is Relu, Affine gives 0).
"""

_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


@dataclass(frozen=True)
class RNNAttrs:
    """RNN attributes (ONNX defaults); ``hidden_size`` is required, ``clip`` None = no clip."""

    activation_alpha: tuple[float, ...] = ()
    activation_beta: tuple[float, ...] = ()
    activations: tuple[str, ...] = ("Tanh", "Tanh")
    clip: float | None = None
    direction: str = "forward"
    hidden_size: int = 0
    layout: int = 0


@dataclass(frozen=True)
class GRUAttrs(RNNAttrs):
    """GRU attributes: RNN's plus ``linear_before_reset``."""

    activations: tuple[str, ...] = ("Sigmoid", "Tanh")
    linear_before_reset: int = 0


@dataclass(frozen=True)
class LSTMAttrs(RNNAttrs):
    """LSTM attributes: RNN's plus ``input_forget`` (couple the forget gate to 1 - i)."""

    activations: tuple[str, ...] = ("Sigmoid", "Tanh", "Tanh")
    input_forget: int = 0


@dataclass(frozen=True)
class _Kind:
    gates: int  # weight blocks per direction (1, 3, 4)
    functions: int  # activation functions per direction (1, 2, 3)
    states: int  # state outputs (Y_h[, Y_c])


_KINDS = {"RNN": _Kind(1, 1, 1), "GRU": _Kind(3, 2, 1), "LSTM": _Kind(4, 3, 2)}

ResolvedActivation = tuple[Activation, float, float]
_Pair = tuple[np.ndarray, np.ndarray]


def resolve_activations(op: str, attrs: RNNAttrs) -> list[list[ResolvedActivation]]:
    """Per direction, the (fn, alpha, beta) of each gate function; raises ValueError if invalid."""
    kind = _KINDS[op]
    nd = _DIRECTIONS.get(attrs.direction)
    if nd is None:
        raise ValueError(f"direction must be forward, reverse or bidirectional, got {attrs.direction!r}")
    names = [n.lower() for n in attrs.activations]
    unknown = sorted({n for n in names if n not in ACTIVATIONS})
    if unknown:
        raise ValueError(f"unknown activation(s) {', '.join(unknown)}; known: {', '.join(ACTIVATIONS)}")
    alphas, betas = iter(attrs.activation_alpha), iter(attrs.activation_beta)
    resolved: list[ResolvedActivation] = []
    for n in names:
        fn, da, db = ACTIVATIONS[n]
        a = 0.0 if da is None else float(next(alphas, da))
        b = 0.0 if db is None else float(next(betas, db))
        resolved.append((fn, a, b))
    k = kind.functions
    if len(resolved) == k:  # one list serves every direction
        return [resolved] * nd
    if len(resolved) == k * nd or (nd == 1 and len(resolved) == 2 * k):  # RNN's default is [Tanh, Tanh]
        return [resolved[d * k : (d + 1) * k] for d in range(nd)]
    raise ValueError(f"{len(names)} activations for {nd} direction(s) of {k} function(s) each")


# -------------------------------------------------------------------- inference
def _infer(op: str) -> Callable[[InferContext], list[TensorType]]:
    kind = _KINDS[op]

    def infer(ctx: InferContext) -> list[TensorType]:
        a: RNNAttrs = ctx.attrs
        try:
            acts = resolve_activations(op, a)
        except ValueError as exc:
            raise ctx.fail(str(exc)) from None
        nd, hidden = len(acts), a.hidden_size
        if hidden < 1:
            raise ctx.fail(f"hidden_size must be >= 1, got {hidden}")
        if a.layout not in (0, 1):
            raise ctx.fail(f"layout must be 0 or 1, got {a.layout}")
        if a.clip is not None and a.clip <= 0:
            raise ctx.fail(f"clip must be > 0, got {a.clip}")
        t = ctx.type(0)
        if not t.dtype.is_float:
            raise ctx.fail(f"X must be float, got {t.dtype.short}")
        x = _rank(ctx, 0, 3, "X")
        seq, batch = (x[1], x[0]) if a.layout else (x[0], x[1])
        gh = kind.gates * hidden
        want: dict[int, tuple[str, tuple[Dim | None, ...]]] = {
            1: ("W", (nd, gh, x[2])),
            2: ("R", (nd, gh, hidden)),
            3: ("B", (nd, 2 * gh)),
            4: ("sequence_lens", (batch,)),
        }
        state = (batch, nd, hidden) if a.layout else (nd, batch, hidden)
        want[5] = ("initial_h", state)
        if op == "LSTM":
            want[6] = ("initial_c", state)
            want[7] = ("P", (nd, 3 * hidden))
        for i, (name, dims) in want.items():
            if i >= 3 and not ctx.has(i):
                continue
            s = _rank(ctx, i, len(dims), name)
            dtype = ctx.type(i).dtype
            if dtype != (DType.INT32 if i == 4 else t.dtype):
                raise ctx.fail(f"{name} must be {'i32' if i == 4 else t.dtype.short}, got {dtype.short}")
            for k, (have, need) in enumerate(zip(s, dims, strict=True)):
                if need is not None and merge_dim(have, need) is None:
                    raise ctx.fail(f"{name} has shape {s}, expected dim {k} = {need}")
        y = (batch, seq, nd, hidden) if a.layout else (seq, nd, batch, hidden)
        outs = [TensorType(t.dtype, y)] + [TensorType(t.dtype, state)] * kind.states
        return outs[: ctx.num_outputs]

    return infer


def _rank(ctx: InferContext, i: int, rank: int, name: str) -> tuple[Dim, ...]:
    s = ctx.shape(i)
    if len(s) != rank:
        raise ctx.fail(f"{name} must have rank {rank}, got shape {s}")
    return s


# -------------------------------------------------------------------- reference
Cell = Callable[[np.ndarray, np.ndarray, np.ndarray, list[ResolvedActivation]], tuple[np.ndarray, np.ndarray]]


def _clip(x: np.ndarray, clip: float | None) -> np.ndarray:
    return x if clip is None else np.clip(x, -clip, clip)


def _cell(op: str, a: RNNAttrs, r: np.ndarray, rb: np.ndarray, p: np.ndarray | None) -> Cell:
    """The step function (xw, H, C) -> (H', C') of one direction; xw = x_t Wᵀ + Wb."""
    hid = a.hidden_size

    def rnn(xw: np.ndarray, h: np.ndarray, c: np.ndarray, acts: list[ResolvedActivation]) -> _Pair:
        ((f, fa, fb),) = acts
        return f(_clip(xw + h @ r.T + rb, a.clip), fa, fb), c

    def gru(xw: np.ndarray, h: np.ndarray, c: np.ndarray, acts: list[ResolvedActivation]) -> _Pair:
        (f, fa, fb), (g, ga, gb) = acts
        hr = h @ r[: 2 * hid].T + rb[: 2 * hid]
        z = f(_clip(xw[:, :hid] + hr[:, :hid], a.clip), fa, fb)
        rr = f(_clip(xw[:, hid : 2 * hid] + hr[:, hid:], a.clip), fa, fb)
        rh, rbh = r[2 * hid :], rb[2 * hid :]
        lin = rr * (h @ rh.T + rbh) if getattr(a, "linear_before_reset", 0) else (rr * h) @ rh.T + rbh
        hh = g(_clip(xw[:, 2 * hid :] + lin, a.clip), ga, gb)
        return (1 - z) * hh + z * h, c

    def lstm(xw: np.ndarray, h: np.ndarray, c: np.ndarray, acts: list[ResolvedActivation]) -> _Pair:
        (f, fa, fb), (g, ga, gb), (hf, ha, hb) = acts
        pre = xw + h @ r.T + rb
        gi, go, gf, gc = (pre[:, k * hid : (k + 1) * hid] for k in range(4))
        pi, po, pf = (0, 0, 0) if p is None else (p[:hid], p[hid : 2 * hid], p[2 * hid :])
        i = f(_clip(gi + pi * c, a.clip), fa, fb)
        forget = 1 - i if getattr(a, "input_forget", 0) else f(_clip(gf + pf * c, a.clip), fa, fb)
        c_new = forget * c + i * g(_clip(gc, a.clip), ga, gb)
        o = f(_clip(go + po * c_new, a.clip), fa, fb)
        return o * hf(c_new, ha, hb), c_new

    return {"RNN": rnn, "GRU": gru, "LSTM": lstm}[op]


def _direction(
    cell: Cell,
    xw: np.ndarray,
    h: np.ndarray,
    c: np.ndarray,
    lens: np.ndarray,
    reverse: bool,
    acts: list[ResolvedActivation],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run one direction over xw [seq, batch, gates*hidden]: Y [seq, batch, hidden], H, C."""
    seq, batch = xw.shape[:2]
    rows = np.arange(batch)
    y = np.zeros((seq, batch, h.shape[-1]), dtype=h.dtype)
    for s in range(int(lens.max(initial=0))):
        live = s < lens
        t = np.where(live, lens - 1 - s, 0) if reverse else np.full(batch, s)
        h_new, c_new = cell(xw[t, rows], h, c, acts)
        h = np.where(live[:, None], h_new, h)
        c = np.where(live[:, None], c_new, c)
        y[t[live], rows[live]] = h_new[live]
    empty = (lens == 0)[:, None]
    return y, np.where(empty, 0, h), np.where(empty, 0, c)


def _reference(op: str) -> Callable[[list[np.ndarray | None], RNNAttrs, int], list[np.ndarray]]:
    kind = _KINDS[op]

    def ref(ins: list[np.ndarray | None], a: RNNAttrs, n: int) -> list[np.ndarray]:
        x = first(ins)
        ct = np.float64 if x.dtype == np.float64 else np.float32

        def opt(i: int) -> np.ndarray | None:
            v = arg(ins, i)
            return None if v is None else np.asarray(v).astype(ct)

        acts = resolve_activations(op, a)
        nd, hid, gh = len(acts), a.hidden_size, kind.gates * a.hidden_size
        xs = x.astype(ct).transpose(1, 0, 2) if a.layout else x.astype(ct)
        seq, batch = xs.shape[:2]
        w, r = np.asarray(ins[1]).astype(ct), np.asarray(ins[2]).astype(ct)
        b = opt(3)
        b = np.zeros((nd, 2 * gh), ct) if b is None else b
        lens_in = arg(ins, 4)
        lens = np.full(batch, seq, np.int64) if lens_in is None else np.asarray(lens_in).astype(np.int64)
        if lens.min(initial=0) < 0 or lens.max(initial=0) > seq:
            raise ValueError(f"sequence_lens {lens.tolist()} outside [0, {seq}]")
        given = [opt(5), opt(6) if op == "LSTM" else None]
        states = [
            np.zeros((nd, batch, hid), ct) if s is None else s.transpose(1, 0, 2) if a.layout else s
            for s in given
        ]
        p = opt(7) if op == "LSTM" else None
        ys, hs, cs = [], [], []
        for d in range(nd):
            cell = _cell(op, a, r[d], b[d, gh:], None if p is None else p[d])
            xw = xs @ w[d].T + b[d, :gh]
            reverse = a.direction == "reverse" or d == 1
            y, h, c = _direction(cell, xw, states[0][d], states[1][d], lens, reverse, acts[d])
            ys.append(y)
            hs.append(h)
            cs.append(c)
        y_all = np.stack(ys, 1)  # [seq, nd, batch, hidden]
        y_h, y_c = np.stack(hs), np.stack(cs)
        if a.layout:
            y_all, y_h, y_c = y_all.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2), y_c.transpose(1, 0, 2)
        outs = [y_all, y_h, y_c][: 1 + kind.states]
        return [o.astype(x.dtype) for o in outs[:n]]

    return ref


_DOCS = {
    "RNN": "H' = f(x Wᵀ + H Rᵀ + Wb + Rb) over the sequence; outputs Y, Y_h",
    "GRU": "z, r = f(...), h = g(x Whᵀ + (r ⊙ H) Rhᵀ + b), H' = (1-z) ⊙ h + z ⊙ H; outputs Y, Y_h",
    "LSTM": "i, o, f = f(...) (peepholes), C' = f ⊙ C + i ⊙ g(...), H' = o ⊙ h(C'); outputs Y, Y_h, Y_c",
}

# int8: W [dirs, gates*hidden, input] and R [dirs, gates*hidden, hidden] per gate row (axis 1; one
# scale per row, shared by a bidirectional layer's two directions), X (port 0) on its calibrated grid
# only in the int8-input form; the state, and so every output, stays float. The form is chosen per
# node by measurement (compiler/ops/quant_rules.py, QUANT_FORMS).
_RNN_QSPEC = QuantSpec(weight_axis=lambda attrs, rank: 1, bias=None, weights=(2,), float_output=True)

for _op, _attrs, _max_in in (("RNN", RNNAttrs, 6), ("GRU", GRUAttrs, 6), ("LSTM", LSTMAttrs, 8)):
    register(
        OpDef(
            _op,
            _infer(_op),
            _reference(_op),
            _attrs,
            inputs=(3, _max_in),
            outputs=(0, 1 + _KINDS[_op].states),
            quant=QuantPolicy.WEIGHTED,
            qspec=_RNN_QSPEC,
            doc=_DOCS[_op],
        )
    )
