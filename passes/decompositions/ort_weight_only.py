"""onnxruntime's block-quantized ops lifted into Kiln's weight-only ops (the inverse of their ``expand``).

matmul-nbits-lift: com.microsoft::MatMulNBits(A, B, scales, zero_points, bias; K, N, bits, block_size)
with constant B, scales and zero points (g_idx absent, which the op's inference refuses) =
kiln::WeightOnlyMatMul(A, Q, s, z, bias) with, per block b = k // block_size::

    Q[n, k] = u[n, k] - 2^(bits-1)        u: B's unsigned levels, unpacked (low nibble first)
    z[n, b] = zp[n, b] - 2^(bits-1)       zp: the unpacked zero points (absent: none, u's centre)
    s[n, b] = scales[n · n_blocks + b]

so (Q - z) · s = (u - zp) · s: the same weights, exactly (integer differences, one product).

gather-block-quantized-lift: com.microsoft::GatherBlockQuantized(data, indices, scales, zero_points)
(uint8 data [V, D · bits / 8], gather_axis 0, quantize_axis 1) = kiln::WeightOnlyGather(Q, indices,
s, z) with Q and z the unpacked levels and zero points shifted by -2^(bits-1) the same way.

Both give every backend with a weight-only path (TVM's fused dequantize-matmul kernel, MNN's
weight-only layers, CANN) models that onnxruntime already quantized; the ``lift-weight-only`` pass
applies them in the default pipeline, and the backends' ``decompose`` applies them otherwise.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.fused import KILN
from compiler.ops.matmul_nbits import ORT_DOMAIN, unpack_levels, unpack_zero_points
from compiler.ops.weight_only import block_count
from compiler.ops.weight_only_gather import unpack_table
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, replace_outputs

__all__ = ["MATMUL_NBITS_LIFT", "GATHER_BLOCK_QUANTIZED_LIFT", "lift_reason"]

_WHAT = {
    "MatMulNBits": ("B", "scales", "zero_points"),
    "GatherBlockQuantized": ("data", "scales", "zero_points"),
}


def lift_reason(graph: Graph, node: Node) -> str | None:
    """None when ``node`` (MatMulNBits or GatherBlockQuantized) lifts, else why not."""
    ins = graph.inputs_of(node)
    ports = (1, 2, 3) if node.op == "MatMulNBits" else (0, 2, 3)
    for port, what in zip(ports, _WHAT[node.op], strict=True):
        v = ins[port] if port < len(ins) else None
        if v is not None and v.const is None:
            return f"{what} (input {port}) is not a constant: the weights cannot be unpacked at compile time"
    if node.op == "MatMulNBits" and len(ins) > 4 and ins[4] is not None:
        return "g_idx (input 4) is present: Kiln's weight-only ops have contiguous blocks only"
    return None


def _signed(u: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned levels u ∈ [0, 2^bits - 1] shifted to signed int8: u - 2^(bits-1)."""
    return np.asarray(np.asarray(u, np.int32) - (1 << (bits - 1)), np.int8)


def _matmul_nbits(rw: Rewriter, graph: Graph, node: Node) -> None:
    a = node.attrs
    ins = graph.inputs_of(node)
    x, b, s = ins[0], ins[1], ins[2]
    assert x is not None and b is not None and b.const is not None and s is not None and s.const is not None
    zp = ins[3] if len(ins) > 3 else None
    bias = ins[5] if len(ins) > 5 else None
    nb = block_count(a.K, a.block_size)
    name = base_name(node)
    levels = rw.const(_signed(unpack_levels(b.const, a.K, a.bits), a.bits), f"{name}_levels")
    scales = rw.const(np.asarray(s.const, np.float32).reshape(a.N, nb), f"{name}_scales")
    z: Value | None = None
    if zp is not None and zp.const is not None:
        z = rw.const(_signed(unpack_zero_points(zp.const, a.N, nb, a.bits), a.bits), f"{name}_zero_points")
    operands = [x, levels, scales, z, bias]
    while operands[-1] is None:
        operands.pop()
    attrs = {"bits": a.bits, "block_size": a.block_size}
    y = rw.op("WeightOnlyMatMul", operands, attrs, domain=KILN, name=node.name or name)
    replace_outputs(rw, node, [y])


def _gather_block_quantized(rw: Rewriter, graph: Graph, node: Node) -> None:
    a = node.attrs
    ins = graph.inputs_of(node)
    data, idx, s = ins[0], ins[1], ins[2]
    assert data is not None and data.const is not None and idx is not None
    assert s is not None and s.const is not None
    zp = ins[3] if len(ins) > 3 else None
    name = base_name(node)
    d = data.const.shape[1] * 8 // a.bits
    levels = rw.const(_signed(unpack_table(data.const, d, a.bits), a.bits), f"{name}_levels")
    scales = rw.const(np.asarray(s.const, np.float32), f"{name}_scales")
    operands = [levels, idx, scales]
    if zp is not None and zp.const is not None:
        z = _signed(unpack_table(zp.const, s.const.shape[1], a.bits), a.bits)
        operands.append(rw.const(z, f"{name}_zero_points"))
    attrs = {"bits": a.bits, "block_size": a.block_size}
    y = rw.op("WeightOnlyGather", operands, attrs, domain=KILN, name=node.name or name)
    replace_outputs(rw, node, [y])


MATMUL_NBITS_LIFT = register_decomposition(
    Decomposition(
        "matmul-nbits-lift",
        f"{ORT_DOMAIN}::MatMulNBits",
        (f"{KILN}::WeightOnlyMatMul",),
        lift_reason,
        _matmul_nbits,
        "MatMulNBits(A, B, s, zp, bias) = WeightOnlyMatMul(A, u - 2^(bits-1), s, zp - 2^(bits-1), bias)",
    )
)
GATHER_BLOCK_QUANTIZED_LIFT = register_decomposition(
    Decomposition(
        "gather-block-quantized-lift",
        f"{ORT_DOMAIN}::GatherBlockQuantized",
        (f"{KILN}::WeightOnlyGather",),
        lift_reason,
        _gather_block_quantized,
        "GatherBlockQuantized(data, i, s, zp) = WeightOnlyGather(u - 2^(bits-1), i, s, zp - 2^(bits-1))",
    )
)
