"""Elementwise ops: broadcasting binary arithmetic and unary math/activations.

Each op is one table row: name, numpy function, and its attrs dataclass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.types import TensorType
from compiler.ops.registry import (
    InferContext,
    Layout,
    NoAttrs,
    OpDef,
    QuantPolicy,
    QuantSpec,
    ReferenceFn,
    register,
    same_as_input,
)
from compiler.ops.shapes import broadcast

__all__ = [
    "LeakyReluAttrs",
    "HardSigmoidAttrs",
    "EluAttrs",
    "GeluAttrs",
    "CeluAttrs",
    "ShrinkAttrs",
    "SeluAttrs",
    "ThresholdedReluAttrs",
    "ModAttrs",
    "BINARY_OPS",
    "UNARY_OPS",
]


def _broadcast_infer(same_dtype: bool) -> Callable[[InferContext], list[TensorType]]:
    """Inference of y = f(a, b) with numpy broadcasting; y has a's dtype."""

    def infer(ctx: InferContext) -> list[TensorType]:
        ta, tb = ctx.type(0), ctx.type(1)
        if same_dtype and ta.dtype != tb.dtype:
            raise ctx.fail(f"input dtypes differ: {ta.dtype.short} vs {tb.dtype.short}")
        if ta.shape is None or tb.shape is None:
            return [TensorType(ta.dtype, None)]
        try:
            return [TensorType(ta.dtype, broadcast([ta.shape, tb.shape], ctx.where))]
        except ValueError as exc:
            raise ctx.fail(str(exc)) from None

    return infer


_infer_broadcast = _broadcast_infer(same_dtype=True)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(np.true_divide(a, b)).astype(a.dtype)
    return np.divide(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.power(a.astype(np.float64), b).astype(a.dtype)
    return np.power(a, b.astype(a.dtype)).astype(a.dtype)


def _present(ins: list[np.ndarray | None], n: int) -> list[np.ndarray]:
    """The first ``n`` inputs, which must be present."""
    out = [x for x in ins[:n] if x is not None]
    if len(out) != n:
        raise ValueError(f"expected {n} inputs")
    return out


def _binary_ref(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> ReferenceFn:
    def ref(ins: list[np.ndarray | None], attrs: Any, n: int) -> list[np.ndarray]:
        a, b = _present(ins, 2)
        return [np.asarray(fn(a, b)).astype(a.dtype)]

    return ref


def _unary_ref(fn: Callable[[np.ndarray, Any], np.ndarray]) -> ReferenceFn:
    def ref(ins: list[np.ndarray | None], attrs: Any, n: int) -> list[np.ndarray]:
        (x,) = _present(ins, 1)
        return [np.asarray(fn(x, attrs)).astype(x.dtype)]

    return ref


def _prelu_ref(ins: list[np.ndarray | None], attrs: Any, n: int) -> list[np.ndarray]:
    x, slope = _present(ins, 2)
    return [np.where(x >= 0, x, x * slope).astype(x.dtype)]


BINARY_OPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": _int_div,
}

for _name, _fn in BINARY_OPS.items():
    register(
        OpDef(
            _name,
            _infer_broadcast,
            _binary_ref(_fn),
            inputs=(2, 2),
            layout=Layout.AGNOSTIC,
            quant=QuantPolicy.ACTIVATION if _name in ("Add", "Mul") else QuantPolicy.NONE,
            doc=f"y = a {dict(Add='+', Sub='-', Mul='*', Div='/')[_name]} b (numpy broadcasting)",
        )
    )


register(
    OpDef(
        "Pow",
        _broadcast_infer(same_dtype=False),
        lambda ins, a, n: [_pow(*_present(ins, 2))],
        inputs=(2, 2),
        layout=Layout.AGNOSTIC,
        doc="y = a ** b (numpy broadcasting; exponent may have another dtype)",
    )
)


@dataclass(frozen=True)
class ModAttrs:
    """Mod: ``fmod=0`` takes the divisor's sign (Python ``%``), ``fmod=1`` the dividend's (C ``fmod``)."""

    fmod: int = 0


def _mod_ref(ins: list[np.ndarray | None], a: ModAttrs, n: int) -> list[np.ndarray]:
    x, y = _present(ins, 2)
    if a.fmod not in (0, 1):
        raise ValueError(f"Mod fmod={a.fmod} is neither 0 nor 1")
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.fmod(x, y) if a.fmod else np.mod(x, y)
    return [np.asarray(out).astype(x.dtype)]


register(
    OpDef(
        "Mod",
        _infer_broadcast,
        _mod_ref,
        ModAttrs,
        inputs=(2, 2),
        layout=Layout.AGNOSTIC,
        doc="y = a mod b: fmod=0 has the sign of b (a - floor(a/b)*b), fmod=1 the sign of a (C fmod)",
    )
)


@dataclass(frozen=True)
class LeakyReluAttrs:
    """LeakyRelu: y = x if x >= 0 else alpha * x."""

    alpha: float = 0.01


@dataclass(frozen=True)
class HardSigmoidAttrs:
    """HardSigmoid: y = clip(alpha * x + beta, 0, 1)."""

    alpha: float = 0.2
    beta: float = 0.5


@dataclass(frozen=True)
class EluAttrs:
    """Elu: y = x if x > 0 else alpha * (exp(x) - 1)."""

    alpha: float = 1.0


@dataclass(frozen=True)
class GeluAttrs:
    """Gelu (opset 20): ``approximate`` is ``none`` (erf form) or ``tanh``."""

    approximate: str = "none"


@dataclass(frozen=True)
class ShrinkAttrs:
    """Shrink: y = x - bias if x > lambd, x + bias if x < -lambd, else 0."""

    bias: float = 0.0
    lambd: float = 0.5


def _shrink(x: np.ndarray, a: ShrinkAttrs) -> np.ndarray:
    xf = x.astype(np.float64)
    return np.where(xf > a.lambd, xf - a.bias, np.where(xf < -a.lambd, xf + a.bias, 0.0))


@dataclass(frozen=True)
class CeluAttrs:
    """Celu: y = max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""

    alpha: float = 1.0


@dataclass(frozen=True)
class SeluAttrs:
    """Selu: y = gamma * x if x > 0 else gamma * alpha * (exp(x) - 1) (ONNX's float32 constants)."""

    alpha: float = 1.67326319217681884765625
    gamma: float = 1.05070102214813232421875


@dataclass(frozen=True)
class ThresholdedReluAttrs:
    """ThresholdedRelu: y = x if x > alpha else 0."""

    alpha: float = 1.0


def _celu(x: np.ndarray, a: CeluAttrs) -> np.ndarray:
    xf, alpha = x.astype(np.float64), float(np.float32(a.alpha))
    return np.maximum(xf, 0) + np.minimum(0, alpha * np.expm1(xf / alpha))


def _selu(x: np.ndarray, a: SeluAttrs) -> np.ndarray:
    xf, alpha, gamma = x.astype(np.float64), float(np.float32(a.alpha)), float(np.float32(a.gamma))
    return np.where(xf > 0, gamma * xf, gamma * alpha * np.expm1(xf))


def _mish(x: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float64)
    return xf * np.tanh(np.logaddexp(0.0, xf))


def _gelu(x: np.ndarray, a: GeluAttrs) -> np.ndarray:
    if a.approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu approximate={a.approximate!r} is neither 'none' nor 'tanh'")
    xf = x.astype(np.float64)
    if a.approximate == "tanh":
        return 0.5 * xf * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (xf + 0.044715 * xf**3)))
    return 0.5 * xf * (1.0 + _erf(xf / np.sqrt(2.0)))


