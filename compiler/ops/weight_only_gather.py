"""``kiln::WeightOnlyGather`` (a row lookup in a block-quantized table) and its ONNX form, onnxruntime's
``com.microsoft::GatherBlockQuantized``.

kiln::WeightOnlyGather(levels, indices, scales[, zero_points]) reads a table T [V, D] stored as
int8 levels [V, D] (``bits`` 4 or 8, signed), scales [V, n_blocks] (float32 or float16) and
optional int8 zero points [V, n_blocks], n_blocks = ceil(D / block_size), blocks along D::

    T[v, d] = (levels[v, d] - zero_points[v, d // bs]) · scales[v, d // bs]
    Y[i.., d] = T[indices[i..], d]                       (Gather(T, indices, axis=0))

T is computed in float32 exactly as :func:`compiler.ops.weight_only.dequantize_levels` does (one
rounding, the product with the widened scale), so Y holds exactly the table's values. Indices
follow Gather: int32/int64 in [-V, V - 1], negative ones counted from the end.

GatherBlockQuantized(data, indices, scales[, zero_points]; gather_axis, quantize_axis, block_size,
bits), for uint8 data (the form Kiln writes and reads: a 2-D table, gather_axis 0, quantize_axis 1):
unsigned levels u ∈ [0, 2^bits - 1] (for 4 bits two per byte along D, the earlier one in the low
nibble: data [V, D / 2]), zero points packed the same way along n_blocks ([V, ceil(n_blocks / 2)]
for 4 bits; default 2^(bits-1)), scales of the output's type (float32 when Kiln writes it: fp16
scales are widened, exactly)::

    Y[i.., d] = (u[idx, d] - z[idx, d // bs]) · scales[idx, d // bs],   idx = indices[i..]

The expansion writes levels + 2^(bits-1) and zero points + 2^(bits-1). (onnxruntime returns zeros
for an index out of range where Gather fails; Kiln's references follow Gather.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType, TensorType
from compiler.ops.fused import KILN
from compiler.ops.matmul_nbits import ORT_DOMAIN, pack_zero_points, unpack_zero_points
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, register
from compiler.ops.weight_only import block_count, check_block_tables, check_grid, dequantize_levels

__all__ = [
    "WeightOnlyGatherAttrs",
    "GatherBlockQuantizedAttrs",
    "weight_only_gather",
    "pack_table",
    "unpack_table",
]

_INDEX_DTYPES = (DType.INT32, DType.INT64)


@dataclass(frozen=True)
class WeightOnlyGatherAttrs:
    """``bits`` of each level (4 or 8) and ``block_size`` (a power of two >= 16) along D."""

    bits: int = 4
    block_size: int = 32


@dataclass(frozen=True)
class GatherBlockQuantizedAttrs:
    """GatherBlockQuantized attributes, with onnxruntime's defaults."""

    gather_axis: int = 0
    quantize_axis: int = 1
    block_size: int = 128
    bits: int = 4


