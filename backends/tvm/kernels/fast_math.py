"""Vectorizable float32 exp, erf, tanh and sigmoid as TIR expressions, and the Relax legalizations
that use them on CPU targets.

LLVM turns ``exp``/``erf``/``tanh`` of a vector into one libm call per lane (2-13 ns an element
measured on Zen 4); these forms use only arithmetic, compares and bit casts, so a vectorized loop
stays vectorized. Accuracy against float64, in float32 arithmetic:

* ``exp(x)``: ``x = n ln2 + r`` (Cody-Waite, |r| <= ln2/2), ``e^r - 1`` by its degree-7 Taylor
  polynomial (truncation 6e-9), ``2^n + 2^n (e^r - 1)`` with ``2^n`` from the exponent bits;
  within 1 ulp, unbiased.
  ``x`` is clamped to [-87.33, 88.7229] (``2^128`` is applied as ``2^127 * 2``, so the exponent
  field never overflows and large x give inf); below -87.33 the result is 0 (true values are
  under 1.2e-38); NaN stays NaN.
* ``erf(x)``: ``x * P(x^2)`` for |x| < 0.75 (max rel error 1.7e-7), else
  ``sign(x) (1 - exp(-x^2) Q(1 / (1 + x/2)))`` with x clamped to 4 (max abs error 1.1e-7).
  P (degree 5) and Q (degree 9) were fitted for Kiln by weighted least squares on Chebyshev nodes.
* ``tanh(x)``: ``x * P(x^2)`` (degree 5, fitted like erf's) for |x| < 0.625, else
  ``sign(x) (1 - 2 / (exp(2|x|) + 1))``; within 3e-7 relative.
* ``sigmoid(x) = 1 / (1 + exp(-x))``.

:func:`fast_legalize_map` maps Relax op names to the legalizations (float32 only; other dtypes take
Relax's own): elementwise ``exp``, ``erf``, ``tanh``, ``sigmoid`` and ``softmax`` /
``log_softmax`` (``exp(x - max)`` over the axis, then the sum; both row reductions in vector
partials plus a scalar tail), and ``power`` by a constant 1, 2, 3 or 4 (GPT-2's tanh GELU) as
products.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["fast_exp", "fast_erf", "fast_tanh", "fast_sigmoid", "fast_legalize_map"]

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 split so that n * _LN2_HI is exact for |n| <= 128
_LN2_LO = 1.4286068203094173e-06
_EXP_LO, _EXP_HI = -87.33, 88.7229  # above _EXP_HI the result overflows to inf
_EXP_TAYLOR = (1.0, 1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040)
_ERF_SMALL = 0.75
_ERF_P = (
    1.1283791663414513,
    -0.3761262289960295,
    0.11283423441811319,
    -0.02683666614166172,
    0.005118137357084385,
    -0.0006774773713484547,
)
_ERF_Q_P = 0.5  # t = 1 / (1 + x / 2)
_ERF_Q = (
    -3.518391286846637e-06,
    0.2820960453847317,
    0.28286957308075733,
    0.2375476614642122,
    0.2303025162351158,
    -0.10454692484897873,
    0.4108488974389477,
    -0.622643604950114,
    0.36078536601340716,
    -0.07727283101802447,
)
_ERF_CLAMP = 4.0  # erf(4) rounds to 1 in float32
_TANH_SMALL = 0.625
_TANH_P = (
    0.9999999981148279,
    -0.3333327466374983,
    0.13331355672276596,
    -0.053735289174985545,
    0.020628849418788946,
    -0.005696181513214398,
)


def _let(value: Any, body: Callable[[Any], Any]) -> Any:
    """``body(v)`` with ``v`` bound to ``value`` (a fresh ``Let``; variables and constants are used
    as they are). Every form below uses each bound value many times and each ``Let`` node once, so
    an inlined producer expression is neither copied into every use nor defined twice."""
    from tvm import tirx

    if isinstance(value, (tirx.Var, tirx.FloatImm)):
        return body(value)
    v = tirx.Var("v", "float32")  # every bound value here is float32
    return tirx.Let(v, value, body(v))


def _c(v: float) -> Any:
    from tvm import tirx

    return tirx.const(float(v), "float32")


def _horner(coefs: tuple[float, ...], u: Any) -> Any:
    acc = _c(coefs[-1])
    for c in coefs[-2::-1]:
        acc = acc * u + _c(c)
    return acc


def _keep_nan(x: Any, y: Any) -> Any:
    """``y``, or ``x`` where ``x`` is NaN (the clamps would turn NaN into a number). NaN is tested
    on the bits, ``bits(x) & 0x7fffffff > 0x7f800000``, not by ``isnan(x)``, which TVM 0.27's
    vectorizer cannot widen: it scalarizes the whole vector loop around it (LLVM re-vectorizes
    only simple ones; MixNet's concat -> BatchNorm -> SiLU -> split stayed scalar, 7x slower);
    ``x != x`` vectorizes too, but the simplifier folds it to false."""
    from tvm import tirx

    magnitude = tirx.reinterpret("int32", x) & tirx.const(0x7FFFFFFF, "int32")
    return tirx.Select(magnitude > tirx.const(0x7F800000, "int32"), x, y)


def _sign_of(x: Any) -> Any:
    from tvm import tirx

    return tirx.Select(x < _c(0.0), _c(-1.0), _c(1.0))


def fast_exp(x: Any) -> Any:
    """``exp(x)`` for a float32 expression (see the module docstring)."""
    from tvm import tirx

    def scaled(x: Any, n: Any, r: Any) -> Any:
        ni = tirx.min(tirx.Cast("int32", n), tirx.const(127, "int32"))  # n = 128: 2^127 * 2
        bits = tirx.shift_left(ni + tirx.const(127, "int32"), tirx.const(23, "int32"))
        # 2^n + 2^n (e^r - 1): the small term rounds on its own, so the sum is rounded once
        q = r * _horner(_EXP_TAYLOR[1:], r)

        def finish(y: Any) -> Any:
            y = tirx.Select(n > _c(127.5), y * _c(2.0), y)
            return _keep_nan(x, tirx.Select(x < _c(_EXP_LO), _c(0.0), y))

        return _let(tirx.reinterpret("float32", bits), lambda s: _let(s + s * q, finish))

    def reduce(x: Any) -> Any:
        xc = tirx.min(tirx.max(x, _c(_EXP_LO)), _c(_EXP_HI))
        return _let(
            tirx.floor(xc * _c(_LOG2E) + _c(0.5)),
            lambda n: _let(xc - n * _c(_LN2_HI) - n * _c(_LN2_LO), lambda r: scaled(x, n, r)),
        )

    return _let(x, reduce)


def fast_erf(x: Any) -> Any:
    """``erf(x)`` for a float32 expression (see the module docstring)."""
    from tvm import tirx

    def body(x: Any, a: Any) -> Any:
        small = x * _horner(_ERF_P, x * x)
        t = _c(1.0) / (_c(1.0) + a * _c(_ERF_Q_P))
        big = _sign_of(x) * (_c(1.0) - fast_exp(_c(0.0) - a * a) * _horner(_ERF_Q, t))
        return _keep_nan(x, tirx.Select(a < _c(_ERF_SMALL), small, big))

    return _let(x, lambda x: _let(tirx.min(tirx.abs(x), _c(_ERF_CLAMP)), lambda a: body(x, a)))


def fast_tanh(x: Any) -> Any:
    """``tanh(x)`` for a float32 expression (see the module docstring)."""
    from tvm import tirx

    def body(x: Any, a: Any) -> Any:
        small = x * _horner(_TANH_P, x * x)
        big = _sign_of(x) * (_c(1.0) - _c(2.0) / (fast_exp(a * _c(2.0)) + _c(1.0)))
        return _keep_nan(x, tirx.Select(a < _c(_TANH_SMALL), small, big))

    return _let(x, lambda x: _let(tirx.abs(x), lambda a: body(x, a)))


def fast_sigmoid(x: Any) -> Any:
    """``1 / (1 + exp(-x))`` for a float32 expression."""
    return _c(1.0) / (_c(1.0) + fast_exp(_c(0.0) - x))


def _elementwise(fn: Callable[[Any], Any], name: str) -> Callable[[Any], Any]:
    def te_fn(x: Any) -> Any:
        from tvm import te

        return te.compute(x.shape, lambda *i: fn(x(*i)), name=name)

    return te_fn


def _row_reduce(
    val: Callable[[tuple[Any, ...], Any], Any], shape: list[Any], n: int, lanes: int, op: str, name: str
) -> Any:
    """``reduce_k val(i, k)`` over ``k < n`` for every ``i`` in ``shape`` (``op``: "sum" or "max"),
    written so that it vectorizes: ``lanes`` partial results over the whole vectors
    (``rf[i, l] = reduce_q val(i, q*lanes + l)``), a scalar tail over the last ``n % lanes``
    elements, then the partials and the tail combined."""
    from tvm import te

    reduce = te.sum if op == "sum" else te.max
    full, tail = divmod(n, lanes)
    parts = []
    if full:
        q = te.reduce_axis((0, full), name=f"{name}_q")
        rf = te.compute(
            [*shape, lanes], lambda *il: reduce(val(il[:-1], q * lanes + il[-1]), axis=q), name=f"{name}_rf"
        )
        lane = te.reduce_axis((0, lanes), name=f"{name}_l")
        parts.append(te.compute(shape, lambda *i: reduce(rf(*i, lane), axis=lane), name=f"{name}_lanes"))
    if tail:
        t = te.reduce_axis((0, tail), name=f"{name}_t")
        parts.append(
            te.compute(shape, lambda *i: reduce(val(i, full * lanes + t), axis=t), name=f"{name}_tail")
        )
    if len(parts) == 1:
        return parts[0]
    a, b = parts
    return te.compute(
        shape, lambda *i: a(*i) + b(*i) if op == "sum" else te.max(a(*i), b(*i)), name=f"{name}_all"
    )


def _softmax_te(x: Any, axis: int, log: bool, lanes: int) -> Any:
    """``exp(x - max) / sum`` (``log``: ``x - max - log(sum)``) over ``axis`` of a float32 tensor."""
    from tvm import te

    axis %= len(x.shape)
    n = int(x.shape[axis])
    red_shape = [d for i, d in enumerate(x.shape) if i != axis]

    def at(idx: tuple[Any, ...], v: Any) -> tuple[Any, ...]:
        return (*idx[:axis], v, *idx[axis:])

    def drop(i: tuple[Any, ...]) -> tuple[Any, ...]:
        return (*i[:axis], *i[axis + 1 :])

    mx = _row_reduce(lambda i, k: x(*at(i, k)), red_shape, n, lanes, "max", "softmax_max")
    e = te.compute(x.shape, lambda *i: fast_exp(x(*i) - mx(*drop(i))), name="softmax_exp")
    s = _row_reduce(lambda i, k: e(*at(i, k)), red_shape, n, lanes, "sum", "softmax_sum")
    if log:
        return te.compute(x.shape, lambda *i: x(*i) - mx(*drop(i)) - te.log(s(*drop(i))), name="log_softmax")
    return te.compute(x.shape, lambda *i: e(*i) / s(*drop(i)), name="softmax")


_ELEMENTWISE: dict[str, tuple[Callable[[Any], Any], str]] = {
    "relax.exp": (fast_exp, "exp"),
    "relax.erf": (fast_erf, "erf"),
    "relax.tanh": (fast_tanh, "tanh"),
    "relax.sigmoid": (fast_sigmoid, "sigmoid"),
}


def _is_f32(call: Any) -> bool:
    return str(getattr(call.args[0].ty, "dtype", "")) == "float32"


def _default(op: str, bb: Any, call: Any) -> Any:
    import tvm

    return tvm.ir.Op.get(op).get_attr("FLegalize")(bb, call)


def _legalize_elementwise(op: str) -> Callable[[Any, Any], Any]:
    fn, name = _ELEMENTWISE[op]

    def legalize(bb: Any, call: Any) -> Any:
        if not _is_f32(call):
            return _default(op, bb, call)
        return bb.call_te(_elementwise(fn, name), call.args[0], primfunc_name_hint=name)

    return legalize


def _legalize_softmax(op: str, log: bool, lanes: int) -> Callable[[Any, Any], Any]:
    def legalize(bb: Any, call: Any) -> Any:
        if not _is_f32(call):
            return _default(op, bb, call)
        name = "log_softmax" if log else "softmax"
        axis = int(call.attrs.axis)
        return bb.call_te(_softmax_te, call.args[0], axis, log, lanes, primfunc_name_hint=name)

    return legalize


_POWERS: dict[float, Callable[[Any], Any]] = {
    1.0: lambda v: v,
    2.0: lambda v: v * v,
    3.0: lambda v: v * v * v,
    4.0: lambda v: (v * v) * (v * v),
}


def _legalize_power(bb: Any, call: Any) -> Any:
    """``x ** c`` for a constant scalar c in :data:`_POWERS` as products (LLVM calls ``powf`` per lane)."""
    import numpy as np
    import tvm
    from tvm import te

    c = call.args[1]
    value: Any = getattr(c, "value", None) if isinstance(c, tvm.ir.expr.Constant) else None
    exponent = np.asarray(value.numpy()).reshape(-1) if hasattr(value, "numpy") else np.zeros(0)
    if not (_is_f32(call) and exponent.size == 1):
        return _default("relax.power", bb, call)
    fn = _POWERS.get(float(exponent[0]))
    if fn is None:
        return _default("relax.power", bb, call)

    def te_fn(x: Any) -> Any:
        return te.compute(x.shape, lambda *i: fn(x(*i)), name="T_power")

    return bb.call_te(te_fn, call.args[0], primfunc_name_hint="power")


def fast_legalize_map(lanes: int) -> dict[str, Callable[[Any, Any], Any]]:
    """The legalizations for ``relax.transform.LegalizeOps(customize_legalize_map=...)`` on a CPU
    target with ``lanes``-wide fp32 vectors (softmax's row reductions are split by ``lanes``)."""
    return {
        **{op: _legalize_elementwise(op) for op in _ELEMENTWISE},
        "relax.nn.softmax": _legalize_softmax("relax.nn.softmax", False, lanes),
        "relax.nn.log_softmax": _legalize_softmax("relax.nn.log_softmax", True, lanes),
        "relax.power": _legalize_power,
    }
