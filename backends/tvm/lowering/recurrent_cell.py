"""One time step of RNN, GRU or LSTM as a TE PrimFunc (the recurrent half of the TVM lowering).

The input projection ``xw[t] = x_t Wᵀ + b`` of every step is one GEMM done before the loop
(:mod:`backends.tvm.lowering.recurrent`); a step then computes, for batch row ``b``,

    rec[b, g] = Σ_k h[b, k] · Rᵀ[k, g]        (the recurrent GEMM)
    pre[b, g] = xw[t_b, b, off + g] + rec[b, g]

and the gates of :mod:`compiler.ops.recurrent` from ``pre`` (GRU with ``linear_before_reset=0``
runs a second GEMM, ``(r ⊙ h) Rhᵀ``, once r is known). The step index arrives as an int32 tensor
``step`` [1], so one PrimFunc serves every step of a direction. With ``sequence_lens`` (``lens``)
row b is live while ``step < lens[b]``: the state outputs keep the old state on dead rows and
the extra output ``y`` is 0 there; a reverse direction then reads ``t_b = lens[b] - 1 - step``
(otherwise the caller passes the time index itself). The reductions and the elementwise gates
are ordinary TE stages: Kiln's generic CPU schedule and dlight's GPU rules schedule them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CellSpec", "step_func", "step_name", "TIR_ACTIVATIONS"]

Act = tuple[str, float, float]  # lower-case ONNX activation name, alpha, beta


def _fast_forms() -> tuple[Callable[[Any], Any], Callable[[Any], Any], Callable[[Any], Any]] | None:
    """The vectorizable float32 exp, tanh and sigmoid of the CPU kernels (None if unavailable)."""
    try:
        from backends.tvm.kernels.fast_math import fast_exp, fast_sigmoid, fast_tanh
    except ImportError:
        return None
    return fast_exp, fast_tanh, fast_sigmoid


def _tir_activations(dtype: str, fast: bool) -> dict[str, Callable[[Any, float, float], Any]]:
    """fn(x, alpha, beta) as TIR expressions of ``dtype``; ``fast``: exp, tanh and sigmoid in the
    CPU kernels' vectorizable float32 forms (LLVM calls libm once per lane for the intrinsics)."""
    from tvm import tirx

    forms = _fast_forms() if fast else None
    exp, tanh, sigmoid = forms if forms is not None else (tirx.exp, tirx.tanh, tirx.sigmoid)

    def c(x: Any, v: float) -> Any:
        return tirx.const(v, dtype)

    def softplus(x: Any, a: float, b: float) -> Any:  # max(x, 0) + log(1 + exp(-|x|)): no overflow
        return tirx.max(x, c(x, 0.0)) + tirx.log1p(exp(c(x, 0.0) - tirx.abs(x)))

    return {
        "relu": lambda x, a, b: tirx.max(x, c(x, 0.0)),
        "tanh": lambda x, a, b: tanh(x),
        "sigmoid": lambda x, a, b: sigmoid(x),
        "affine": lambda x, a, b: c(x, a) * x + c(x, b),
        "leakyrelu": lambda x, a, b: tirx.Select(x >= c(x, 0.0), x, c(x, a) * x),
        "thresholdedrelu": lambda x, a, b: tirx.Select(x > c(x, a), x, c(x, 0.0)),
        "scaledtanh": lambda x, a, b: c(x, a) * tanh(c(x, b) * x),
        "hardsigmoid": lambda x, a, b: tirx.min(tirx.max(c(x, a) * x + c(x, b), c(x, 0.0)), c(x, 1.0)),
        "elu": lambda x, a, b: tirx.Select(
            x >= c(x, 0.0), x, c(x, a) * (exp(tirx.min(x, c(x, 0.0))) - c(x, 1.0))
        ),
        "softsign": lambda x, a, b: x / (c(x, 1.0) + tirx.abs(x)),
        "softplus": softplus,
    }


TIR_ACTIVATIONS = frozenset(
    {
        "relu",
        "tanh",
        "sigmoid",
        "affine",
        "leakyrelu",
        "thresholdedrelu",
        "scaledtanh",
        "hardsigmoid",
        "elu",
        "softsign",
        "softplus",
    }
)
"""The activation names (lower case, as :data:`compiler.ops.recurrent.ACTIVATIONS`) a step lowers."""


