"""Normalizations over an NCHW-style channel axis, plus LayerNormalization.

BatchNormalization (inference): y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + B[c].
InstanceNormalization: the same with mean and variance of each (n, c) plane.
LRN: y = x / (bias + alpha/size * sum_{c' near c} x[c']^2) ** beta.
LayerNormalization: normalize over axes [axis, rank), then * scale + B.
LpNormalization: y = x / ||x||_p along ``axis`` (p = 1 or 2; a zero norm gives 0).
RMSNormalization (opset 23): y = x / sqrt(mean(x^2 over [axis, rank)) + eps) * scale.

References compute in float64 and cast back to the input dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Dim, DType, TensorType
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, register
from compiler.ops.shapes import broadcast, normalize_axis

__all__ = [
    "BatchNormalizationAttrs",
    "InstanceNormalizationAttrs",
    "LRNAttrs",
    "LayerNormalizationAttrs",
    "LpNormalizationAttrs",
    "RMSNormalizationAttrs",
]


@dataclass(frozen=True)
class BatchNormalizationAttrs:
    """BatchNormalization attributes; only inference (training_mode=0) is supported."""

    epsilon: float = 1e-5
    momentum: float = 0.9
    training_mode: int = 0


@dataclass(frozen=True)
class InstanceNormalizationAttrs:
    """InstanceNormalization attributes."""

    epsilon: float = 1e-5


@dataclass(frozen=True)
class LRNAttrs:
    """LRN attributes; ``size`` (the channel window) is required."""

    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0
    size: int = 0


@dataclass(frozen=True)
class LayerNormalizationAttrs:
    """LayerNormalization attributes (``stash_type`` 1 = float32 statistics)."""

    axis: int = -1
    epsilon: float = 1e-5
    stash_type: int = 1


def _check_x(ctx: InferContext, min_rank: int) -> tuple[TensorType, tuple[Dim, ...]]:
    t = ctx.type(0)
    if not t.dtype.is_float:
        raise ctx.fail(f"X must be float, got {t.dtype.short}")
    x = ctx.shape(0)
    if len(x) < min_rank:
        raise ctx.fail(f"X must have rank >= {min_rank}, got {len(x)}")
    return t, x


def _check_per_channel(ctx: InferContext, inputs: range, c: Dim) -> None:
    for i in inputs:
        s = ctx.shape(i)
        if len(s) != 1 or (isinstance(s[0], int) and isinstance(c, int) and s[0] != c):
            raise ctx.fail(f"input {i} must have shape ({c},), got {s}")
        if not ctx.type(i).dtype.is_float:
            raise ctx.fail(f"input {i} must be float, got {ctx.type(i).dtype.short}")


def _infer_bn(ctx: InferContext) -> list[TensorType]:
    a: BatchNormalizationAttrs = ctx.attrs
    if a.training_mode:
        raise ctx.fail("training_mode=1 is not supported (inference form only)")
    t, x = _check_x(ctx, 2)
    _check_per_channel(ctx, range(1, 5), x[1])
    return [t]


def _channel(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.astype(np.float64).reshape(-1, *(1,) * (ndim - 2))


def _bn_ref(ins: list[np.ndarray | None], a: BatchNormalizationAttrs, n: int) -> list[np.ndarray]:
    x, scale, b, mean, var = ins
    assert x is not None and scale is not None and b is not None and mean is not None and var is not None
    if a.training_mode:
        raise NotImplementedError("BatchNormalization training_mode=1")
    k = x.ndim
    inv = _channel(scale, k) / np.sqrt(_channel(var, k) + a.epsilon)
    y = (x.astype(np.float64) - _channel(mean, k)) * inv + _channel(b, k)
    return [y.astype(x.dtype)]


def _infer_instance_norm(ctx: InferContext) -> list[TensorType]:
    t, x = _check_x(ctx, 3)
    _check_per_channel(ctx, range(1, 3), x[1])
    return [t]


def _instance_norm_ref(
    ins: list[np.ndarray | None], a: InstanceNormalizationAttrs, n: int
) -> list[np.ndarray]:
    x, scale, b = ins
    assert x is not None and scale is not None and b is not None
    axes = tuple(range(2, x.ndim))
    xf = x.astype(np.float64)
    mean = xf.mean(axis=axes, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (xf - mean) / np.sqrt(var + a.epsilon) * _channel(scale, x.ndim) + _channel(b, x.ndim)
    return [y.astype(x.dtype)]


def _infer_lrn(ctx: InferContext) -> list[TensorType]:
    a: LRNAttrs = ctx.attrs
    t, _ = _check_x(ctx, 3)
    if a.size < 1:
        raise ctx.fail(f"size must be >= 1, got {a.size}")
    return [t]


def _lrn_ref(ins: list[np.ndarray | None], a: LRNAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    sq = x.astype(np.float64) ** 2
    lo, hi = (a.size - 1) // 2, a.size - 1 - (a.size - 1) // 2
    width = [(0, 0), (lo + 1, hi)] + [(0, 0)] * (x.ndim - 2)
    csum = np.cumsum(np.pad(sq, width), axis=1)
    c = x.shape[1]
    window = csum[:, a.size : a.size + c] - csum[:, :c]
    y = x / (a.bias + a.alpha / a.size * window) ** a.beta
    return [y.astype(x.dtype)]


def _infer_layer_norm(ctx: InferContext) -> list[TensorType]:
    a: LayerNormalizationAttrs = ctx.attrs
    t, x = _check_x(ctx, 1)
    try:
        axis = normalize_axis(a.axis, len(x), ctx.where)
        for i in range(1, 3):
            if ctx.has(i):
                broadcast([x[axis:], ctx.shape(i)], ctx.where)
                if len(ctx.shape(i)) > len(x) - axis:
                    raise ValueError(f"input {i} {ctx.shape(i)} has more dims than normalized {x[axis:]}")
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    stash = DType.FLOAT32 if a.stash_type == 1 else t.dtype
    stats = TensorType(stash, (*x[:axis], *(1,) * (len(x) - axis)))
    return [t, stats, stats][: ctx.num_outputs]


def _layer_norm_ref(ins: list[np.ndarray | None], a: LayerNormalizationAttrs, n: int) -> list[np.ndarray]:
    x, scale = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    assert x is not None and scale is not None
    axes = tuple(range(normalize_axis(a.axis, x.ndim), x.ndim))
    xf = x.astype(np.float64)
    mean = xf.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(((xf - mean) ** 2).mean(axis=axes, keepdims=True) + a.epsilon)
    y = (xf - mean) * inv_std * scale.astype(np.float64)
    if b is not None:
        y = y + b.astype(np.float64)
    stash = np.float32 if a.stash_type == 1 else x.dtype
    return [y.astype(x.dtype), mean.astype(stash), inv_std.astype(stash)][:n]


register(
    OpDef(
        "BatchNormalization",
        _infer_bn,
        _bn_ref,
        BatchNormalizationAttrs,
        inputs=(5, 5),
        layout=Layout.SPATIAL,
        quant=QuantPolicy.NONE,
        doc="y = (x - mean[c]) / sqrt(var[c] + epsilon) * scale[c] + B[c] (inference form)",
    )
)
register(
    OpDef(
        "InstanceNormalization",
        _infer_instance_norm,
        _instance_norm_ref,
        InstanceNormalizationAttrs,
        inputs=(3, 3),
        layout=Layout.SPATIAL,
        doc="y = (x - mean_nc) / sqrt(var_nc + epsilon) * scale[c] + B[c], stats over spatial axes",
    )
)
register(
    OpDef(
        "LRN",
        _infer_lrn,
        _lrn_ref,
        LRNAttrs,
        layout=Layout.SPATIAL,
        doc="y = x / (bias + alpha/size * sum_{c-(size-1)//2 <= c' <= c+ceil((size-1)/2)} x[c']^2) ** beta",
    )
)
register(
    OpDef(
        "LayerNormalization",
        _infer_layer_norm,
        _layer_norm_ref,
        LayerNormalizationAttrs,
        inputs=(2, 3),
        outputs=(1, 3),
        layout=Layout.FIXED,
        doc="y = (x - mean) / sqrt(var + epsilon) * scale + B over axes [axis, rank); opt. Mean, InvStdDev",
    )
)


@dataclass(frozen=True)
class LpNormalizationAttrs:
    """LpNormalization: the norm's order ``p`` (1 or 2) and the axis it runs along."""

    axis: int = -1
    p: int = 2


