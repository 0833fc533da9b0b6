"""Decompositions of the weight-only ops: the matrix product into a float weight, the table lookup
into a lookup of the integer levels (or of the float table).

weight-only-dequantize: kiln::WeightOnlyMatMul(A, Q, s, z, bias) = MatMul(A, Wᵀ) (+ Add(·, bias)),
with the float32 constant W[n, k] = (Q[n, k] - z[n, k // bs]) · s[n, k // bs] of
:func:`compiler.ops.weight_only.dequantize_levels`: exactly the weights the op computes with,
so the result differs only by the order of the float32 sums. For backends without a native
weight-only kernel (TVM, CANN for now) and layers a native one refuses (MNN, K not a multiple
of the block size); the weights then take float32 storage. Levels, scales and zero points must
be constants.

weight-only-gather-levels: kiln::WeightOnlyGather(Q, i, s, z) with D = n_blocks · bs (whole blocks) =

    Reshape((R - Gather(z₃, i)) · Gather(s₃, i), [*I, D]),   R = Reshape(Cast(Gather(Q, i)), [*I, nb, bs])

with s₃ = s [V, nb, 1] (widened to float32) and z₃ = z [V, nb, 1] as float32 constants (no Sub when
symmetric): the int8 levels stay in the file and each gathered row is dequantized as the op does
it, (q - z) · s in float32, exactly. For backends whose Gather reads int8 (MNN, TVM, CANN).

weight-only-gather-dequantize: Gather(T̂, i) with T̂ = dequantize_levels(Q, s, z) a float32
constant: the table's exact values in float32 storage (any D).
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType
from compiler.ops.weight_only import dequantize_levels
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, ints, replace_outputs

__all__ = ["WEIGHT_ONLY_DEQUANTIZE", "WEIGHT_ONLY_GATHER_LEVELS", "WEIGHT_ONLY_GATHER_DEQUANTIZE"]


def _check(graph: Graph, node: Node) -> str | None:
    if any(v is not None and v.const is None for v in graph.inputs_of(node)[1:4]):
        return "levels, scales and zero points must be constants"
    return None


def _rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    ins = graph.inputs_of(node)
    a, q, s = ins[0], ins[1], ins[2]
    assert a is not None and q is not None and q.const is not None and s is not None and s.const is not None
    z = ins[3] if len(ins) > 3 else None
    bias = ins[4] if len(ins) > 4 else None
    w = dequantize_levels(q.const, s.const, None if z is None else z.const, node.attrs.block_size)
    b = base_name(node)
    wt = rw.const(np.ascontiguousarray(w.T), f"{b}_weight")
    y = rw.op("MatMul", [a, wt], name=f"{b}_matmul" if bias is not None else b)
    if bias is not None:
        y = rw.op("Add", [y, bias], name=b)
    replace_outputs(rw, node, [y])


WEIGHT_ONLY_DEQUANTIZE = register_decomposition(
    Decomposition(
        "weight-only-dequantize",
        "kiln::WeightOnlyMatMul",
        ("MatMul", "Add"),
        _check,
        _rewrite,
        "Y = A @ Wᵀ (+ bias), W = (Q - z) · s per block as a float32 constant",
    )
)


def _gather_check(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if any(v is not None and v.const is None for v in (ins[0], *ins[2:4])):
        return "levels, scales and zero points must be constants"
    return None


def _gather_grid(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    ins = graph.inputs_of(node)
    q, s = ins[0], ins[2]
    z = ins[3] if len(ins) > 3 else None
    assert q is not None and q.const is not None and s is not None and s.const is not None
    return q.const, s.const, None if z is None else z.const


def _whole_blocks_check(graph: Graph, node: Node) -> str | None:
    if (reason := _gather_check(graph, node)) is not None:
        return reason
    idx = graph.inputs_of(node)[1]
    assert idx is not None
    if not idx.type.is_static:
        return "dynamic index shape (fix it with --input-shape)"
    q, _, _ = _gather_grid(graph, node)
    if q.shape[1] % node.attrs.block_size:
        return f"D={q.shape[1]} is not a whole number of blocks of {node.attrs.block_size}"
    return None


def _gather_levels(rw: Rewriter, graph: Graph, node: Node) -> None:
    q, s, z = _gather_grid(graph, node)
    idx = graph.inputs_of(node)[1]
    assert idx is not None
    v, d = q.shape
    bs = node.attrs.block_size
    lead = list(idx.type.static_shape)
    b = base_name(node)
    rows = rw.op("Gather", [rw.const(q, f"{b}_levels"), idx], name=f"{b}_rows")
    f = rw.op("Cast", [rows], {"to": int(DType.FLOAT32)}, name=f"{b}_cast")
    blocks = rw.op("Reshape", [f, ints(rw, [*lead, d // bs, bs], f"{b}_blocks_shape")], name=f"{b}_blocks")
    if z is not None:
        zf = rw.const(z.astype(np.float32).reshape(v, -1, 1), f"{b}_zero_points_f")
        blocks = rw.op(
            "Sub", [blocks, rw.op("Gather", [zf, idx], name=f"{b}_zero_rows")], name=f"{b}_centred"
        )
    sf = rw.const(np.asarray(s, np.float32).reshape(v, -1, 1), f"{b}_scales_f")
    y = rw.op("Mul", [blocks, rw.op("Gather", [sf, idx], name=f"{b}_scale_rows")], name=f"{b}_scaled")
    y = rw.op("Reshape", [y, ints(rw, [*lead, d], f"{b}_shape")], name=b)
    replace_outputs(rw, node, [y])


def _gather_dequantize(rw: Rewriter, graph: Graph, node: Node) -> None:
    q, s, z = _gather_grid(graph, node)
    idx = graph.inputs_of(node)[1]
    b = base_name(node)
    table = rw.const(dequantize_levels(q, s, z, node.attrs.block_size), f"{b}_table")
    replace_outputs(rw, node, [rw.op("Gather", [table, idx], name=b)])


WEIGHT_ONLY_GATHER_LEVELS = register_decomposition(
    Decomposition(
        "weight-only-gather-levels",
        "kiln::WeightOnlyGather",
        ("Gather", "Cast", "Reshape", "Sub", "Mul"),
        _whole_blocks_check,
        _gather_levels,
        "Y = Reshape((Cast(Gather(Q, i)) - Gather(z, i)) · Gather(s, i)) per block: int8 levels kept",
    )
)
WEIGHT_ONLY_GATHER_DEQUANTIZE = register_decomposition(
    Decomposition(
        "weight-only-gather-dequantize",
        "kiln::WeightOnlyGather",
        ("Gather",),
        _gather_check,
        _gather_dequantize,
        "Y = Gather(T̂, i), T̂ = (Q - z) · s per block as a float32 constant",
    )
)
