"""``kiln::QGemm``: a matrix product on integer data with a float epilogue (one QDQ Gemm/MatMul region).

Inputs: x_q (uint8/int8, [..., K]), w_q (int8 constant, [K, N], or [N, K] with ``trans_b``)
and an optional bias_q (int32 [N]). For output column ``n``, with W = w_q (or w_q^T)::

    acc  = sum_k (x_q[..., k] - x_zero) * W[k, n] + bias_q[n]          (int32)
    y    = float32(acc) * m[n],  m = qconv_multiplier(x_scale, w_scales)  (out_dtype float32)
    y    = clip(round_half_even(float64(acc) * M[n]) + y_zero, qmin, qmax)  (uint8/int8)
           M = qconv_requant_multiplier(x_scale, w_scales, y_scale)

which is kiln::QConv's arithmetic (:mod:`compiler.ops.qconv`, activation none) with the columns
as output channels. It is exactly DequantizeLinear -> Gemm/MatMul -> QuantizeLinear up to float
rounding, and expands back into those ops (a Gemm when there is a bias or ``trans_b``, else a
MatMul; bias scale = m per column) so that ONNX can hold it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType, TensorType
from compiler.ops.fused import KILN
from compiler.ops.linalg import GemmAttrs, matmul_shape
from compiler.ops.qconv import (
    QCONV_OUT_DTYPES,
    add_dequantize,
    add_output_quantize,
    linear_requantize,
    qconv_multiplier,
    qconv_requant_multiplier,
    scale_array,
)
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, register

__all__ = ["QGemmAttrs", "qgemm_accumulate"]

_INT8_DTYPES = (DType.UINT8, DType.INT8)
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class QGemmAttrs:
    """The layout of the weight and the quantization parameters of every operand.

    ``w_scales`` holds one scale per output column (N), or a single per-tensor scale.
    """

    trans_b: int = 0
    x_scale: float = 1.0
    x_zero: int = 0
    w_scales: tuple[float, ...] = (1.0,)
    y_scale: float = 1.0
    y_zero: int = 0
    out_dtype: str = "float32"


def qgemm_accumulate(
    x_q: np.ndarray, w_q: np.ndarray, bias_q: np.ndarray | None, a: QGemmAttrs
) -> np.ndarray:
    """acc = (x_q - x_zero) @ W + bias_q as int64 (exact: the float64 sums stay below 2^53)."""
    w = w_q.T if a.trans_b else w_q
    xc = x_q.astype(np.float64) - np.float64(a.x_zero)
    acc = np.rint(np.matmul(xc, w.astype(np.float64))).astype(np.int64)
    return acc if bias_q is None else acc + bias_q.astype(np.int64)


def _infer(ctx: InferContext) -> list[TensorType]:
    a: QGemmAttrs = ctx.attrs
    if a.out_dtype not in QCONV_OUT_DTYPES:
        raise ctx.fail(f"out_dtype must be one of {', '.join(QCONV_OUT_DTYPES)}, got {a.out_dtype!r}")
    tx, tw = ctx.type(0), ctx.type(1)
    if tx.dtype not in _INT8_DTYPES or tw.dtype != DType.INT8:
        raise ctx.fail(f"x must be uint8/int8 and w int8, got {tx.dtype.short} and {tw.dtype.short}")
    if tw.rank != 2 or (tx.rank is not None and tx.rank < 2):
        raise ctx.fail(f"x must have rank >= 2 and w rank 2, got {tx.shape} and {tw.shape}")
    w_shape = tw.shape
    assert w_shape is not None
    k, n = (w_shape[1], w_shape[0]) if a.trans_b else (w_shape[0], w_shape[1])
    if not a.w_scales or (len(a.w_scales) != 1 and isinstance(n, int) and len(a.w_scales) != n):
        raise ctx.fail(f"w_scales has {len(a.w_scales)} entries for {n} output columns")
    if ctx.has(2):
        tb = ctx.type(2)
        if tb.dtype != DType.INT32 or tb.shape is None or len(tb.shape) != 1 or tb.shape[0] != n:
            raise ctx.fail(f"bias must be int32 of shape ({n},), got {tb}")
    out = QCONV_OUT_DTYPES[a.out_dtype]
    if tx.shape is None:
        return [TensorType(out, None)]
    try:
        return [TensorType(out, matmul_shape(tx.shape, (k, n), ctx.where))]
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None


def _reference(ins: list[np.ndarray | None], a: QGemmAttrs, n: int) -> list[np.ndarray]:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    acc = qgemm_accumulate(x, w, ins[2] if len(ins) > 2 else None, a)
    if acc.size and (acc.min() < _INT32.min or acc.max() > _INT32.max):
        raise ValueError("the int32 accumulator overflows")
    if a.out_dtype == "float32":
        return [acc.astype(np.float32) * qconv_multiplier(a.x_scale, a.w_scales)]
    m = qconv_requant_multiplier(a.x_scale, a.w_scales, a.y_scale)
    return [linear_requantize(acc, m, (-np.inf, np.inf), a.y_zero, a.out_dtype)]


def _expand(g: Graph, node: Node) -> list[Value]:
    """DequantizeLinear(x, w, bias) -> Gemm (bias or trans_b) / MatMul -> QuantizeLinear (or float out)."""
    a: QGemmAttrs = node.attrs
    ins = g.inputs_of(node)
    base = node.name or node.output_names[0]
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    dx = add_dequantize(
        g, x, np.array(a.x_scale, np.float32), np.array(a.x_zero, x.type.dtype.numpy), f"{base}_x_dq"
    )
    ws = scale_array(np.asarray(a.w_scales, np.float32))
    dw = add_dequantize(g, w, ws, np.zeros(ws.shape, np.int8), f"{base}_w_dq", axis=0 if a.trans_b else 1)
    b = ins[2] if len(ins) > 2 else None
    if b is None and not a.trans_b:
        y = g.value(g.add_node("MatMul", [dx, dw], name=f"{base}_float"))
    else:
        operands = [dx, dw]
        if b is not None:
            bs = scale_array(qconv_multiplier(a.x_scale, a.w_scales))
            operands.append(add_dequantize(g, b, bs, np.zeros(bs.shape, np.int32), f"{base}_b_dq"))
        attrs = GemmAttrs(transB=a.trans_b)
        y = g.value(g.add_node("Gemm", operands, attrs, name=f"{base}_float"))
    return [add_output_quantize(g, y, a.out_dtype, a.y_scale, a.y_zero, base)]


register(
    OpDef(
        "QGemm",
        _infer,
        _reference,
        QGemmAttrs,
        domain=KILN,
        inputs=(2, 3),
        layout=Layout.FIXED,
        quant=QuantPolicy.NONE,
        expand=_expand,
        doc="y = float32((x_q - x_zero) @ w_q + bias_q) * x_scale*w_scale[n]; "
        "to int: clip(rint(float64(acc) * x_scale*w_scale[n]/y_scale) + y_zero)",
    )
)
