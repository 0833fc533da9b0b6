"""DepthToSpace and SpaceToDepth on NCHW tensors with block size b.

DepthToSpace, DCR: y = transpose(reshape(x, [N, b, b, C/b², H, W]), [0, 3, 4, 1, 5, 2]), then
reshaped to [N, C/b², H·b, W·b]; CRD splits channels as [C/b², b, b] and permutes
[0, 1, 4, 2, 5, 3]. SpaceToDepth is DCR's inverse:
y = transpose(reshape(x, [N, C, H/b, b, W/b, b]), [0, 3, 5, 1, 2, 4]) -> [N, C·b², H/b, W/b].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Dim, TensorType
from compiler.ops.inputs import first
from compiler.ops.registry import InferContext, OpDef, QuantPolicy, register

__all__ = ["DepthToSpaceAttrs", "SpaceToDepthAttrs"]


@dataclass(frozen=True)
class DepthToSpaceAttrs:
    """DepthToSpace: ``blocksize`` is required; ``mode`` is DCR (depth-column-row) or CRD."""

    blocksize: int = 0
    mode: str = "DCR"


@dataclass(frozen=True)
class SpaceToDepthAttrs:
    """SpaceToDepth: ``blocksize`` is required."""

    blocksize: int = 0


def _mul(d: Dim, b: int) -> Dim:
    return d * b if isinstance(d, int) else f"{b}*{d}"


def _div(ctx: InferContext, d: Dim, b: int, what: str) -> Dim:
    if isinstance(d, str):
        return f"{d}/{b}"
    if d % b:
        raise ctx.fail(f"{what} {d} is not divisible by {b}")
    return d // b


def _check(ctx: InferContext) -> tuple[TensorType, int]:
    t, b = ctx.type(0), ctx.attrs.blocksize
    if b < 1:
        raise ctx.fail(f"blocksize must be >= 1, got {b}")
    if t.rank is not None and t.rank != 4:
        raise ctx.fail(f"input must be 4-D (NCHW), got rank {t.rank}")
    return t, b


def _infer_d2s(ctx: InferContext) -> list[TensorType]:
    t, b = _check(ctx)
    if getattr(ctx.attrs, "mode", "DCR") not in ("DCR", "CRD"):
        raise ctx.fail(f"mode must be DCR or CRD, got {ctx.attrs.mode!r}")
    if t.shape is None:
        return [t]
    n, c, h, w = t.shape
    return [t.with_shape((n, _div(ctx, c, b * b, "channels"), _mul(h, b), _mul(w, b)))]


def _infer_s2d(ctx: InferContext) -> list[TensorType]:
    t, b = _check(ctx)
    if t.shape is None:
        return [t]
    n, c, h, w = t.shape
    return [t.with_shape((n, _mul(c, b * b), _div(ctx, h, b, "height"), _div(ctx, w, b, "width")))]


def _ref_d2s(ins: list[np.ndarray | None], a: DepthToSpaceAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    b = a.blocksize
    nn, c, h, w = x.shape
    if a.mode == "DCR":
        y = x.reshape(nn, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif a.mode == "CRD":
        y = x.reshape(nn, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"unknown mode {a.mode!r}")
    return [np.ascontiguousarray(y.reshape(nn, c // (b * b), h * b, w * b))]


def _ref_s2d(ins: list[np.ndarray | None], a: SpaceToDepthAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    b = a.blocksize
    nn, c, h, w = x.shape
    y = x.reshape(nn, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return [np.ascontiguousarray(y.reshape(nn, c * b * b, h // b, w // b))]


register(
    OpDef(
        "DepthToSpace",
        _infer_d2s,
        _ref_d2s,
        DepthToSpaceAttrs,
        quant=QuantPolicy.PASSTHROUGH,
        doc="y[n, c, h·b+i, w·b+j] = x[n, (i·b+j)·C/b² + c, h, w] (DCR); CRD: x[n, c·b² + i·b + j, h, w]",
    )
)
register(
    OpDef(
        "SpaceToDepth",
        _infer_s2d,
        _ref_s2d,
        SpaceToDepthAttrs,
        quant=QuantPolicy.PASSTHROUGH,
        doc="y[n, (i·b+j)·C + c, h, w] = x[n, c, h·b+i, w·b+j] (inverse of DepthToSpace DCR)",
    )
)