@dataclass(frozen=True)
class CellSpec:
    """Everything one step kernel depends on (its name is a digest of it)."""

    op: str  # RNN | GRU | LSTM
    seq: int
    batch: int
    hidden: int
    xw_cols: int  # columns of the projected input (all directions)
    offset: int  # this direction's first column in xw
    acts: tuple[Act, ...]  # f[, g[, h]]
    clip: float | None
    dtype: str
    lens_reverse: bool = False  # sequence_lens and reverse: t_b = lens[b] - 1 - step
    has_lens: bool = False
    peepholes: bool = False  # LSTM P input
    input_forget: bool = False  # LSTM
    linear_before_reset: bool = False  # GRU: Rbh is a separate input
    fast_math: bool = False  # CPU float32: vectorizable exp/tanh/sigmoid

    @property
    def gates(self) -> int:
        """Weight blocks per direction."""
        return {"RNN": 1, "GRU": 3, "LSTM": 4}[self.op]

    @property
    def num_states(self) -> int:
        """State outputs: h (and c for LSTM)."""
        return 2 if self.op == "LSTM" else 1

    @property
    def num_outputs(self) -> int:
        """h[, c][, y] (y only with sequence_lens; otherwise it is h)."""
        return self.num_states + (1 if self.has_lens else 0)


def step_name(spec: CellSpec) -> str:
    """A deterministic function name unique per spec."""
    return f"kiln_{spec.op.lower()}_step_{hashlib.sha1(repr(spec).encode()).hexdigest()[:12]}"


def step_func(spec: CellSpec) -> Any:
    """The step PrimFunc. Parameters: xw [seq, B, cols], step [1] int32, h [1, B, H], (LSTM: c),
    Rᵀ [H, G·H], (LSTM peepholes: P [3H]; GRU linear_before_reset: Rbh [H]), (lens [B] int32),
    then the outputs h' [1, B, H], (LSTM: c'), (with lens: y [1, B, H])."""
    from tvm import te, tirx

    dt, nb, hid = spec.dtype, spec.batch, spec.hidden
    acts = _tir_activations(dt, spec.fast_math)
    state = (1, nb, hid)
    xw = te.placeholder((spec.seq, nb, spec.xw_cols), dt, "xw")
    step = te.placeholder((1,), "int32", "step")
    h = te.placeholder(state, dt, "h")
    c = te.placeholder(state, dt, "c") if spec.op == "LSTM" else None
    rt = te.placeholder((hid, spec.gates * hid), dt, "rt")
    extra = None
    if spec.op == "LSTM" and spec.peepholes:
        extra = te.placeholder((3 * hid,), dt, "p")
    if spec.op == "GRU" and spec.linear_before_reset:
        extra = te.placeholder((hid,), dt, "rbh")
    lens = te.placeholder((nb,), "int32", "lens") if spec.has_lens else None

    def zero() -> Any:
        return tirx.const(0.0, dt)

    def time_of(b: Any) -> Any:
        if spec.lens_reverse:
            assert lens is not None
            return tirx.max(lens[b] - tirx.const(1, "int32") - step[0], tirx.const(0, "int32"))
        return step[0]

    def live(b: Any) -> Any:
        assert lens is not None
        return step[0] < lens[b]

    def clip(x: Any) -> Any:
        if spec.clip is None:
            return x
        return tirx.min(tirx.max(x, tirx.const(-spec.clip, dt)), tirx.const(spec.clip, dt))

    def act(i: int, x: Any) -> Any:
        name, a, b = spec.acts[i]
        return acts[name](x, a, b)

    def gemm(src: Any, cols: int, first: int, name: str) -> Any:
        k = te.reduce_axis((0, hid), name=f"k_{name}")
        return te.compute((nb, cols), lambda b, g: te.sum(src[0, b, k] * rt[k, first + g], axis=k), name=name)

    def xw_at(b: Any, col: Any) -> Any:
        return xw[time_of(b), b, spec.offset + col]

    outs: list[Any]
    if spec.op == "RNN":
        rec = gemm(h, hid, 0, "rec")
        new_h = te.compute(state, lambda _, b, j: act(0, clip(xw_at(b, j) + rec[b, j])), name="h_new")
        outs = [new_h]
    elif spec.op == "GRU":
        outs = [_gru(spec, xw_at, h, rt, extra, gemm, clip, act)]
    else:
        assert c is not None
        outs = _lstm(spec, xw_at, h, c, extra, gemm, clip, act)
    states = [h] if c is None else [h, c]
    args = (
        [xw, step, *states, rt]
        + ([extra] if extra is not None else [])
        + ([lens] if lens is not None else [])
    )
    if lens is not None:
        news = outs

        def keep(new: Any, old: Any, name: str) -> Any:
            return te.compute(
                state, lambda _, b, j: tirx.Select(live(b), new[0, b, j], old[0, b, j]), name=name
            )

        outs = [keep(n, s, nm) for n, s, nm in zip(news, states, ("h_out", "c_out"), strict=False)]
        outs.append(
            te.compute(state, lambda _, b, j: tirx.Select(live(b), news[0][0, b, j], zero()), name="y")
        )
    func = te.create_prim_func([*args, *outs])
    return func.with_attrs({"op_pattern": 8, "tirx.noalias": True})  # opaque: FuseOps leaves it whole


