"""Random ops (RandomUniformLike, RandomNormalLike) and Kiln's counter-based generator for them.

The ops stay non-deterministic for the passes (never folded: ``deterministic=False``), but Kiln's
values are a pure function of (seed, element index), so a build and its runs are reproducible and
the interpreter and the TVM library give the same numbers. For element i (row-major) and stream
s ∈ {0, 1}, with mix(x) the 32-bit integer hash (all arithmetic mod 2^32)::

    h1 = (x ^ (x >> 16)) · 0x7feb352d,  h2 = (h1 ^ (h1 >> 15)) · 0x846ca68b,  mix(x) = h2 ^ (h2 >> 16)
    key = the bits of float32(seed) (``DEFAULT_SEED`` = 0 when the attribute is absent)
    k0 = mix(key),  k1 = mix(key ^ 0x9e3779b9)
    bits(i, s) = mix(mix(2 i + s + k0) ^ k1)

and 24-bit uniforms v(i, s) = (bits(i, s) >> 8) · 2^-24 ∈ [0, 1)::

    RandomUniformLike:  y_i = low + (high - low) · v(i, 0)
    RandomNormalLike:   y_i = mean + scale · sqrt(-2 ln(1 - v(i, 0))) · cos(2π v(i, 1))   (Box-Muller)

computed in float32 and cast to the output type (``dtype``, default the input's). onnxruntime's own
generator gives other values: only the distributions agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.registry import InferContext, Layout, OpDef, register

__all__ = [
    "RandomLikeAttrs",
    "DEFAULT_SEED",
    "MIX_MULTIPLIERS",
    "STREAM_KEY",
    "seed_keys",
    "mix32",
    "uniform24",
]

DEFAULT_SEED = 0.0
"""The seed of a random op without a ``seed`` attribute (so builds are reproducible)."""
MIX_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)
STREAM_KEY = 0x9E3779B9
_U24 = float(2.0**-24)


@dataclass(frozen=True)
class RandomLikeAttrs:
    """RandomUniformLike / RandomNormalLike attributes (ONNX defaults)."""

    dtype: int | None = None
    high: float = 1.0
    low: float = 0.0
    mean: float = 0.0
    scale: float = 1.0
    seed: float | None = None


def mix32(x: np.ndarray) -> np.ndarray:
    """The 32-bit hash mix(x) of the module docstring (uint32 in, uint32 out)."""
    x = np.asarray(x, np.uint32)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint32(16))) * np.uint32(MIX_MULTIPLIERS[0])
        x = (x ^ (x >> np.uint32(15))) * np.uint32(MIX_MULTIPLIERS[1])
    return np.asarray(x ^ (x >> np.uint32(16)), np.uint32)


def seed_keys(seed: float | None) -> tuple[int, int]:
    """(k0, k1) of ``seed`` (the bits of its float32; ``DEFAULT_SEED`` when None)."""
    key = np.asarray(DEFAULT_SEED if seed is None else seed, np.float32).view(np.uint32)
    return int(mix32(key)), int(mix32(key ^ np.uint32(STREAM_KEY)))


def uniform24(n: int, seed: float | None, stream: int) -> np.ndarray:
    """v(i, stream) for i < n, float32 in [0, 1)."""
    k0, k1 = seed_keys(seed)
    with np.errstate(over="ignore"):
        c = np.arange(n, dtype=np.uint32) * np.uint32(2) + np.uint32(stream) + np.uint32(k0)
    bits = mix32(mix32(c) ^ np.uint32(k1))
    return ((bits >> np.uint32(8)).astype(np.float32) * np.float32(_U24)).astype(np.float32)


def _infer_like(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    return [TensorType(DType(ctx.attrs.dtype) if ctx.attrs.dtype is not None else t.dtype, t.shape)]


def _out_dtype(x: np.ndarray, a: RandomLikeAttrs) -> np.dtype:
    return np.dtype(DType(a.dtype).numpy if a.dtype is not None else x.dtype)


def _uniform(ins: list[np.ndarray | None], a: RandomLikeAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    v = uniform24(x.size, a.seed, 0)
    y = np.float32(a.low) + (np.float32(a.high) - np.float32(a.low)) * v
    return [y.reshape(x.shape).astype(_out_dtype(x, a))]


def _normal(ins: list[np.ndarray | None], a: RandomLikeAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    v0, v1 = uniform24(x.size, a.seed, 0), uniform24(x.size, a.seed, 1)
    r = np.sqrt(np.float32(-2.0) * np.log(np.float32(1.0) - v0))
    z = r * np.cos(np.float32(2.0 * np.pi) * v1)
    y = np.float32(a.mean) + np.float32(a.scale) * z.astype(np.float32)
    return [y.reshape(x.shape).astype(_out_dtype(x, a))]


register(
    OpDef(
        "RandomUniformLike",
        _infer_like,
        _uniform,
        RandomLikeAttrs,
        deterministic=False,
        layout=Layout.AGNOSTIC,
        doc="y ~ U(low, high) with x's shape (Kiln's counter-based generator)",
    )
)
register(
    OpDef(
        "RandomNormalLike",
        _infer_like,
        _normal,
        RandomLikeAttrs,
        deterministic=False,
        layout=Layout.AGNOSTIC,
        doc="y ~ N(mean, scale) with x's shape (Kiln's counter-based generator)",
    )
)
