"""onnxruntime's ``com.microsoft::MatMulNBits`` (contrib opset 1) and its packed weight layout.

This is the ONNX form of ``kiln::WeightOnlyMatMul`` (its ``expand``), registered so that the
exporter writes it as it is (onnxruntime runs it) and the interpreter can check the packing.
Inputs A (float32 [..., K]), B (uint8 [N, n_blocks, blob_size], blob_size = block_size · bits / 8),
scales (float32 [N · n_blocks] or [N, n_blocks]), optional zero_points (uint8, packed
[N · ceil(n_blocks · bits / 8)]), g_idx (refused) and bias (float32 [N]); n_blocks = ceil(K / block_size).
With unsigned levels u ∈ [0, 2^bits - 1] read from B and zero points z (default 2^(bits-1))::

    W[n, k] = (u[n, k] - z[n, k // block_size]) * scales[n, k // block_size],   Y = A @ Wᵀ + bias

Packing, along K within each block: for bits = 8 one level per byte; for bits = 4 two per byte,
the earlier one in the low nibble. Zero points pack the same way along n_blocks, each row padded
to whole bytes. The weights past K in the last block are padding (Kiln writes the zero point there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType, TensorType
from compiler.ops.linalg import matmul_shape
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, register

__all__ = [
    "ORT_DOMAIN",
    "RUNTIME_DOMAINS",
    "MatMulNBitsAttrs",
    "pack_levels",
    "unpack_levels",
    "pack_zero_points",
    "unpack_zero_points",
]

ORT_DOMAIN = "com.microsoft"
RUNTIME_DOMAINS = frozenset({ORT_DOMAIN})
"""Domains whose ops onnxruntime runs: the exporter writes them as they are (no expansion)."""

_PACKED_BITS = (4, 8)


@dataclass(frozen=True)
class MatMulNBitsAttrs:
    """MatMulNBits attributes (K, N and block_size are required by onnxruntime: 0 = unset)."""

    K: int = 0
    N: int = 0
    bits: int = 4
    block_size: int = 0
    accuracy_level: int = 0


def _pack_rows(u: np.ndarray, bits: int) -> np.ndarray:
    """Pack the last axis of unsigned ``bits``-wide values (even length for 4 bits) into bytes."""
    u = np.asarray(u).astype(np.uint8)
    if bits == 8:
        return u
    return np.asarray(u[..., 0::2] | (u[..., 1::2] << 4), np.uint8)


def _unpack_rows(packed: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`_pack_rows` (int32 values, twice as many for 4 bits)."""
    p = np.asarray(packed).astype(np.int32)
    if bits == 8:
        return p
    return np.stack([p & 0xF, p >> 4], axis=-1).reshape(*p.shape[:-1], -1)


def _check_bits(bits: int) -> None:
    if bits not in _PACKED_BITS:
        raise ValueError(f"MatMulNBits packing is implemented for 4 and 8 bits, got {bits}")