def _f(x: np.ndarray, v: float) -> Any:
    return np.asarray(v, dtype=x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


def _hard_sigmoid(x: np.ndarray, a: HardSigmoidAttrs) -> np.ndarray:
    return np.clip(x * _f(x, a.alpha) + _f(x, a.beta), 0, 1).astype(x.dtype)


UNARY_OPS: dict[str, tuple[Callable[[np.ndarray, Any], np.ndarray], type | None, str]] = {
    "Relu": (lambda x, a: np.maximum(x, _f(x, 0)), None, "y = max(x, 0)"),
    "LeakyRelu": (
        lambda x, a: np.where(x >= 0, x, x * _f(x, a.alpha)).astype(x.dtype),
        LeakyReluAttrs,
        "y = x if x >= 0 else alpha*x",
    ),
    "Elu": (
        lambda x, a: np.where(x > 0, x, _f(x, a.alpha) * np.expm1(x)).astype(x.dtype),
        EluAttrs,
        "y = x if x > 0 else alpha*(exp(x)-1)",
    ),
    "Sigmoid": (lambda x, a: _sigmoid(x), None, "y = 1 / (1 + exp(-x))"),
    "HardSigmoid": (_hard_sigmoid, HardSigmoidAttrs, "y = clip(alpha*x + beta, 0, 1)"),
    "HardSwish": (
        lambda x, a: (x * np.clip(x * _f(x, 1.0 / 6.0) + _f(x, 0.5), 0, 1)).astype(x.dtype),
        None,
        "y = x * clip(alpha*x + 1/2, 0, 1), alpha = 1/6 rounded to x's dtype (ONNX/ORT form, no FMA)",
    ),
    "Tanh": (lambda x, a: np.tanh(x), None, "y = tanh(x)"),
    "Exp": (lambda x, a: np.exp(x), None, "y = exp(x)"),
    "Log": (lambda x, a: np.log(x), None, "y = log(x)"),
    "Sqrt": (lambda x, a: np.sqrt(x), None, "y = sqrt(x)"),
    "Neg": (lambda x, a: np.negative(x), None, "y = -x"),
    "Abs": (lambda x, a: np.abs(x), None, "y = |x|"),
    "Reciprocal": (lambda x, a: np.reciprocal(x), None, "y = 1/x"),
    "Floor": (lambda x, a: np.floor(x), None, "y = floor(x)"),
    "Ceil": (lambda x, a: np.ceil(x), None, "y = ceil(x)"),
    "Softplus": (lambda x, a: np.logaddexp(_f(x, 0), x).astype(x.dtype), None, "y = log(1 + exp(x))"),
    "Erf": (lambda x, a: _erf(x), None, "y = erf(x)"),
    "Sign": (lambda x, a: np.sign(x), None, "y = -1 if x < 0, 0 if x == 0, 1 if x > 0"),
    "Round": (lambda x, a: np.rint(x), None, "y = round(x), halves to even"),
    "Sin": (lambda x, a: np.sin(x), None, "y = sin(x)"),
    "Cos": (lambda x, a: np.cos(x), None, "y = cos(x)"),
    "Tan": (lambda x, a: np.tan(x), None, "y = tan(x)"),
    "Asin": (lambda x, a: np.arcsin(x), None, "y = asin(x)"),
    "Acos": (lambda x, a: np.arccos(x), None, "y = acos(x)"),
    "Atan": (lambda x, a: np.arctan(x), None, "y = atan(x)"),
    "Sinh": (lambda x, a: np.sinh(x), None, "y = sinh(x)"),
    "Cosh": (lambda x, a: np.cosh(x), None, "y = cosh(x)"),
    "Asinh": (lambda x, a: np.arcsinh(x), None, "y = asinh(x)"),
    "Acosh": (lambda x, a: np.arccosh(x), None, "y = acosh(x)"),
    "Atanh": (lambda x, a: np.arctanh(x), None, "y = atanh(x)"),
    "Shrink": (_shrink, ShrinkAttrs, "y = x - bias if x > lambd, x + bias if x < -lambd, else 0"),
    "Celu": (_celu, CeluAttrs, "y = max(0, x) + min(0, alpha*(exp(x/alpha)-1))"),
    "Selu": (_selu, SeluAttrs, "y = gamma*x if x > 0 else gamma*alpha*(exp(x)-1)"),
    "Mish": (lambda x, a: _mish(x), None, "y = x * tanh(log(1 + exp(x)))"),
    "ThresholdedRelu": (
        lambda x, a: np.where(x > _f(x, a.alpha), x, _f(x, 0)),
        ThresholdedReluAttrs,
        "y = x if x > alpha else 0",
    ),
    "Softsign": (
        lambda x, a: x.astype(np.float64) / (1.0 + np.abs(x.astype(np.float64))),
        None,
        "y = x/(1+|x|)",
    ),
    "Gelu": (
        _gelu,
        GeluAttrs,
        "y = x/2 * (1 + erf(x/sqrt(2))); tanh: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))",
    ),
}

_QUANT_UNARY = {"Relu": QuantPolicy.ACTIVATION}
_QSPEC_UNARY = {"Relu": QuantSpec(activations=(0,), weight=None, bias=None, shares_output_grid=True)}

for _name, (_ufn, _attrs, _doc) in UNARY_OPS.items():
    register(
        OpDef(
            _name,
            same_as_input(),
            _unary_ref(_ufn),
            _attrs or NoAttrs,
            layout=Layout.AGNOSTIC,
            quant=_QUANT_UNARY.get(_name, QuantPolicy.NONE),
            qspec=_QSPEC_UNARY.get(_name),
            doc=_doc,
        )
    )


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    return np.vectorize(erf, otypes=[np.float64])(x).astype(x.dtype)


register(
    OpDef(
        "PRelu",
        _broadcast_infer(same_dtype=False),
        _prelu_ref,
        inputs=(2, 2),
        layout=Layout.SPATIAL,
        doc="y = x if x >= 0 else slope*x (slope broadcasts)",
    )
)


@dataclass(frozen=True)
class ClipAttrs:
    """Clip takes min/max as optional inputs (opset >= 11)."""


def _clip_ref(ins: list[np.ndarray | None], a: Any, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    lo = ins[1] if len(ins) > 1 and ins[1] is not None else None
    hi = ins[2] if len(ins) > 2 and ins[2] is not None else None
    y = x
    if lo is not None:
        y = np.maximum(y, lo.astype(x.dtype))
    if hi is not None:
        y = np.minimum(y, hi.astype(x.dtype))
    return [np.asarray(y, dtype=x.dtype)]


register(
    OpDef(
        "Clip",
        same_as_input(),
        _clip_ref,
        inputs=(1, 3),
        layout=Layout.AGNOSTIC,
        quant=QuantPolicy.ACTIVATION,
        qspec=QuantSpec(activations=(0,), weight=None, bias=None, shares_output_grid=True),
        doc="y = min(max(x, min), max); min and max are optional scalar inputs",
    )
)
