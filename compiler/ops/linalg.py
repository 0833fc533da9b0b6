"""Linear algebra: MatMul (numpy matmul semantics), Gemm and Det.

MatMul: y[..., i, j] = sum_k a[..., i, k] * b[..., k, j], batch dims broadcast; a 1-D
``a`` is treated as (1, K) and a 1-D ``b`` as (K, 1), and that dim is dropped again.
Gemm: y = alpha * A' @ B' + beta * C, A' = A^T if transA, B' = B^T if transB, C
broadcast unidirectionally to (M, N).
Det: y[...] = det(x[..., :, :]) of square float matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Dim, DType, TensorType
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, QuantSpec, register
from compiler.ops.shapes import broadcast

__all__ = ["GemmAttrs", "matmul_shape"]

_NUMERIC = (
    DType.FLOAT32,
    DType.FLOAT16,
    DType.FLOAT64,
    DType.BFLOAT16,
    DType.INT32,
    DType.INT64,
    DType.UINT32,
    DType.UINT64,
)


@dataclass(frozen=True)
class GemmAttrs:
    """Gemm attributes."""

    alpha: float = 1.0
    beta: float = 1.0
    transA: int = 0  # ONNX attribute names are camelCase
    transB: int = 0


def _same_dim(a: Dim, b: Dim) -> bool:
    """False only when both dims are known and differ."""
    return not (isinstance(a, int) and isinstance(b, int) and a != b)


def matmul_shape(a: tuple[Dim, ...], b: tuple[Dim, ...], where: str = "") -> tuple[Dim, ...]:
    """Output shape of numpy ``matmul(a, b)``; raises ``ValueError`` on a mismatch."""
    if not a or not b:
        raise ValueError(f"{where}: MatMul operands must have rank >= 1, got {a} and {b}")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if not _same_dim(a2[-1], b2[-2]):
        raise ValueError(f"{where}: inner dims differ: {a} @ {b}")
    batch = broadcast([a2[:-2], b2[:-2]], where)
    out = (*batch, *(a2[-2:-1] if len(a) > 1 else ()), *(b2[-1:] if len(b) > 1 else ()))
    return tuple(out)


def _infer_matmul(ctx: InferContext) -> list[TensorType]:
    ta, tb = ctx.type(0), ctx.type(1)
    if ta.dtype != tb.dtype or ta.dtype not in _NUMERIC:
        raise ctx.fail(f"operands must share a numeric dtype, got {ta.dtype.short} and {tb.dtype.short}")
    if ta.shape is None or tb.shape is None:
        return [TensorType(ta.dtype, None)]
    try:
        return [TensorType(ta.dtype, matmul_shape(ta.shape, tb.shape, ctx.where))]
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None


def _matmul_ref(ins: list[np.ndarray | None], a: object, n: int) -> list[np.ndarray]:
    x, y = ins[0], ins[1]
    assert x is not None and y is not None
    if x.dtype == np.float16:
        return [np.matmul(x.astype(np.float32), y.astype(np.float32)).astype(x.dtype)]
    return [np.asarray(np.matmul(x, y))]


def _infer_gemm(ctx: InferContext) -> list[TensorType]:
    g: GemmAttrs = ctx.attrs
    ta, tb = ctx.type(0), ctx.type(1)
    if ta.dtype != tb.dtype or ta.dtype not in _NUMERIC:
        raise ctx.fail(f"A and B must share a numeric dtype, got {ta.dtype.short} and {tb.dtype.short}")
    a, b = ctx.shape(0), ctx.shape(1)
    if len(a) != 2 or len(b) != 2:
        raise ctx.fail(f"A and B must be 2-D, got {a} and {b}")
    m, ka = (a[1], a[0]) if g.transA else (a[0], a[1])
    kb, nn = (b[1], b[0]) if g.transB else (b[0], b[1])
    if not _same_dim(ka, kb):
        raise ctx.fail(f"inner dims differ: A' is ({m}, {ka}), B' is ({kb}, {nn})")
    if ctx.has(2):
        if ctx.type(2).dtype != ta.dtype:
            raise ctx.fail(f"C dtype {ctx.type(2).dtype.short} != A dtype {ta.dtype.short}")
        c = ctx.shape(2)
        target = (m, nn)[2 - len(c) :] if len(c) <= 2 else ()
        if len(c) > 2 or not all(d == 1 or _same_dim(d, t) for d, t in zip(c, target, strict=True)):
            raise ctx.fail(f"C {c} does not broadcast to ({m}, {nn})")
    return [TensorType(ta.dtype, (m, nn))]


def _gemm_ref(ins: list[np.ndarray | None], g: GemmAttrs, n: int) -> list[np.ndarray]:
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    assert a is not None and b is not None
    dt = a.dtype
    acc = np.promote_types(dt, np.float32) if dt.kind == "f" else dt
    am = a.T if g.transA else a
    bm = b.T if g.transB else b
    y = np.matmul(am.astype(acc, copy=False), bm.astype(acc, copy=False))
    if g.alpha != 1.0:
        y = y * np.asarray(g.alpha, dtype=acc)
    if c is not None and g.beta != 0.0:
        cc = c.astype(acc, copy=False)
        y = y + (cc if g.beta == 1.0 else cc * np.asarray(g.beta, dtype=acc))
    return [np.asarray(y).astype(dt, copy=False)]


register(
    OpDef(
        "MatMul",
        _infer_matmul,
        _matmul_ref,
        inputs=(2, 2),
        layout=Layout.FIXED,
        quant=QuantPolicy.WEIGHTED,
        qspec=QuantSpec(weight_axis=lambda attrs, rank: rank - 1, bias=None),
        doc="y = a @ b (numpy matmul: 1-D promotion, broadcast batch dims)",
    )
)
register(
    OpDef(
        "Gemm",
        _infer_gemm,
        _gemm_ref,
        GemmAttrs,
        inputs=(2, 3),
        layout=Layout.FIXED,
        quant=QuantPolicy.WEIGHTED,
        qspec=QuantSpec(weight_axis=lambda attrs, rank: 0 if attrs.transB else 1),
        doc="y = alpha * op(A) @ op(B) + beta * C (C broadcasts to (M, N))",
    )
)


def _infer_det(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if not t.dtype.is_float:
        raise ctx.fail(f"input must be float, got {t.dtype.short}")
    if t.shape is None:
        return [TensorType(t.dtype, None)]
    if len(t.shape) < 2 or not _same_dim(t.shape[-1], t.shape[-2]):
        raise ctx.fail(f"input must hold square matrices, got shape {t.shape}")
    return [TensorType(t.dtype, t.shape[:-2])]


def _det_ref(ins: list[np.ndarray | None], a: object, n: int) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    return [np.asarray(np.linalg.det(x.astype(np.float64))).astype(x.dtype)]


register(
    OpDef(
        "Det",
        _infer_det,
        _det_ref,
        layout=Layout.FIXED,
        doc="y[...] = det(x[..., :, :]) (square matrices)",
    )
)

