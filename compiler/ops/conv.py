"""Convolutions: Conv and ConvTranspose over 1-D, 2-D and 3-D NCHW-style data.

Conv: y[n, m, o] = b[m] + sum_{c, k} x_pad[n, g*Cg + c, o*s + k*d] * W[m, c, k], with
g = m // (M / group) the group of output channel m and Cg = C / group.
ConvTranspose is its adjoint: every input pixel i scatters x[n, c, i] * W[c, m, k] to
output position i*s + k*d - pad_begin (plus bias).

References run as im2col + one batched matmul per group (grouped and depthwise conv
included), accumulating in float32 (or the input's wider float type).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from compiler.ir.types import Dim, TensorType
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, QuantSpec, register
from compiler.ops.shapes import AUTO_PADS, conv_out_dims, resolve_pads, window_params

__all__ = [
    "ConvAttrs",
    "ConvTransposeAttrs",
    "pad_spatial",
    "sliding_windows",
    "conv_nd",
    "conv_transpose_nd",
    "conv_transpose_geometry",
]


@dataclass(frozen=True)
class ConvAttrs:
    """Conv attributes; empty tuples mean ONNX's defaults (kernel from W, strides 1, ...)."""

    auto_pad: str = "NOTSET"
    dilations: tuple[int, ...] = ()
    group: int = 1
    kernel_shape: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()


@dataclass(frozen=True)
class ConvTransposeAttrs(ConvAttrs):
    """ConvTranspose attributes; ``output_shape`` (spatial) overrides ``pads`` when given."""

    output_padding: tuple[int, ...] = ()
    output_shape: tuple[int, ...] = ()


# ------------------------------------------------------------------ numpy kernels
def pad_spatial(x: np.ndarray, pads: Sequence[int], value: float = 0.0) -> np.ndarray:
    """Pad the spatial axes (2..) of ``x`` with ONNX pads ``[b..., e...]`` and a constant."""
    nd = x.ndim - 2
    if not any(pads):
        return x
    width = [(0, 0), (0, 0)] + [(int(pads[i]), int(pads[i + nd])) for i in range(nd)]
    return np.pad(x, width, mode="constant", constant_values=value)


def sliding_windows(
    xp: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> np.ndarray:
    """A read-only view ``(N, C, *out, *kernel)`` of the windows of a padded input."""
    nd = len(kernel)
    eff = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilations, strict=True))
    v = sliding_window_view(xp, eff, axis=tuple(range(2, 2 + nd)))
    idx = (slice(None), slice(None))
    idx += tuple(slice(None, None, s) for s in strides) + tuple(slice(None, None, d) for d in dilations)
    return v[idx]


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    return np.promote_types(dtype, np.float32)