@dataclass(frozen=True)
class RMSNormalizationAttrs:
    """RMSNormalization (opset 23): normalized axes [axis, rank); ``stash_type`` 1 = float32 statistics."""

    axis: int = -1
    epsilon: float = 1e-5
    stash_type: int = 1


def _infer_lp_norm(ctx: InferContext) -> list[TensorType]:
    a: LpNormalizationAttrs = ctx.attrs
    t, x = _check_x(ctx, 1)
    if a.p not in (1, 2):
        raise ctx.fail(f"p must be 1 or 2, got {a.p}")
    try:
        normalize_axis(a.axis, len(x), ctx.where)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return [t]


def _lp_norm_ref(ins: list[np.ndarray | None], a: LpNormalizationAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    xf = x.astype(np.float64)
    axis = normalize_axis(a.axis, x.ndim)
    norm = np.abs(xf).sum(axis, keepdims=True) if a.p == 1 else np.sqrt((xf * xf).sum(axis, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, 0.0, xf / norm)
    return [y.astype(x.dtype)]


def _infer_rms_norm(ctx: InferContext) -> list[TensorType]:
    a: RMSNormalizationAttrs = ctx.attrs
    t, x = _check_x(ctx, 1)
    try:
        axis = normalize_axis(a.axis, len(x), ctx.where)
        broadcast([x[axis:], ctx.shape(1)], ctx.where)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    if len(ctx.shape(1)) > len(x) - axis:
        raise ctx.fail(f"scale {ctx.shape(1)} has more dims than the normalized {x[axis:]}")
    return [t]


def _rms_norm_ref(ins: list[np.ndarray | None], a: RMSNormalizationAttrs, n: int) -> list[np.ndarray]:
    x, scale = ins[0], ins[1]
    assert x is not None and scale is not None
    axes = tuple(range(normalize_axis(a.axis, x.ndim), x.ndim))
    xf = x.astype(np.float64)
    inv_rms = 1.0 / np.sqrt((xf * xf).mean(axis=axes, keepdims=True) + a.epsilon)
    return [(xf * inv_rms * scale.astype(np.float64)).astype(x.dtype)]


register(
    OpDef(
        "LpNormalization",
        _infer_lp_norm,
        _lp_norm_ref,
        LpNormalizationAttrs,
        doc="y = x / ||x||_p along axis (p in {1, 2}; 0 where the norm is 0)",
    )
)
register(
    OpDef(
        "RMSNormalization",
        _infer_rms_norm,
        _rms_norm_ref,
        RMSNormalizationAttrs,
        inputs=(2, 2),
        min_opset=23,
        doc="y = x / sqrt(mean(x^2 over axes [axis, rank)) + epsilon) * scale",
    )
)