def pack_table(u: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned levels (or zero points) [V, C] packed along C: uint8 [V, C] (8 bits) or [V, ceil(C / 2)]."""
    u = np.asarray(u)
    return pack_zero_points(u, bits).reshape(u.shape[0], -1)


def unpack_table(packed: np.ndarray, columns: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_table`: [V, columns] int32."""
    p = np.asarray(packed)
    return unpack_zero_points(p, p.shape[0], columns, bits)


def _take(table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Gather's rows: indices in [-V, V - 1] (IndexError otherwise), negatives from the end."""
    v = table.shape[0]
    idx = np.asarray(indices).astype(np.int64)
    if idx.size and (idx.min() < -v or idx.max() >= v):
        raise IndexError(f"indices out of range [-{v}, {v - 1}]")
    return np.take(table, np.where(idx < 0, idx + v, idx), axis=0)


def weight_only_gather(
    levels: np.ndarray,
    indices: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    block_size: int,
) -> np.ndarray:
    """Y = Gather(dequantize_levels(levels, scales, zero_points), indices, axis=0) in float32."""
    return _take(dequantize_levels(levels, scales, zero_points, block_size), indices)


def _check_grid(ctx: InferContext, bits: int, block_size: int) -> None:
    check_grid(ctx, bits, block_size)
    if ctx.type(1).dtype not in _INDEX_DTYPES:
        raise ctx.fail(f"indices must be int32 or int64, got {ctx.type(1).dtype.short}")


def _out(ctx: InferContext, d: int) -> list[TensorType]:
    ti = ctx.type(1)
    return [TensorType(DType.FLOAT32, None if ti.shape is None else (*ti.shape, d))]


def _infer(ctx: InferContext) -> list[TensorType]:
    a: WeightOnlyGatherAttrs = ctx.attrs
    _check_grid(ctx, a.bits, a.block_size)
    _, d = check_block_tables(ctx, 0, a.bits, a.block_size, "V")
    return _out(ctx, d)


def _reference(ins: list[np.ndarray | None], a: WeightOnlyGatherAttrs, n: int) -> list[np.ndarray]:
    q, idx, s = ins[0], ins[1], ins[2]
    assert q is not None and idx is not None and s is not None
    z = ins[3] if len(ins) > 3 else None
    return [weight_only_gather(q, idx, s, z, a.block_size)]


def _expand(g: Graph, node: Node) -> list[Value]:
    """com.microsoft::GatherBlockQuantized(data packed uint8, indices, scales float32, zero_points)."""
    a: WeightOnlyGatherAttrs = node.attrs
    q, idx, s = g.inputs_of(node)[:3]
    z = g.inputs_of(node)[3] if len(g.inputs_of(node)) > 3 else None
    assert q is not None and idx is not None and s is not None
    if q.const is None or s.const is None or (z is not None and z.const is None):
        raise ValueError(f"{node.describe()}: levels, scales and zero points must be constants to export")
    if a.bits == 4 and q.const.shape[1] % 2:
        raise ValueError(f"{node.describe()}: 4-bit GatherBlockQuantized packs D = {q.const.shape[1]} (odd)")
    base = node.name or node.output_names[0]
    half = 1 << (a.bits - 1)
    operands: list[Value | None] = [
        g.add_constant(pack_table(q.const.astype(np.int32) + half, a.bits), f"{base}_data"),
        idx,
        g.add_constant(s.const.astype(np.float32), f"{base}_scales"),
        None
        if z is None or z.const is None
        else g.add_constant(pack_table(z.const.astype(np.int32) + half, a.bits), f"{base}_zero_points"),
    ]
    if operands[-1] is None:
        operands.pop()
    attrs = GatherBlockQuantizedAttrs(gather_axis=0, quantize_axis=1, block_size=a.block_size, bits=a.bits)
    y = g.add_node("GatherBlockQuantized", operands, attrs, domain=ORT_DOMAIN, name=f"{base}_gbq")
    return [g.value(y)]


def _infer_gbq(ctx: InferContext) -> list[TensorType]:
    a: GatherBlockQuantizedAttrs = ctx.attrs
    _check_grid(ctx, a.bits, a.block_size)
    tdata, ts = ctx.type(0), ctx.type(2)
    if tdata.dtype != DType.UINT8 or tdata.rank != 2 or not tdata.is_static:
        raise ctx.fail(f"Kiln reads uint8 2-D data, got {tdata}")
    if (a.gather_axis, a.quantize_axis) not in ((0, 1), (0, -1), (-2, 1), (-2, -1)):
        raise ctx.fail(f"Kiln reads gather_axis 0, quantize_axis 1, got {a.gather_axis}, {a.quantize_axis}")
    if ts.dtype != DType.FLOAT32:
        raise ctx.fail(f"Kiln reads float32 scales (the output type), got {ts.dtype.short}")
    v, cols = ctx.shape(0)
    assert isinstance(v, int) and isinstance(cols, int)
    d = cols * 8 // a.bits
    blocks = (v, block_count(d, a.block_size))
    if ctx.shape(2) != blocks:
        raise ctx.fail(f"scales must be {list(blocks)}, got {ts.shape}")
    if ctx.has(3):
        tz = ctx.type(3)
        packed = (v, -(-blocks[1] * a.bits // 8))
        if tz.dtype != DType.UINT8 or tz.shape != packed:
            raise ctx.fail(f"zero_points must be uint8 {list(packed)}, got {tz}")
    return _out(ctx, d)


def _reference_gbq(ins: list[np.ndarray | None], a: GatherBlockQuantizedAttrs, n: int) -> list[np.ndarray]:
    data, idx, s = ins[0], ins[1], ins[2]
    assert data is not None and idx is not None and s is not None
    d = data.shape[1] * 8 // a.bits
    half = 1 << (a.bits - 1)
    zp = ins[3] if len(ins) > 3 else None
    z = None if zp is None else unpack_table(zp, s.shape[1], a.bits) - half
    return [weight_only_gather(unpack_table(data, d, a.bits) - half, idx, s, z, a.block_size)]


register(
    OpDef(
        "WeightOnlyGather",
        _infer,
        _reference,
        WeightOnlyGatherAttrs,
        domain=KILN,
        inputs=(3, 4),
        layout=Layout.FIXED,
        quant=QuantPolicy.NONE,
        expand=_expand,
        doc="Y = Gather(T, indices, axis=0), T[v, d] = (levels[v, d] - z[v, d // bs]) * s[v, d // bs]",
    )
)
register(
    OpDef(
        "GatherBlockQuantized",
        _infer_gbq,
        _reference_gbq,
        GatherBlockQuantizedAttrs,
        domain=ORT_DOMAIN,
        inputs=(3, 4),
        layout=Layout.FIXED,
        quant=QuantPolicy.NONE,
        doc="Y = Gather(T, indices, axis=0), T[v, d] = (u[v, d] - z[v, d // bs]) * s[v, d // bs], u unpacked",
    )
)
