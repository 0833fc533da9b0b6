"""Pooling: MaxPool (with optional Indices), AveragePool, GlobalAveragePool, GlobalMaxPool.

MaxPool: y[n, c, o] = max_k x_pad[n, c, o*s + k*d] with -inf padding.
AveragePool: y[n, c, o] = sum_k x_pad[n, c, o*s + k*d] / count, where count is the
number of window taps inside the input (count_include_pad=0) or inside the
explicitly padded input (count_include_pad=1); taps that ceil_mode adds past the
end pad never count. Global pools reduce every spatial axis to 1.

References loop over the kernel offsets (k1*k2 strided slices), so they stay fast
on large feature maps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.registry import InferContext, Layout, NoAttrs, OpDef, QuantPolicy, register
from compiler.ops.shapes import AUTO_PADS, conv_out_dims, resolve_pads, window_out, window_params

__all__ = ["MaxPoolAttrs", "AveragePoolAttrs", "pool_geometry"]


@dataclass(frozen=True)
class MaxPoolAttrs:
    """MaxPool attributes; ``kernel_shape`` is required."""

    auto_pad: str = "NOTSET"
    ceil_mode: int = 0
    dilations: tuple[int, ...] = ()
    kernel_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    storage_order: int = 0
    strides: tuple[int, ...] = ()


@dataclass(frozen=True)
class AveragePoolAttrs:
    """AveragePool attributes; ``kernel_shape`` is required."""

    auto_pad: str = "NOTSET"
    ceil_mode: int = 0
    count_include_pad: int = 0
    dilations: tuple[int, ...] = ()
    kernel_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()


_POOL_INT = (DType.INT8, DType.UINT8)


def _infer_pool(ctx: InferContext) -> list[TensorType]:
    a: MaxPoolAttrs | AveragePoolAttrs = ctx.attrs
    t = ctx.type(0)
    if not (t.dtype.is_float or (isinstance(a, MaxPoolAttrs) and t.dtype in _POOL_INT)):
        raise ctx.fail(f"unsupported input dtype {t.dtype.short}")
    x = ctx.shape(0)
    nd = len(x) - 2
    if nd < 1:
        raise ctx.fail(f"X must be (N, C, spatial...), got rank {len(x)}")
    if a.auto_pad not in AUTO_PADS:
        raise ctx.fail(f"unknown auto_pad {a.auto_pad!r}")
    if isinstance(a, MaxPoolAttrs) and a.storage_order not in (0, 1):
        raise ctx.fail(f"storage_order must be 0 or 1, got {a.storage_order}")
    if not a.kernel_shape:
        raise ctx.fail("kernel_shape is required")
    try:
        s, d, p = window_params(nd, a.kernel_shape, a.strides, a.dilations, a.pads)
        out = conv_out_dims(a.auto_pad, x[2:], a.kernel_shape, s, d, p, bool(a.ceil_mode))
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    for i in range(nd):
        eff = d[i] * (a.kernel_shape[i] - 1) + 1
        if p[i] >= eff or p[i + nd] >= eff:
            raise ctx.fail(f"pads {p} must be smaller than the kernel {a.kernel_shape}")
    y = TensorType(t.dtype, (x[0], x[1], *out))
    return [y, TensorType(DType.INT64, y.shape)][: ctx.num_outputs]


def pool_geometry(
    shape: Sequence[int], a: MaxPoolAttrs | AveragePoolAttrs
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], list[int]]:
    """Static pooling geometry: kernel, strides, dilations, pads (with any extra end pad
    that ceil_mode needs) and output spatial dims."""
    nd = len(shape) - 2
    k = tuple(a.kernel_shape)
    s, d, p = window_params(nd, k, a.strides, a.dilations, a.pads)
    pads = list(resolve_pads(a.auto_pad, shape[2:], k, s, d, p))
    ceil = bool(a.ceil_mode)
    out = [int(window_out(shape[i + 2], k[i], s[i], d[i], pads[i], pads[i + nd], ceil)) for i in range(nd)]
    for i in range(nd):
        need = (out[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 - (shape[i + 2] + pads[i] + pads[i + nd])
        pads[i + nd] += max(0, need)
    return k, s, d, tuple(pads), out


def _taps(
    k: Sequence[int], s: Sequence[int], d: Sequence[int], out: Sequence[int]
) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """For each kernel offset, the strided spatial slice of the padded input it reads."""
    for off in np.ndindex(*k):
        yield (
            off,
            tuple(
                slice(o * dd, o * dd + ss * (n - 1) + 1, ss)
                for o, dd, ss, n in zip(off, d, s, out, strict=True)
            ),
        )


def _pad(x: np.ndarray, pads: Sequence[int], value: Any) -> np.ndarray:
    nd = x.ndim - 2
    width = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)]
    return np.pad(x, width, mode="constant", constant_values=value)


def _maxpool_ref(ins: list[np.ndarray | None], a: MaxPoolAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    k, s, d, pads, out = pool_geometry(x.shape, a)
    nd = x.ndim - 2
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = _pad(x, pads, low)
    best: np.ndarray | None = None
    arg = np.zeros((*x.shape[:2], *out), dtype=np.int64) if n > 1 else None
    for i, (_, sl) in enumerate(_taps(k, s, d, out)):
        win = xp[(slice(None), slice(None), *sl)]
        if best is None:
            best = win.copy()
            continue
        if arg is not None:
            arg[win > best] = i
        np.maximum(best, win, out=best)
    assert best is not None
    if arg is None:
        return [best]
    # Window-local offset -> absolute flat index into the input tensor.
    offs = np.unravel_index(arg, k)
    coords = []
    for j in range(nd):
        o = np.arange(out[j]).reshape((-1,) + (1,) * (nd - 1 - j))
        coords.append(o * s[j] - pads[j] + offs[j] * d[j])
    sp = x.shape[2:]
    flat = np.ravel_multi_index(tuple(coords), sp, order="F" if a.storage_order else "C")
    base = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[0], x.shape[1], *(1,) * nd)
    return [best, base * int(np.prod(sp)) + flat]


def _avgpool_ref(ins: list[np.ndarray | None], a: AveragePoolAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    k, s, d, pads, out = pool_geometry(x.shape, a)
    nd = x.ndim - 2
    acc = np.promote_types(x.dtype, np.float32)
    xp = _pad(x.astype(acc, copy=False), pads, 0)
    # 1 where a tap counts toward the divisor, in padded coordinates.
    explicit = window_params(nd, k, a.strides, a.dilations, a.pads)[2]
    base = resolve_pads(a.auto_pad, x.shape[2:], k, s, d, explicit)
    inc = bool(a.count_include_pad)
    mask = np.zeros(xp.shape[2:], dtype=acc)
    mask[
        tuple(
            slice(0 if inc else pads[i], pads[i] + x.shape[i + 2] + (base[i + nd] if inc else 0))
            for i in range(nd)
        )
    ] = 1
    total = np.zeros((*x.shape[:2], *out), dtype=acc)
    count = np.zeros(tuple(out), dtype=acc)
    for _, sl in _taps(k, s, d, out):
        total += xp[(slice(None), slice(None), *sl)]
        count += mask[sl]
    return [(total / np.maximum(count, 1)).astype(x.dtype)]


def _infer_global(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if not t.dtype.is_float:
        raise ctx.fail(f"unsupported input dtype {t.dtype.short}")
    x = ctx.shape(0)
    if len(x) < 3:
        raise ctx.fail(f"X must be (N, C, spatial...), got rank {len(x)}")
    return [TensorType(t.dtype, (x[0], x[1], *(1,) * (len(x) - 2)))]


def _global_ref(fn: str) -> Any:
    def ref(ins: list[np.ndarray | None], a: NoAttrs, n: int) -> list[np.ndarray]:
        x = ins[0]
        assert x is not None
        axes = tuple(range(2, x.ndim))
        if fn == "max":
            return [x.max(axis=axes, keepdims=True)]
        return [x.mean(axis=axes, keepdims=True, dtype=np.float64).astype(x.dtype)]

    return ref


register(
    OpDef(
        "MaxPool",
        _infer_pool,
        _maxpool_ref,
        MaxPoolAttrs,
        outputs=(1, 2),
        layout=Layout.SPATIAL,
        quant=QuantPolicy.PASSTHROUGH,
        doc="y[n,c,o] = max_k x_pad[n,c,o*s+k*d] (-inf pads); optional Indices (int64 flat input index)",
    )
)
register(
    OpDef(
        "AveragePool",
        _infer_pool,
        _avgpool_ref,
        AveragePoolAttrs,
        layout=Layout.SPATIAL,
        quant=QuantPolicy.ACTIVATION,
        doc="y[n,c,o] = sum_k x_pad[n,c,o*s+k*d] / count (count_include_pad picks the counted taps)",
    )
)
register(
    OpDef(
        "GlobalAveragePool",
        _infer_global,
        _global_ref("mean"),
        layout=Layout.SPATIAL,
        quant=QuantPolicy.ACTIVATION,
        doc="y[n,c,1...] = mean over spatial axes of x[n,c,...]",
    )
)
register(
    OpDef(
        "GlobalMaxPool",
        _infer_global,
        _global_ref("max"),
        layout=Layout.SPATIAL,
        quant=QuantPolicy.PASSTHROUGH,
        doc="y[n,c,1...] = max over spatial axes of x[n,c,...]",
    )
)
