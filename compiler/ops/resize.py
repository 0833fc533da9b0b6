"""Resize in the opset-13+ form: inputs (X, roi, scales, sizes), one of scales/sizes given.

Each resized axis maps an output index i to a source coordinate x = T(i) by the
coordinate_transformation_mode T (e.g. half_pixel: x = (i + 0.5) / scale - 0.5), then
interpolates: nearest picks round(x) by ``nearest_mode``; linear blends x[floor],
x[floor + 1] with weights (1 - f, f); cubic uses 4 taps of the Keys kernel with
coefficient ``cubic_coeff_a``. Source indices clamp to the edge (or get weight 0 and a
renormalization with ``exclude_outside``); tf_crop_and_resize writes
``extrapolation_value`` where x leaves the input. The output size along an axis is
floor(in * scale), or ``sizes`` (adjusted by ``keep_aspect_ratio_policy``); when
scales/sizes are not constants, inference keeps the rank and marks resized dims unknown.
``antialias`` (linear/cubic, downsampling) stretches the kernel by 1/scale.

Coordinates are computed in float32 in the same order as ONNX Runtime, so nearest
picks identical pixels; interpolation is separable and runs axis by axis in float64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Dim, DType, TensorType
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, QuantSpec, register
from compiler.ops.shapes import UNKNOWN, normalize_axes, scaled_dim

__all__ = ["ResizeAttrs", "resize_plan", "COORDINATE_MODES", "NEAREST_MODES"]

COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
    "tf_half_pixel_for_nn",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_MODES = ("nearest", "linear", "cubic")
_POLICIES = ("stretch", "not_larger", "not_smaller")
_TIE_EPS = 1e-6


@dataclass(frozen=True)
class ResizeAttrs:
    """Resize attributes (opset 19), defaults as in ONNX."""

    antialias: int = 0
    axes: tuple[int, ...] = ()
    coordinate_transformation_mode: str = "half_pixel"
    cubic_coeff_a: float = -0.75
    exclude_outside: int = 0
    extrapolation_value: float = 0.0
    keep_aspect_ratio_policy: str = "stretch"
    mode: str = "nearest"
    nearest_mode: str = "round_prefer_floor"


def _present(v: np.ndarray | None) -> np.ndarray | None:
    """An optional tensor input; an empty tensor counts as absent (pre-opset-13 style)."""
    return None if v is None or v.size == 0 else v.reshape(-1)


def resize_plan(
    shape: Sequence[Dim], a: ResizeAttrs, scales: np.ndarray | None, sizes: np.ndarray | None
) -> tuple[list[Dim], list[float | None], list[int]]:
    """Output shape, per-axis float32 scales (None if unknown) and the resized axes.

    Raises ``ValueError`` for an invalid combination of inputs and attributes.
    """
    r = len(shape)
    axes = normalize_axes(a.axes, r) if a.axes else list(range(r))
    if len(set(axes)) != len(axes):
        raise ValueError(f"repeated axes {a.axes}")
    scales, sizes = _present(scales), _present(sizes)
    if (scales is None) == (sizes is None):
        raise ValueError("exactly one of scales and sizes must be given")
    given = scales if scales is not None else sizes
    assert given is not None
    if len(given) != len(axes):
        raise ValueError(f"{len(given)} scales/sizes for {len(axes)} axes")
    out: list[Dim] = list(shape)
    sc: list[float | None] = [1.0] * r
    if scales is not None:
        for ax, s in zip(axes, scales.astype(np.float32), strict=True):
            if not s > 0:
                raise ValueError(f"scales must be > 0, got {scales.tolist()}")
            sc[ax], out[ax] = float(s), scaled_dim(shape[ax], float(s))
        return out, sc, axes
    assert sizes is not None
    want = [int(v) for v in sizes]
    if min(want) < 1:
        raise ValueError(f"sizes must be >= 1, got {want}")
    if a.keep_aspect_ratio_policy == "stretch":
        for ax, n in zip(axes, want, strict=True):
            d = shape[ax]
            out[ax] = n
            sc[ax] = float(np.float32(n) / np.float32(d)) if isinstance(d, int) else None
        return out, sc, axes
    ins = [shape[ax] for ax in axes]
    if not all(isinstance(d, int) for d in ins):
        raise ValueError(f"keep_aspect_ratio_policy needs static input dims, got {ins}")
    ratios = [np.float32(n) / np.float32(d) for n, d in zip(want, ins, strict=True)]
    s32 = min(ratios) if a.keep_aspect_ratio_policy == "not_larger" else max(ratios)
    for ax, d in zip(axes, ins, strict=True):
        sc[ax] = float(s32)
        out[ax] = int(np.floor(np.float64(s32 * np.float32(d)) + 0.5))
    return out, sc, axes


def _given(ctx: InferContext, i: int) -> bool:
    """True if optional input ``i`` is present and not an empty constant."""
    c = ctx.const(i)
    return ctx.has(i) and (c is None or c.size > 0)


def _infer_resize(ctx: InferContext) -> list[TensorType]:
    a: ResizeAttrs = ctx.attrs
    t = ctx.type(0)
    for name, v, allowed in (
        ("mode", a.mode, _MODES),
        ("coordinate_transformation_mode", a.coordinate_transformation_mode, COORDINATE_MODES),
        ("nearest_mode", a.nearest_mode, NEAREST_MODES),
        ("keep_aspect_ratio_policy", a.keep_aspect_ratio_policy, _POLICIES),
    ):
        if v not in allowed:
            raise ctx.fail(f"unknown {name} {v!r}")
    if ctx.has(2) and not ctx.type(2).dtype.is_float:
        raise ctx.fail(f"scales must be float, got {ctx.type(2).dtype.short}")
    if ctx.has(3) and ctx.type(3).dtype != DType.INT64:
        raise ctx.fail(f"sizes must be int64, got {ctx.type(3).dtype.short}")
    if a.coordinate_transformation_mode == "tf_crop_and_resize" and not ctx.has(1):
        raise ctx.fail("tf_crop_and_resize needs the roi input")
    given = [i for i in (2, 3) if _given(ctx, i)]
    if len(given) != 1:
        raise ctx.fail("exactly one of scales and sizes must be given")
    x = ctx.shape(0)
    if ctx.const(given[0]) is None:
        # Computed at run time: the rank is known, the resized dims are not.
        try:
            axes = normalize_axes(a.axes, len(x), ctx.where) if a.axes else range(len(x))
        except ValueError as exc:
            raise ctx.fail(str(exc)) from None
        return [TensorType(t.dtype, tuple(UNKNOWN if i in axes else d for i, d in enumerate(x)))]
    scales, sizes = ctx.const(2), ctx.const(3)
    try:
        out, _, _ = resize_plan(x, a, scales, sizes)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return [TensorType(t.dtype, tuple(out))]


def _source_coords(mode: str, n_out: int, n_in: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """Source coordinate of each output index along one axis, in float32 (ORT's formulas)."""
    f = np.float32
    i = np.arange(n_out, dtype=f)
    s, lr, lo = f(scale), f(n_out), f(n_in)
    if mode == "asymmetric":
        return i / s
    if mode == "tf_half_pixel_for_nn":
        return (i + f(0.5)) / s
    if mode == "align_corners":
        return np.zeros(n_out, f) if n_out == 1 else i * (lo - f(1)) / (lr - f(1))
    if mode == "pytorch_half_pixel" and n_out == 1:
        return np.zeros(n_out, f)
    if mode == "half_pixel_symmetric":
        adjustment = lr / (s * lo)
        offset = lo / f(2) * (f(1) - adjustment)
        return (np.float64(offset) + (i.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(f)
    if mode == "tf_crop_and_resize":
        r0, r1 = f(roi[0]), f(roi[1])
        if n_out == 1:
            return np.full(n_out, f(0.5) * (r0 + r1) * (lo - f(1)), f)
        return r0 * (lo - f(1)) + (i * (r1 - r0) * (lo - f(1))) / (lr - f(1))
    return (i + f(0.5)) / s - f(0.5)  # half_pixel, pytorch_half_pixel


def _nearest_index(x: np.ndarray, mode: str) -> np.ndarray:
    """Round source coordinates by ``nearest_mode``; a fraction within 1e-6 of 0.5 is a
    tie (ONNX Runtime's rule, which absorbs float32 error in the coordinate)."""
    xd = x.astype(np.float64)
    lo = np.floor(xd)
    if mode == "floor":
        return lo
    if mode == "ceil":
        return np.ceil(xd)
    frac = xd - lo
    tie = np.abs(frac - 0.5) <= _TIE_EPS
    return lo + np.where(tie, 1.0 if mode == "round_prefer_ceil" else 0.0, frac > 0.5)


def _keys(d: np.ndarray, a: float) -> np.ndarray:
    """The Keys cubic kernel with coefficient ``a`` at distances ``d`` >= 0."""
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _antialias_taps(a: ResizeAttrs, x: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Taps and weights of the antialiased filter: when downsampling (scale < 1) the
    linear/cubic kernel is stretched by 1/scale (the ONNX reference's definition)."""
    s = min(scale, 1.0)
    xd = x.astype(np.float64)
    base = np.floor(xd)
    base = np.where(xd == base, base - 1, base)  # ratio in (0, 1], prefer the left pixel
    start = int(np.floor(-(1.0 if a.mode == "linear" else 2.0) / s) + 1)
    offs = np.arange(start, 2 - start)
    d = np.abs(offs - (xd - base)[:, None]) * s
    w = np.clip(1 - d, 0, 1) if a.mode == "linear" else _keys(d, a.cubic_coeff_a)
    return base[:, None] + offs, w / w.sum(axis=1, keepdims=True)


def _taps(
    a: ResizeAttrs, n_in: int, n_out: int, scale: float, roi: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Gather indices (n_out, T), weights (None for nearest) and an extrapolation mask."""
    x = _source_coords(a.coordinate_transformation_mode, n_out, n_in, scale, roi)
    outside = None
    if a.coordinate_transformation_mode == "tf_crop_and_resize":
        outside = (x < 0) | (x > np.float32(n_in - 1))
    if a.mode == "nearest":
        return np.clip(_nearest_index(x, a.nearest_mode), 0, n_in - 1).astype(np.intp)[:, None], None, outside
    if a.mode == "linear" and not a.antialias:
        xc = np.clip(x.astype(np.float64), 0, n_in - 1)
        i0 = np.floor(xc)
        frac = xc - i0
        idx = np.stack([i0, np.minimum(i0 + 1, n_in - 1)], axis=1)
        return idx.astype(np.intp), np.stack([1 - frac, frac], axis=1), outside
    if a.antialias:
        idx, w = _antialias_taps(a, x, scale)
    else:
        xd = x.astype(np.float64)
        i0 = np.floor(xd)
        idx = i0[:, None] + np.arange(-1, 3)
        w = _keys(np.abs(np.arange(-1, 3) - (xd - i0)[:, None]), a.cubic_coeff_a)
    if a.exclude_outside:
        w = np.where((idx < 0) | (idx > n_in - 1), 0.0, w)
        w = w / w.sum(axis=1, keepdims=True)
    return np.clip(idx, 0, n_in - 1).astype(np.intp), w, outside


def _resize_ref(ins: list[np.ndarray | None], a: ResizeAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    get = [ins[i] if len(ins) > i else None for i in range(4)]
    out, sc, axes = resize_plan(x.shape, a, get[2], get[3])
    roi = _present(get[1])
    r = x.ndim
    y = x if a.mode == "nearest" else x.astype(np.float64)
    for k, ax in enumerate(axes):
        n_out, scale = int(out[ax]), sc[ax]
        assert scale is not None
        span = (0.0, 1.0) if roi is None else (float(roi[k]), float(roi[len(axes) + k]))
        if scale == 1.0 and n_out == x.shape[ax] and (roi is None or span == (0.0, 1.0)):
            continue  # identity (ONNX Runtime skips tf_half_pixel_for_nn's half-pixel shift too)
        idx, w, outside = _taps(a, x.shape[ax], n_out, scale, span)
        shape = (1,) * ax + (n_out,) + (1,) * (r - ax - 1)
        if w is None:
            y = np.take(y, idx[:, 0], axis=ax)
        else:
            y = sum(np.take(y, idx[:, t], axis=ax) * w[:, t].reshape(shape) for t in range(idx.shape[1]))
        if outside is not None and outside.any():
            y = np.where(outside.reshape(shape), a.extrapolation_value, y)
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        return [np.clip(np.trunc(y), info.min, info.max).astype(x.dtype)]  # ORT truncates
    return [np.asarray(y).astype(x.dtype)]


register(
    OpDef(
        "Resize",
        _infer_resize,
        _resize_ref,
        ResizeAttrs,
        inputs=(1, 4),
        layout=Layout.SPATIAL,
        quant=QuantPolicy.ACTIVATION,
        qspec=QuantSpec(activations=(0,), weight=None, bias=None),
        doc="y[i] = interp(x, T(i)) per resized axis; size floor(in*scale) or sizes",
    )
)
