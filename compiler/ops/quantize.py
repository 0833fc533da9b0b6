"""QuantizeLinear and DequantizeLinear (opset-21 form).

QuantizeLinear: y = saturate(round_half_even(x / y_scale) + y_zero_point).
DequantizeLinear: y = (x - x_zero_point) * x_scale.

Scale and zero point are per tensor (scalar or shape (1,)), per axis (1-D of length
x.shape[axis]) or blocked (``block_size`` > 0: same rank as x, with
ceil(x.shape[axis] / block_size) entries along ``axis``). The quantized dtype is
``output_dtype`` if set, else the zero point's dtype, else uint8. Like ONNX Runtime,
the division and multiplication happen in float32 (bit-exact for float32 inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Dim, DType, TensorType
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, register
from compiler.ops.shapes import normalize_axis

__all__ = ["QuantizeLinearAttrs", "DequantizeLinearAttrs", "expand_qparam", "QUANT_DTYPES"]

QUANT_DTYPES = (DType.UINT8, DType.INT8, DType.UINT16, DType.INT16)
_DEQUANT_DTYPES = (*QUANT_DTYPES, DType.INT32)


@dataclass(frozen=True)
class QuantizeLinearAttrs:
    """QuantizeLinear attributes; ``output_dtype`` 0 means "from the zero point"."""

    axis: int = 1
    block_size: int = 0
    output_dtype: int = 0
    saturate: int = 1


@dataclass(frozen=True)
class DequantizeLinearAttrs:
    """DequantizeLinear attributes."""

    axis: int = 1
    block_size: int = 0


def _per_tensor(s: tuple[Dim, ...]) -> bool:
    return len(s) == 0 or s == (1,)


def _check_qparams(ctx: InferContext, x: tuple[Dim, ...], axis: int, block_size: int) -> None:
    """Check scale (input 1) and zero point (input 2) shapes against x."""
    s = ctx.shape(1)
    if ctx.has(2) and ctx.shape(2) != s and not (_per_tensor(s) and _per_tensor(ctx.shape(2))):
        raise ctx.fail(f"zero point shape {ctx.shape(2)} != scale shape {s}")
    if block_size < 0:
        raise ctx.fail(f"block_size must be >= 0, got {block_size}")
    if block_size == 0 and _per_tensor(s):
        return
    try:
        ax = normalize_axis(axis, len(x), ctx.where)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    if block_size == 0:
        if len(s) != 1 or (isinstance(s[0], int) and isinstance(x[ax], int) and s[0] != x[ax]):
            raise ctx.fail(f"per-axis scale {s} must have x.shape[{ax}] = {x[ax]} entries")
        return
    if len(s) != len(x):
        raise ctx.fail(f"blocked scale {s} must have the rank of x {x}")
    for i, (sd, xd) in enumerate(zip(s, x, strict=True)):
        if not (isinstance(sd, int) and isinstance(xd, int)):
            continue
        want = -(-xd // block_size) if i == ax else xd
        if sd != want:
            raise ctx.fail(f"blocked scale {s} does not fit x {x} with block_size {block_size} on axis {ax}")


def expand_qparam(p: np.ndarray, x_shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point reshaped/repeated so that it broadcasts against x."""
    if block_size == 0 and p.size == 1 and p.ndim <= 1:
        return p.reshape(())
    ax = normalize_axis(axis, len(x_shape))
    if block_size:
        return np.take(np.repeat(p, block_size, axis=ax), np.arange(x_shape[ax]), axis=ax)
    return p.reshape((1,) * ax + (-1,) + (1,) * (len(x_shape) - ax - 1))


def _infer_quantize(ctx: InferContext) -> list[TensorType]:
    a: QuantizeLinearAttrs = ctx.attrs
    tx, ts = ctx.type(0), ctx.type(1)
    if not (tx.dtype.is_float or tx.dtype == DType.INT32) or not ts.dtype.is_float:
        raise ctx.fail(f"x must be float or int32 and scale float, got {tx.dtype.short}, {ts.dtype.short}")
    out = DType.UINT8
    if ctx.has(2):
        out = ctx.type(2).dtype
    if a.output_dtype:
        try:
            want = DType(a.output_dtype)
        except ValueError:
            raise ctx.fail(f"unsupported output_dtype {a.output_dtype}") from None
        if ctx.has(2) and want != out:
            raise ctx.fail(f"output_dtype {want.short} != zero point dtype {out.short}")
        out = want
    if out not in QUANT_DTYPES:
        raise ctx.fail(f"unsupported quantized dtype {out.short}")
    if tx.shape is None:
        return [TensorType(out, None)]
    _check_qparams(ctx, tx.shape, a.axis, a.block_size)
    return [TensorType(out, tx.shape)]


def _quantize_ref(ins: list[np.ndarray | None], a: QuantizeLinearAttrs, n: int) -> list[np.ndarray]:
    x, scale = ins[0], ins[1]
    zp = ins[2] if len(ins) > 2 else None
    assert x is not None and scale is not None
    out = np.dtype(zp.dtype) if zp is not None else DType(a.output_dtype or DType.UINT8).numpy
    s = expand_qparam(scale, x.shape, a.axis, a.block_size).astype(np.float32)
    q = np.rint(x.astype(np.float32) / s)
    if zp is not None:
        q = q + expand_qparam(zp, x.shape, a.axis, a.block_size).astype(np.float32)
    info = np.iinfo(out)
    return [np.clip(q, info.min, info.max).astype(out)]


def _infer_dequantize(ctx: InferContext) -> list[TensorType]:
    a: DequantizeLinearAttrs = ctx.attrs
    tx, ts = ctx.type(0), ctx.type(1)
    if tx.dtype not in _DEQUANT_DTYPES:
        raise ctx.fail(f"unsupported quantized dtype {tx.dtype.short}")
    if not ts.dtype.is_float:
        raise ctx.fail(f"scale must be float, got {ts.dtype.short}")
    if ctx.has(2) and ctx.type(2).dtype != tx.dtype:
        raise ctx.fail(f"zero point dtype {ctx.type(2).dtype.short} != x dtype {tx.dtype.short}")
    if tx.shape is None:
        return [TensorType(ts.dtype, None)]
    _check_qparams(ctx, tx.shape, a.axis, a.block_size)
    return [TensorType(ts.dtype, tx.shape)]


def _dequantize_ref(ins: list[np.ndarray | None], a: DequantizeLinearAttrs, n: int) -> list[np.ndarray]:
    x, scale = ins[0], ins[1]
    zp = ins[2] if len(ins) > 2 else None
    assert x is not None and scale is not None
    v = x.astype(np.int64)
    if zp is not None:
        v = v - expand_qparam(zp, x.shape, a.axis, a.block_size).astype(np.int64)
    s = expand_qparam(scale, x.shape, a.axis, a.block_size)
    y = v.astype(np.float32) * s.astype(np.float32)
    return [y.astype(scale.dtype)]


register(
    OpDef(
        "QuantizeLinear",
        _infer_quantize,
        _quantize_ref,
        QuantizeLinearAttrs,
        inputs=(2, 3),
        layout=Layout.FIXED,
        quant=QuantPolicy.NONE,
        doc="y = saturate(round_half_even(x / scale) + zero_point); per tensor, per axis or blocked",
    )
)
register(
    OpDef(
        "DequantizeLinear",
        _infer_dequantize,
        _dequantize_ref,
        DequantizeLinearAttrs,
        inputs=(2, 3),
        layout=Layout.FIXED,
        quant=QuantPolicy.NONE,
        doc="y = (x - zero_point) * scale; per tensor, per axis or blocked",
    )
)
