"""kiln::WeightOnlyMatMul -> MNN's weight-only int4/int8 fully connected layer (a 1x1 Convolution).

The op's own integer levels Q [N, K] and block scales are written as they are (``IDSTQuan``
type 1, one scale group per block of a row, see :mod:`backends.mnn.weights`); nothing is
re-quantized. MNN decodes at load, with s and z the block's scale and zero point:

* symmetric (no zero points): alpha = s (``alphaFp16`` when the op's scales are float16, which
  holds them exactly), and MNN's w = q · alpha is the op's W bit for bit;
* asymmetric: MNN's w = (q - aMin) · s + m with aMin = -2^(bits-1); alpha = (m, s) pairs with
  m = -(z + 2^(bits-1)) · s in float32 (fp32 alpha, as an fp16 m would round) is (q - z) · s up
  to one float32 rounding of m and of the sum.

MNN's blocks must tile each row evenly, so MNN's block is g = gcd(K, block_size): each of the op's
blocks is block_size / g MNN blocks with its scale (and zero point) repeated, the short last block
of a K that block_size does not divide included (K = 192, block 128: MNN blocks of 64), which is
the op's grid exactly. The layer is then the fully connected form of Gemm/MatMul
(:func:`backends.mnn.lower.linear.emit_fc`). Refused, with the reason: g < :data:`MIN_MNN_BLOCK`
(a scale per few weights would outweigh them; the ``weight-only-dequantize`` decomposition then
writes the layer with float weights), and weights, scales, zero points or bias that are not
constants.
"""

from __future__ import annotations

import math

import numpy as np

from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.linear import emit_fc
from backends.mnn.lower.registry import Lowering, WeightView
from backends.mnn.weights import WeightStorage
from compiler.ir.graph import Graph, Node
from compiler.ops.weight_only import WeightOnlyMatMulAttrs, dequantize_levels
from schemas.mnn.quantized_weights import QuantizedWeights

__all__ = ["LOWERINGS", "MIN_MNN_BLOCK", "mnn_block", "mnn_levels"]

MIN_MNN_BLOCK = 16
"""The smallest MNN block (weights per scale) a layer is written with (onnxruntime's smallest block too)."""


def mnn_block(k: int, block_size: int) -> int:
    """MNN's block for the op's blocks along K: g = gcd(K, block_size), which tiles every row."""
    return math.gcd(int(k), int(block_size))


def _check(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if any(v is not None and v.const is None for v in ins[1:]):
        return "levels, scales, zero points and bias must be constants"
    q = ins[1]
    assert q is not None and q.const is not None
    k = q.const.shape[1]
    bs = node.attrs.block_size
    if mnn_block(k, bs) < MIN_MNN_BLOCK:
        return (
            f"MNN's weight blocks must tile K: K={k} and block_size={bs} share blocks of only "
            f"{mnn_block(k, bs)} weights (< {MIN_MNN_BLOCK})"
        )
    return None


def mnn_levels(
    levels: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, attrs: WeightOnlyMatMulAttrs
) -> WeightStorage:
    """The MNN storage of the op's levels [N, K], scales and zero points [N, n_blocks], as they are
    (each scale repeated over the MNN blocks of its block)."""
    n, k = levels.shape
    g = mnn_block(k, attrs.block_size)
    groups = n * (k // g)

    def per_mnn_block(x: np.ndarray) -> np.ndarray:
        return np.repeat(np.asarray(x, np.float32), attrs.block_size // g, axis=1)[:, : k // g].reshape(-1)

    kind = f"int{attrs.bits}"
    q = np.asarray(levels, np.int32)
    s = per_mnn_block(scales)
    if zero_points is None:
        qw = QuantizedWeights(q, s, attrs.bits, False, groups)
        return WeightStorage(kind, False, scales.dtype == np.float16, qw)
    half = 1 << (attrs.bits - 1)
    m = -(per_mnn_block(zero_points) + np.float32(half)) * s
    alpha = np.stack([m, s], axis=1).reshape(-1).astype(np.float32)
    return WeightStorage(kind, True, False, QuantizedWeights(q, alpha, attrs.bits, True, groups))


def _lower(ctx: LowerContext, node: Node) -> None:
    ins = ctx.graph.inputs_of(node)
    a_value, q_value, s_value = ins[0], ins[1], ins[2]
    assert a_value is not None and q_value is not None and s_value is not None
    z_value = ins[3] if len(ins) > 3 else None
    b_value = ins[4] if len(ins) > 4 else None
    q, s = q_value.const, s_value.const
    assert q is not None and s is not None
    z = None if z_value is None else z_value.const
    rows = dequantize_levels(q, s, z, node.attrs.block_size)
    view = WeightView(1, rows, lambda r: r, rows.shape[1], 1)
    bias = np.zeros(rows.shape[0], np.float32)
    if b_value is not None and b_value.const is not None:
        bias = np.asarray(b_value.const, np.float32)
    emit_fc(ctx, node, a_value, view, bias, mnn_levels(q, s, z, node.attrs))


LOWERINGS: dict[str, Lowering] = {"kiln::WeightOnlyMatMul": Lowering(_lower, _check)}
