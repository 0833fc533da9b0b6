"""``kiln::WeightOnlyMatMul``: a matrix product whose weight is stored as block-quantized integers.

Inputs: A (float32, [..., K]), levels (int8 constant, [N, K]), scales (float32 or float16,
[N, n_blocks]), optional zero_points (int8, [N, n_blocks]) and optional bias (float32, [N]),
with n_blocks = ceil(K / block_size) (the last block may be shorter, as in onnxruntime's
MatMulNBits). The weight is one row per output column, blocks run along K::

    W[n, k]  = (levels[n, k] - zero_points[n, k // block_size]) * scales[n, k // block_size]
    Y[..., n] = sum_k A[..., k] * W[n, k] + bias[n]

i.e. Y = A @ Wᵀ + bias. The integer levels are signed and hold ``bits`` (4 or 8) bits:
levels, zero_points ∈ [-2^(bits-1), 2^(bits-1) - 1]; without zero_points the grid is
symmetric (zero point 0). W is computed in float32 (the difference of two integers is exact,
one rounding for the product with the widened scale), so an fp16 scale means exactly the
weights it stands for. The op stays float under int8 quantization (its weights already are).

Backends: ``expand`` writes onnxruntime's ``com.microsoft::MatMulNBits`` (levels and zero points
shifted by 2^(bits-1) to unsigned and packed, scales widened to A's float32);
:func:`dequantize_levels` gives W for backends without a native form (the
``weight-only-dequantize`` decomposition), and MNN writes the levels and scales as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType, TensorType
from compiler.ops.fused import KILN
from compiler.ops.linalg import matmul_shape
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, register

__all__ = [
    "WeightOnlyMatMulAttrs",
    "WEIGHT_ONLY_BITS",
    "SCALE_DTYPES",
    "block_count",
    "level_range",
    "dequantize_levels",
    "weight_only_matmul",
    "check_levels",
    "check_grid",
    "check_block_tables",
]

WEIGHT_ONLY_BITS = (4, 8)
SCALE_DTYPES = (DType.FLOAT32, DType.FLOAT16)


@dataclass(frozen=True)
class WeightOnlyMatMulAttrs:
    """``bits`` of each integer level (4 or 8) and ``block_size`` (a power of two >= 16, as in
    onnxruntime), the weights of one row per scale."""

    bits: int = 4
    block_size: int = 32


def block_count(k: int, block_size: int) -> int:
    """n_blocks = ceil(K / block_size)."""
    return -(-int(k) // int(block_size))


def level_range(bits: int) -> tuple[int, int]:
    """The signed range [-2^(bits-1), 2^(bits-1) - 1] of levels and zero points."""
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _per_weight(x: np.ndarray, k: int, block_size: int) -> np.ndarray:
    """A per-block array [N, n_blocks] repeated to one entry per weight [N, K]."""
    return np.repeat(x, block_size, axis=1)[:, :k]


def dequantize_levels(
    levels: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    block_size: int,
    dtype: np.dtype | type = np.float32,
) -> np.ndarray:
    """W [N, K] = (levels - zero_points) * scales per block, in ``dtype`` (float32, or float64)."""
    q = np.asarray(levels).astype(np.int32)
    k = q.shape[1]
    if zero_points is not None:
        q = q - _per_weight(np.asarray(zero_points).astype(np.int32), k, block_size)
    s = _per_weight(np.asarray(scales).astype(np.result_type(scales, np.float32)), k, block_size)
    wdt = np.result_type(dtype, np.float32)
    return np.asarray(q.astype(wdt) * s.astype(wdt))


def weight_only_matmul(
    a: np.ndarray,
    levels: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    bias: np.ndarray | None,
    block_size: int,
) -> np.ndarray:
    """Y = A @ dequantize_levels(...)ᵀ + bias, in A's float type (float32, or float64)."""
    dt = np.result_type(a.dtype, np.float32)
    w = dequantize_levels(levels, scales, zero_points, block_size, dt)
    y = np.matmul(a.astype(dt), w.T)
    if bias is not None:
        y = y + bias.astype(dt)
    return np.asarray(y, dt)


def check_levels(ctx: InferContext, port: int, what: str, bits: int) -> None:
    """Constant levels / zero points must lie in the signed ``bits`` range."""
    c = ctx.const(port)
    lo, hi = level_range(bits)
    if c is not None and c.size and (int(c.min()) < lo or int(c.max()) > hi):
        raise ctx.fail(
            f"{what} must lie in [{lo}, {hi}] for {bits} bits, got [{int(c.min())}, {int(c.max())}]"
        )


