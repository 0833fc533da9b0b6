"""onnxruntime's ``com.microsoft`` MatMulNBits and GatherBlockQuantized lifted into Kiln's weight-only ops.

MatMulNBits(A, B, scales[, zero_points][, g_idx][, bias]; K, N, bits, block_size) with the unsigned
levels u unpacked from B and zero points z (packed uint8; default 2^(bits-1)) computes
Y = A @ Wᵀ + bias, W[n, k] = (u[n, k] - z[n, k // bs]) · s[n, k // bs], which is exactly

    kiln::WeightOnlyMatMul(A, u - 2^(bits-1), s [N, n_blocks], z - 2^(bits-1), bias)

(the zero points are dropped when every one is 2^(bits-1): the symmetric grid). The packed layout
is :mod:`compiler.ops.matmul_nbits`'s. ``accuracy_level`` is a compute hint of onnxruntime's (4
quantizes A to int8 there); Kiln computes in float32. Refused with the reason: bits other than
4 and 8, A other than float32, non-constant weights, scales or zero points, float zero points,
g_idx, prepacked weights.

GatherBlockQuantized(data uint8, indices, scales[, zero_points]) with a 2-D table, gather_axis 0 and
quantize_axis 1 is ``kiln::WeightOnlyGather(u - 2^(bits-1), indices, scales, z - 2^(bits-1))`` with
the packing of :mod:`compiler.ops.weight_only_gather`. Refused with the reason: other axes or ranks,
int4/uint4/float8 data, bits other than 4 and 8, non-constant data, scales or zero points.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from compiler.ops.fused import KILN
from compiler.ops.matmul_nbits import ORT_DOMAIN, unpack_levels, unpack_zero_points
from compiler.ops.weight_only_gather import unpack_table
from frontends.onnx.converter import NodeContext, converter

__all__: list[str] = []


@converter("MatMulNBits", since=1, domain=ORT_DOMAIN, needs=("kiln::WeightOnlyMatMul",))
def matmul_nbits(ctx: NodeContext) -> list[Value]:
    """MatMulNBits -> kiln::WeightOnlyMatMul with signed levels and zero points."""
    k, n = int(ctx.pop("K")), int(ctx.pop("N"))
    bits, block = int(ctx.pop("bits", 4)), int(ctx.pop("block_size"))
    ctx.pop("accuracy_level", 0)
    if int(ctx.pop("weight_prepacked", 0)):
        raise ctx.fail("prepacked (execution-provider specific) weights are not supported")
    if bits not in (4, 8):
        raise ctx.fail(f"bits={bits}: Kiln's weight-only op holds 4 or 8 bits")
    if ctx.input(4) is not None:
        raise ctx.fail("g_idx (act-order permuted blocks) is not supported")
    a = ctx.require(0)
    if a.type.dtype != DType.FLOAT32:
        raise ctx.fail(f"A is {a.type.dtype.short}; Kiln reads float32 MatMulNBits")
    b, s, zp = ctx.const(1), ctx.const(2), ctx.const(3)
    if b is None or s is None or (ctx.input(3) is not None and zp is None):
        raise ctx.fail("B, scales and zero_points must be constants")
    if zp is not None and zp.dtype != np.uint8:
        raise ctx.fail(f"zero_points of type {zp.dtype} are not supported (packed uint8 only)")
    nb = -(-k // block)
    half = 1 << (bits - 1)
    levels = unpack_levels(b.reshape(n, nb, -1), k, bits) - half
    scales = s.reshape(n, nb)
    z = None if zp is None else unpack_zero_points(zp, n, nb, bits) - half
    ins = [
        a,
        ctx.constant(levels.astype(np.int8), "levels"),
        ctx.constant(scales, "scales"),
        None if z is None or not z.any() else ctx.constant(z.astype(np.int8), "zero_points"),
        ctx.input(5),
    ]
    attrs = {"bits": bits, "block_size": block}
    return ctx.emit("WeightOnlyMatMul", ins, attrs, num_outputs=1, domain=KILN)


@converter("GatherBlockQuantized", since=1, domain=ORT_DOMAIN, needs=("kiln::WeightOnlyGather",))
def gather_block_quantized(ctx: NodeContext) -> list[Value]:
    """GatherBlockQuantized (uint8 2-D table) -> kiln::WeightOnlyGather with signed levels."""
    gather_axis, quantize_axis = int(ctx.pop("gather_axis", 0)), int(ctx.pop("quantize_axis", 1))
    bits, block = int(ctx.pop("bits", 4)), int(ctx.pop("block_size", 128))
    data, s, zp = ctx.const(0), ctx.const(2), ctx.const(3)
    if data is None or s is None or (ctx.input(3) is not None and zp is None):
        raise ctx.fail("data, scales and zero_points must be constants")
    if data.dtype != np.uint8 or data.ndim != 2:
        raise ctx.fail(f"data {data.dtype}{list(data.shape)}: Kiln reads a 2-D uint8 table")
    if gather_axis not in (0, -2) or quantize_axis not in (1, -1):
        raise ctx.fail(f"gather_axis {gather_axis}, quantize_axis {quantize_axis}: Kiln reads 0 and 1")
    if bits not in (4, 8):
        raise ctx.fail(f"bits={bits}: Kiln's weight-only ops hold 4 or 8 bits")
    if s.ndim != 2 or s.shape[0] != data.shape[0]:
        raise ctx.fail(f"scales {list(s.shape)} do not match the table {list(data.shape)}")
    half = 1 << (bits - 1)
    d = data.shape[1] * 8 // bits
    z = None if zp is None else unpack_table(zp, s.shape[1], bits) - half
    ins = [
        ctx.constant((unpack_table(data, d, bits) - half).astype(np.int8), "levels"),
        ctx.require(1),
        ctx.constant(s, "scales"),
        None if z is None or not z.any() else ctx.constant(z.astype(np.int8), "zero_points"),
    ]
    attrs = {"bits": bits, "block_size": block}
    return ctx.emit("WeightOnlyGather", ins, attrs, num_outputs=1, domain=KILN)
