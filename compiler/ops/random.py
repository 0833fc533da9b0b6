"""Random ops: registered so that passes know they are non-deterministic (never folded)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.registry import InferContext, Layout, OpDef, register

__all__ = ["RandomLikeAttrs"]


@dataclass(frozen=True)
class RandomLikeAttrs:
    """RandomUniformLike / RandomNormalLike attributes (ONNX defaults)."""

    dtype: int | None = None
    high: float = 1.0
    low: float = 0.0
    mean: float = 0.0
    scale: float = 1.0
    seed: float | None = None


def _infer_like(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    return [TensorType(DType(ctx.attrs.dtype) if ctx.attrs.dtype is not None else t.dtype, t.shape)]


def _uniform(ins: list[np.ndarray | None], a: RandomLikeAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    rng = np.random.default_rng(None if a.seed is None else int(a.seed))
    dt = DType(a.dtype).numpy if a.dtype is not None else x.dtype
    return [rng.uniform(a.low, a.high, x.shape).astype(dt)]


def _normal(ins: list[np.ndarray | None], a: RandomLikeAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    rng = np.random.default_rng(None if a.seed is None else int(a.seed))
    dt = DType(a.dtype).numpy if a.dtype is not None else x.dtype
    return [rng.normal(a.mean, a.scale, x.shape).astype(dt)]


register(
    OpDef(
        "RandomUniformLike",
        _infer_like,
        _uniform,
        RandomLikeAttrs,
        deterministic=False,
        layout=Layout.AGNOSTIC,
        doc="y ~ U(low, high) with x's shape",
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
        doc="y ~ N(mean, scale) with x's shape",
    )
)