def _bind(dtype: str, value: Any, body: Callable[[Any], Any]) -> Any:
    """``body(v)`` with ``v`` bound to ``value`` by one Let: a value read twice in an expression is
    bound once, since the fast activation forms hold Let nodes that must not be repeated (once the
    generic schedule inlines a gate stage into its consumer, each read would copy them)."""
    from tvm import tirx

    v = tirx.Var("v", dtype)
    return tirx.Let(v, value, body(v))


def _gru(spec: CellSpec, xw_at: Any, h: Any, rt: Any, rbh: Any, gemm: Any, clip: Any, act: Any) -> Any:
    """h' = (1 - z) ⊙ h~ + z ⊙ h with z, r = f(pre_z), f(pre_r) and h~ = g(...) (the two reset forms).

    z and r are one stage ``zr`` [B, 2H]: read by both the candidate and the blend it is never
    inlined, so the reset product ``r ⊙ h`` that feeds the second GEMM reads r from memory instead
    of recomputing f (and its Let-bound fast form) in every step of the reduction.
    """
    from tvm import te, tirx

    hid, dt = spec.hidden, spec.dtype
    one = tirx.const(1.0, dt)
    rec = gemm(h, (3 if spec.linear_before_reset else 2) * hid, 0, "rec")
    zr = te.compute((spec.batch, 2 * hid), lambda b, g: act(0, clip(xw_at(b, g) + rec[b, g])), name="zr")
    if spec.linear_before_reset:
        assert rbh is not None

        def cand(b: Any, j: Any) -> Any:
            return act(1, clip(xw_at(b, 2 * hid + j) + zr[b, hid + j] * (rec[b, 2 * hid + j] + rbh[j])))
    else:
        rh = te.compute((1, spec.batch, hid), lambda _, b, j: zr[b, hid + j] * h[0, b, j], name="rh")
        rec2 = gemm(rh, hid, 2 * hid, "rec_h")

        def cand(b: Any, j: Any) -> Any:
            return act(1, clip(xw_at(b, 2 * hid + j) + rec2[b, j]))

    hh = te.compute((spec.batch, hid), cand, name="h_cand")
    return te.compute(
        (1, spec.batch, hid),
        lambda _, b, j: _bind(dt, zr[b, j], lambda zv: (one - zv) * hh[b, j] + zv * h[0, b, j]),
        name="h_new",
    )


def _lstm(spec: CellSpec, xw_at: Any, h: Any, c: Any, p: Any, gemm: Any, clip: Any, act: Any) -> list[Any]:
    """C' = f ⊙ C + i ⊙ g(pre_c), H' = o ⊙ h(C') (gate blocks i, o, f, c; peepholes Pi, Po, Pf)."""
    from tvm import te, tirx

    hid, dt, nb = spec.hidden, spec.dtype, spec.batch
    one = tirx.const(1.0, dt)
    rec = gemm(h, 4 * hid, 0, "rec")

    def pre(b: Any, gate: int, j: Any) -> Any:
        return xw_at(b, gate * hid + j) + rec[b, gate * hid + j]

    def peep(x: Any, k: int, j: Any, state: Any) -> Any:
        return x if p is None else x + p[k * hid + j] * state

    def c_body(_: Any, b: Any, j: Any) -> Any:
        cv = c[0, b, j]

        def cell(i: Any) -> Any:
            f = one - i if spec.input_forget else act(0, clip(peep(pre(b, 2, j), 2, j, cv)))
            return f * cv + i * act(1, clip(pre(b, 3, j)))

        return _bind(dt, act(0, clip(peep(pre(b, 0, j), 0, j, cv))), cell)

    c_new = te.compute((1, nb, hid), c_body, name="c_new")

    def h_body(_: Any, b: Any, j: Any) -> Any:
        return _bind(dt, c_new[0, b, j], lambda cn: act(0, clip(peep(pre(b, 1, j), 1, j, cn))) * act(2, cn))

    h_new = te.compute((1, nb, hid), h_body, name="h_new")
    return [h_new, c_new]