def check_grid(ctx: InferContext, bits: int, block_size: int) -> None:
    """``bits`` is 4 or 8 and ``block_size`` a power of two >= 16."""
    if bits not in WEIGHT_ONLY_BITS:
        raise ctx.fail(f"bits must be 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ctx.fail(f"block_size must be a power of two >= 16, got {block_size}")


def check_block_tables(
    ctx: InferContext, levels: int, bits: int, block_size: int, rows: str
) -> tuple[int, int]:
    """The static int8 ``levels`` [R, C] (at port ``levels``), its scales [R, n_blocks] (port 2)
    and optional zero points (port 3) agree; returns (R, C). ``rows`` names R in messages."""
    tq, ts = ctx.type(levels), ctx.type(2)
    if tq.dtype != DType.INT8 or tq.rank != 2 or not tq.is_static:
        raise ctx.fail(f"levels must be a static 2-D int8 table [{rows}, K], got {tq}")
    if ts.dtype not in SCALE_DTYPES:
        raise ctx.fail(f"scales must be float32 or float16, got {ts.dtype.short}")
    r, c = ctx.shape(levels)
    assert isinstance(r, int) and isinstance(c, int)
    blocks = (r, block_count(c, block_size))
    if ctx.shape(2) != blocks:
        raise ctx.fail(f"scales must be [{rows}, n_blocks] = {list(blocks)}, got {ts.shape}")
    check_levels(ctx, levels, "levels", bits)
    if ctx.has(3):
        tz = ctx.type(3)
        if tz.dtype != DType.INT8 or tz.shape != blocks:
            raise ctx.fail(f"zero_points must be int8 {list(blocks)}, got {tz}")
        check_levels(ctx, 3, "zero_points", bits)
    return r, c


def _infer(ctx: InferContext) -> list[TensorType]:
    a: WeightOnlyMatMulAttrs = ctx.attrs
    check_grid(ctx, a.bits, a.block_size)
    ta = ctx.type(0)
    if ta.dtype != DType.FLOAT32:
        raise ctx.fail(f"A must be float32, got {ta.dtype.short}")
    n, k = check_block_tables(ctx, 1, a.bits, a.block_size, "N")
    if ctx.has(4):
        tb = ctx.type(4)
        if tb.dtype != DType.FLOAT32 or tb.shape != (n,):
            raise ctx.fail(f"bias must be float32 [{n}], got {tb}")
    if ta.shape is None:
        return [TensorType(ta.dtype, None)]
    if len(ta.shape) < 2:
        raise ctx.fail(f"A must have rank >= 2, got {ta.shape}")
    try:
        return [TensorType(ta.dtype, matmul_shape(ta.shape, (k, n), ctx.where))]
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None


def _reference(ins: list[np.ndarray | None], a: WeightOnlyMatMulAttrs, n: int) -> list[np.ndarray]:
    x, q, s = ins[0], ins[1], ins[2]
    assert x is not None and q is not None and s is not None
    z = ins[3] if len(ins) > 3 else None
    b = ins[4] if len(ins) > 4 else None
    return [weight_only_matmul(x, q, s, z, b, a.block_size)]


def _expand(g: Graph, node: Node) -> list[Value]:
    """com.microsoft::MatMulNBits(A, B packed, scales (float32), zero_points packed, bias)."""
    from compiler.ops.matmul_nbits import ORT_DOMAIN, pack_levels, pack_zero_points

    a: WeightOnlyMatMulAttrs = node.attrs
    ins = g.inputs_of(node)
    base = node.name or node.output_names[0]
    x, q, s = ins[0], ins[1], ins[2]
    assert x is not None and q is not None and s is not None
    z = ins[3] if len(ins) > 3 else None
    b = ins[4] if len(ins) > 4 else None
    if q.const is None or s.const is None or (z is not None and z.const is None):
        raise ValueError(f"{node.describe()}: levels, scales and zero points must be constants to export")
    n, k = q.const.shape
    half = 1 << (a.bits - 1)
    zu = None if z is None or z.const is None else z.const.astype(np.int32) + half
    packed = pack_levels(q.const.astype(np.int32) + half, a.bits, a.block_size, zu)
    operands: list[Value | None] = [
        x,
        g.add_constant(packed, f"{base}_B"),
        g.add_constant(s.const.astype(np.float32).reshape(-1), f"{base}_scales"),
        None if zu is None else g.add_constant(pack_zero_points(zu, a.bits), f"{base}_zero_points"),
        None,
        b,
    ]
    while operands[-1] is None:
        operands.pop()
    attrs = {"K": k, "N": n, "bits": a.bits, "block_size": a.block_size}
    y = g.add_node("MatMulNBits", operands, attrs, domain=ORT_DOMAIN, name=f"{base}_nbits")
    return [g.value(y)]


register(
    OpDef(
        "WeightOnlyMatMul",
        _infer,
        _reference,
        WeightOnlyMatMulAttrs,
        domain=KILN,
        inputs=(3, 5),
        layout=Layout.FIXED,
        quant=QuantPolicy.NONE,
        expand=_expand,
        doc="Y = A @ Wᵀ + bias, W[n, k] = (levels[n, k] - zero_points[n, k // bs]) * scales[n, k // bs]",
    )
)