def conv_nd(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    group: int,
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
) -> np.ndarray:
    """Grouped N-d convolution with explicit pads, as im2col + batched matmul."""
    acc = _acc_dtype(x.dtype)
    n, c = x.shape[:2]
    m, nd, kernel = w.shape[0], x.ndim - 2, w.shape[2:]
    cg, mg, ksize = c // group, m // group, int(np.prod(kernel))
    v = sliding_windows(pad_spatial(x.astype(acc, copy=False), pads), kernel, strides, dilations)
    out_sp = v.shape[2 : 2 + nd]
    npix = int(np.prod(out_sp))
    v = v.reshape(n, group, cg, *out_sp, *kernel)
    perm = (1, 0, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
    cols = v.transpose(perm).reshape(group, n * npix, cg * ksize)
    wm = w.astype(acc, copy=False).reshape(group, mg, cg * ksize).transpose(0, 2, 1)
    y = np.matmul(cols, wm).reshape(group, n, *out_sp, mg)
    y = y.transpose(1, 0, nd + 2, *range(2, nd + 2)).reshape(n, m, *out_sp)
    if b is not None:
        y = y + b.astype(acc).reshape(m, *(1,) * nd)
    return np.ascontiguousarray(y, dtype=x.dtype)


def conv_transpose_nd(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    group: int,
    strides: Sequence[int],
    dilations: Sequence[int],
    pads_begin: Sequence[int],
    out_sp: Sequence[int],
) -> np.ndarray:
    """Grouped N-d transposed convolution: per-pixel matmul, then a strided scatter-add
    (col2im) for each kernel offset, cropped to ``out_sp`` from ``pads_begin``."""
    acc = _acc_dtype(x.dtype)
    n, c = x.shape[:2]
    nd, in_sp, kernel = x.ndim - 2, x.shape[2:], w.shape[2:]
    cg, mg, ksize = c // group, w.shape[1], int(np.prod(kernel))
    m, npix = mg * group, int(np.prod(in_sp))
    xt = x.astype(acc, copy=False).reshape(n, group, cg, npix).transpose(1, 0, 3, 2)
    wg = w.astype(acc, copy=False).reshape(group, cg, mg * ksize)
    cols = np.matmul(xt.reshape(group, n * npix, cg), wg)
    cols = cols.reshape(group, n, *in_sp, mg, *kernel)
    cols = cols.transpose(1, 0, nd + 2, *range(nd + 3, 2 * nd + 3), *range(2, nd + 2)).reshape(
        n, m, *kernel, *in_sp
    )
    full = [
        max(strides[i] * (in_sp[i] - 1) + dilations[i] * (kernel[i] - 1) + 1, pads_begin[i] + out_sp[i])
        for i in range(nd)
    ]
    canvas = np.zeros((n, m, *full), dtype=acc)
    for k in np.ndindex(*kernel):
        sl = tuple(
            slice(k[i] * dilations[i], k[i] * dilations[i] + strides[i] * (in_sp[i] - 1) + 1, strides[i])
            for i in range(nd)
        )
        canvas[(slice(None), slice(None), *sl)] += cols[(slice(None), slice(None), *k)]
    crop = tuple(slice(pads_begin[i], pads_begin[i] + out_sp[i]) for i in range(nd))
    y = canvas[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + b.astype(acc).reshape(m, *(1,) * nd)
    return np.ascontiguousarray(y, dtype=x.dtype)


# ------------------------------------------------------------------ inference
_Ints = tuple[int, ...]


def _check_common(
    ctx: InferContext, attrs: ConvAttrs | ConvTransposeAttrs
) -> tuple[tuple[Dim, ...], tuple[Dim, ...], _Ints, _Ints, _Ints, _Ints]:
    """Shared Conv/ConvTranspose checks; returns x, w shapes, kernel, strides, dilations, pads."""
    tx, tw = ctx.type(0), ctx.type(1)
    if tx.dtype != tw.dtype or not tx.dtype.is_float:
        raise ctx.fail(f"X and W must share a float dtype, got {tx.dtype.short} and {tw.dtype.short}")
    x, w = ctx.shape(0), ctx.shape(1)
    if len(x) < 3:
        raise ctx.fail(f"X must be (N, C, spatial...), got rank {len(x)}")
    if len(w) != len(x):
        raise ctx.fail(f"W rank {len(w)} != X rank {len(x)}")
    if attrs.group < 1:
        raise ctx.fail(f"group must be >= 1, got {attrs.group}")
    if attrs.auto_pad not in AUTO_PADS:
        raise ctx.fail(f"unknown auto_pad {attrs.auto_pad!r}")
    kernel = w[2:]
    if attrs.kernel_shape and (
        len(attrs.kernel_shape) != len(kernel)
        or any(isinstance(k, int) and k != a for k, a in zip(kernel, attrs.kernel_shape, strict=True))
    ):
        raise ctx.fail(f"kernel_shape {attrs.kernel_shape} disagrees with W spatial dims {kernel}")
    ks = tuple(attrs.kernel_shape) or kernel
    if not all(isinstance(k, int) for k in ks):
        raise ctx.fail(f"kernel dims must be static, got {ks}")
    kernel_i = tuple(int(k) for k in ks)
    try:
        s, d, p = window_params(len(x) - 2, kernel_i, attrs.strides, attrs.dilations, attrs.pads)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return x, w, kernel_i, s, d, p


def _check_bias(ctx: InferContext, m: Dim) -> None:
    if not ctx.has(2):
        return
    tb = ctx.type(2)
    if tb.dtype != ctx.type(0).dtype:
        raise ctx.fail(f"bias dtype {tb.dtype.short} != X dtype {ctx.type(0).dtype.short}")
    bs = ctx.shape(2)
    if len(bs) != 1 or (isinstance(bs[0], int) and isinstance(m, int) and bs[0] != m):
        raise ctx.fail(f"bias must have shape ({m},), got {bs}")


def _infer_conv(ctx: InferContext) -> list[TensorType]:
    a: ConvAttrs = ctx.attrs
    x, w, kernel, s, d, p = _check_common(ctx, a)
    m, cg = w[0], w[1]
    if isinstance(x[1], int) and isinstance(cg, int) and x[1] != cg * a.group:
        raise ctx.fail(f"X has {x[1]} channels but W expects {cg} x group {a.group}")
    if isinstance(m, int) and m % a.group:
        raise ctx.fail(f"{m} output channels are not divisible by group {a.group}")
    _check_bias(ctx, m)
    try:
        out = conv_out_dims(a.auto_pad, x[2:], kernel, s, d, p)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return [TensorType(ctx.type(0).dtype, (x[0], m, *out))]


def _conv_ref(ins: list[np.ndarray | None], a: ConvAttrs, n: int) -> list[np.ndarray]:
    x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    assert x is not None and w is not None
    kernel = w.shape[2:]
    s, d, p = window_params(x.ndim - 2, kernel, a.strides, a.dilations, a.pads)
    pads = resolve_pads(a.auto_pad, x.shape[2:], kernel, s, d, p)
    return [conv_nd(x, w, b, a.group, s, d, pads)]


def conv_transpose_geometry(
    a: ConvTransposeAttrs,
    in_sp: Sequence[Dim],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
) -> tuple[list[Dim], list[int] | None]:
    """Output spatial dims and begin pads of ConvTranspose (pads None if not static).

    Natural size: s*(i-1) + output_padding + d*(k-1) + 1 - pad_begin - pad_end. With
    ``output_shape`` (or auto_pad SAME*, whose size is i*s) the total padding
    natural - out is split as the ONNX spec says: the odd unit goes to the end for
    SAME_UPPER and to the beginning otherwise (NOTSET and SAME_LOWER).
    """
    nd = len(in_sp)
    adj = tuple(a.output_padding) or (0,) * nd
    if len(adj) != nd:
        raise ValueError(f"output_padding {a.output_padding} must have {nd} values")
    if any(o >= max(s, dd) or o < 0 for o, s, dd in zip(adj, strides, dilations, strict=True)):
        raise ValueError(f"output_padding {adj} must be in [0, max(stride, dilation))")
    shape = tuple(a.output_shape)[-nd:] if a.output_shape else None
    if shape is not None and len(shape) != nd:
        raise ValueError(f"output_shape {a.output_shape} must have {nd} spatial values")
    if shape is None and a.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        shape = tuple(i * s if isinstance(i, int) else -1 for i, s in zip(in_sp, strides, strict=True))
    out: list[Dim] = []
    begins: list[int] | None = []
    for i in range(nd):
        size, st = in_sp[i], strides[i]
        eff = dilations[i] * (kernel[i] - 1) + 1 + adj[i]
        if shape is not None:
            if not isinstance(size, int):
                out.append(f"{st}*{size}" if shape[i] == -1 else shape[i])
                begins = None
                continue
            total = max(0, st * (size - 1) + eff - shape[i])
            head = total // 2 if a.auto_pad == "SAME_UPPER" else total - total // 2
            out.append(shape[i])
            if begins is not None:
                begins.append(head)
            continue
        pb, pe = (0, 0) if a.auto_pad == "VALID" else (pads[i], pads[i + nd])
        if isinstance(size, int):
            o = st * (size - 1) + eff - pb - pe
            if o < 1:
                raise ValueError(f"output size {o} < 1 along spatial axis {i}")
            out.append(o)
        else:
            off = eff - st - pb - pe
            out.append(f"{st}*{size}" + (f"{off:+d}" if off else ""))
        if begins is not None:
            begins.append(pb)
    return out, begins


def _infer_conv_transpose(ctx: InferContext) -> list[TensorType]:
    a: ConvTransposeAttrs = ctx.attrs
    x, w, kernel, s, d, p = _check_common(ctx, a)
    c, mg = w[0], w[1]
    if isinstance(x[1], int) and isinstance(c, int) and x[1] != c:
        raise ctx.fail(f"X has {x[1]} channels but W has {c} input channels")
    if isinstance(c, int) and c % a.group:
        raise ctx.fail(f"{c} input channels are not divisible by group {a.group}")
    m: Dim = mg * a.group if isinstance(mg, int) else mg
    _check_bias(ctx, m)
    try:
        out, _ = conv_transpose_geometry(a, x[2:], kernel, s, d, p)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return [TensorType(ctx.type(0).dtype, (x[0], m, *out))]


def _conv_transpose_ref(ins: list[np.ndarray | None], a: ConvTransposeAttrs, n: int) -> list[np.ndarray]:
    x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    assert x is not None and w is not None
    kernel = w.shape[2:]
    s, d, p = window_params(x.ndim - 2, kernel, a.strides, a.dilations, a.pads)
    out, begins = conv_transpose_geometry(a, x.shape[2:], kernel, s, d, p)
    assert begins is not None
    return [conv_transpose_nd(x, w, b, a.group, s, d, begins, [int(o) for o in out])]


register(
    OpDef(
        "Conv",
        _infer_conv,
        _conv_ref,
        ConvAttrs,
        inputs=(2, 3),
        layout=Layout.SPATIAL,
        quant=QuantPolicy.WEIGHTED,
        qspec=QuantSpec(weight_axis=lambda attrs, rank: 0),
        doc="y[n,m,o] = b[m] + sum_{c,k} x_pad[n, g(m)*C/group + c, o*s + k*d] * W[m,c,k]",
    )
)
register(
    OpDef(
        "ConvTranspose",
        _infer_conv_transpose,
        _conv_transpose_ref,
        ConvTransposeAttrs,
        inputs=(2, 3),
        layout=Layout.SPATIAL,
        quant=QuantPolicy.WEIGHTED,
        qspec=QuantSpec(weight_axis=lambda attrs, rank: 1),
        doc="y[n, g*M/group + m, i*s + k*d - pad] += x[n, c, i] * W[c, m, k] (+ b); adjoint of Conv",
    )
)
