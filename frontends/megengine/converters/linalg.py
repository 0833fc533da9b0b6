"""MatrixMul and BatchedMatrixMul: C = op(A) @ op(B), op = transpose when transposeA/B is set.

A transposed constant operand (an fc weight, possibly int8 + DequantizeLinear)
is transposed in the stored array; other operands get a Transpose of their last
two axes. Only the DEFAULT format is imported (MK4/MK8 are packed layouts).
With quantized operands the product is MegEngine's int32 accumulator,
QuantizedS32 with scale s_a * s_b, unless the file declares another dtype.
"""

from __future__ import annotations

from compiler.ir.graph import Value
from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.dtypes import FLOAT32, MgeDType
from frontends.megengine.enums import enum_name
from frontends.megengine.layouts import relayout
from schemas.megengine.generated import params_generated as P

__all__: list[str] = []


def _transposed(ctx: OprContext, v: Value, rank: int) -> Value:
    if v.type.rank != rank:
        raise ctx.fail(f"expects rank-{rank} operands, {v.name!r} has type {v.type}")
    perm = (*range(rank - 2), rank - 1, rank - 2)
    return relayout(ctx, v, [("transpose", perm)])


def _matmul(ctx: OprContext, rank: int) -> list[Var | None]:
    ctx.need_inputs(2, 2)
    p = ctx.param(P.MatrixMul)
    fmt = enum_name(P.MatrixMulFormat, p.Format())
    if fmt != "DEFAULT":
        raise ctx.fail(f"format {fmt} is not supported")
    a, b = ctx.value(0), ctx.value(1)
    for v in (a, b):
        if v.type.rank != rank:
            raise ctx.fail(f"expects rank-{rank} operands, {v.name!r} has type {v.type}")
    if p.TransposeA():
        a = _transposed(ctx, a, rank)
    if p.TransposeB():
        b = _transposed(ctx, b, rank)
    y = ctx.emit1("MatMul", [a, b], final=True)
    da, db = ctx.dtype(0), ctx.dtype(1)
    if da.is_quantized and db.is_quantized and da.scale is not None and db.scale is not None:
        default = MgeDType("QuantizedS32", da.scale * db.scale)
    else:
        default = da if not da.is_quantized else FLOAT32
    return [Var(y, ctx.out_dtype(default))]


@converter("MatrixMul")
def matrix_mul(ctx: OprContext) -> list[Var | None]:
    """C[M, N] = op(A) @ op(B) for 2-D operands."""
    return _matmul(ctx, 2)


@converter("BatchedMatrixMul")
def batched_matrix_mul(ctx: OprContext) -> list[Var | None]:
    """C[B, M, N] = op(A[b]) @ op(B[b]) for 3-D operands."""
    return _matmul(ctx, 3)