def pack_levels(u: np.ndarray, bits: int, block_size: int, pad: np.ndarray | None = None) -> np.ndarray:
    """B [N, n_blocks, blob_size] of unsigned levels ``u`` [N, K]; the last block is padded with
    ``pad`` [N, n_blocks] (the zero points; default 2^(bits-1)), so padding decodes to 0."""
    _check_bits(bits)
    u = np.asarray(u).astype(np.int32)
    n, k = u.shape
    nb = -(-k // block_size)
    full = np.empty((n, nb * block_size), np.int32)
    fill = np.full((n, nb), 1 << (bits - 1), np.int32) if pad is None else np.asarray(pad, np.int32)
    full[:] = np.repeat(fill, block_size, axis=1)
    full[:, :k] = u
    return _pack_rows(full.reshape(n, nb, block_size), bits)


def unpack_levels(b: np.ndarray, k: int, bits: int) -> np.ndarray:
    """The unsigned levels [N, K] (int32) of a packed B [N, n_blocks, blob_size]."""
    _check_bits(bits)
    levels = _unpack_rows(b, bits)
    return levels.reshape(levels.shape[0], -1)[:, :k]


def pack_zero_points(z: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned zero points [N, n_blocks] packed per row: uint8 [N · ceil(n_blocks · bits / 8)]."""
    _check_bits(bits)
    z = np.asarray(z).astype(np.int32)
    if bits == 4 and z.shape[1] % 2:
        z = np.concatenate([z, np.zeros((z.shape[0], 1), np.int32)], axis=1)
    return _pack_rows(z, bits).reshape(-1)


def unpack_zero_points(packed: np.ndarray, n: int, n_blocks: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_zero_points`: [N, n_blocks] int32."""
    _check_bits(bits)
    return _unpack_rows(np.asarray(packed).reshape(n, -1), bits)[:, :n_blocks]


def _infer(ctx: InferContext) -> list[TensorType]:
    a: MatMulNBitsAttrs = ctx.attrs
    if a.bits not in _PACKED_BITS or a.block_size < 16 or a.block_size & (a.block_size - 1):
        raise ctx.fail(f"bits {a.bits} / block_size {a.block_size}: Kiln reads 4 or 8 bits, blocks 2^k >= 16")
    ta, tb, ts = ctx.type(0), ctx.type(1), ctx.type(2)
    nb = -(-a.K // a.block_size)
    blob = a.block_size * a.bits // 8
    if ta.dtype != DType.FLOAT32 or ts.dtype != DType.FLOAT32:
        raise ctx.fail(f"A and scales must be float32, got {ta.dtype.short} and {ts.dtype.short}")
    if tb.dtype != DType.UINT8 or tb.shape != (a.N, nb, blob):
        raise ctx.fail(f"B must be uint8 {[a.N, nb, blob]}, got {tb}")
    if ts.shape not in ((a.N * nb,), (a.N, nb)):
        raise ctx.fail(f"scales must have {a.N * nb} values, got {ts.shape}")
    if ctx.has(3) and ctx.type(3).dtype != DType.UINT8:
        raise ctx.fail("zero_points other than packed uint8 are not supported")
    if ctx.has(4):
        raise ctx.fail("g_idx is not supported")
    if ctx.has(5) and ctx.type(5).shape != (a.N,):
        raise ctx.fail(f"bias must be [{a.N}], got {ctx.type(5)}")
    if ta.shape is None:
        return [TensorType(ta.dtype, None)]
    try:
        return [TensorType(ta.dtype, matmul_shape(ta.shape, (a.K, a.N), ctx.where))]
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None


def _reference(ins: list[np.ndarray | None], a: MatMulNBitsAttrs, n: int) -> list[np.ndarray]:
    from compiler.ops.weight_only import weight_only_matmul

    x, b, s = ins[0], ins[1], ins[2]
    assert x is not None and b is not None and s is not None
    nb = -(-a.K // a.block_size)
    half = 1 << (a.bits - 1)
    zp = ins[3] if len(ins) > 3 else None
    z = np.full((a.N, nb), half) if zp is None else unpack_zero_points(zp, a.N, nb, a.bits)
    u = unpack_levels(b, a.K, a.bits)
    bias = ins[5] if len(ins) > 5 else None
    return [weight_only_matmul(x, u - half, s.reshape(a.N, nb), z - half, bias, a.block_size)]


register(
    OpDef(
        "MatMulNBits",
        _infer,
        _reference,
        MatMulNBitsAttrs,
        domain=ORT_DOMAIN,
        inputs=(3, 6),
        layout=Layout.FIXED,
        quant=QuantPolicy.NONE,
        doc="Y = A @ Wᵀ + bias, W[n, k] = (u[n, k] - z[n, k // bs]) * scales[n, k // bs], u unpacked from B",
    )
)
