"""kiln::WeightOnlyMatMul lowered with the dequantization fused into the matrix product.

One TE reduction over k for every leading index r of A [..., K]; the weight is dequantized inside
the reduction, never materialised::

    Y[r, n] = Σ_k A[r, k] · ((float(Q[k, n]) - float(z[k // bs, n])) · s[k // bs, n])   (+ bias[n])

The library's parameters hold the int8 levels Qᵀ [K, N], the float32 scales [n_blocks, N] (fp16
ones widened, exactly) and the int8 zero points. Each weight is computed as
:func:`compiler.ops.weight_only.dequantize_levels` computes it (an exact difference of integers, one
rounding for the product), so the result differs from the op's reference only by the order of the
float32 sums.

CPU schedule (the kernel's own, ``kiln.scheduled = "weight-only-matmul"``): Kiln's generic matmul
rule wants a product of two plainly indexed operands, and its row-reduction rule, which does take
the fused function, dequantizes every weight once per row of A (ViT-Tiny int4w: 172 ms against
19 ms in fp32). So the register tile of the generic matmul rule is applied here to the fused
block: rows r tiled by ``ti`` and columns n by ``tv`` vectors (:func:`pick_matmul_tile`), loops
``[n_o, r_o] (fused, parallel), k, r_i (unrolled), n_i (vectorized)`` with the accumulators in a
tile buffer of global scope under 1 KiB (a stack array; a ``local`` one, or a bigger one, is a
workspace alloc/free call pair per tile) and the bias added on write-back; a dequantized vector
of W serves all ``ti`` rows (ViT-Tiny int4w then runs within 1.4x of the fp32 library's time on
one thread, measured on a loaded 2-core machine: medians 27-46 ms against 31-39 ms). N no vector
width divides keeps the function unscheduled for the generic schedule (its reduction rule). CUDA:
the function goes to dlight's rules like the other unscheduled ones (the pipeline refuses any
kernel left without a thread binding).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.tvm.kernels.kernel import Kernel, mark_scheduled, simd_isa
from backends.tvm.lowering.table import LowerContext, lowers
from backends.tvm.schedule_matmul import pick_matmul_tile
from backends.tvm.schedule_nest import PARALLEL_MIN_WORK, vec_width
from compiler.ir.graph import Graph, Node
from compiler.ops.weight_only import block_count

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["weight_only_matmul_te", "schedule_weight_only"]

RULE = "weight-only-matmul"


def _const_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    for port, what in ((1, "levels"), (2, "scales"), (3, "zero points"), (4, "bias")):
        v = ins[port] if port < len(ins) else None
        if v is not None and v.const is None:
            return f"{what} (input {port}) must be a constant for --target"
    return None


def weight_only_matmul_te(x: Any, q: Any, s: Any, z: Any | None, bias: Any | None, block_size: int) -> Any:
    """The fused TE compute: x [..., K] float32, q [K, N] int8, s [n_blocks, N] float32, z
    [n_blocks, N] int8 or None, bias [N] float32 or None; Y [..., N] float32 (module docstring)."""
    from tvm import te

    *lead, k_dim = (int(d) for d in x.shape)
    n = int(q.shape[1])
    k = te.reduce_axis((0, k_dim), "k")

    def weight(kk: Any, col: Any) -> Any:
        level = q[kk, col].astype("float32")
        if z is not None:
            level = level - z[kk // block_size, col].astype("float32")
        return level * s[kk // block_size, col]

    y = te.compute(
        (*lead, n),
        lambda *idx: te.sum(x[(*idx[:-1], k)] * weight(k, idx[-1]), axis=k),
        name="weight_only_matmul",
    )
    if bias is None:
        return y
    return te.compute((*lead, n), lambda *idx: y[idx] + bias[idx[-1]], name="weight_only_bias")


def schedule_weight_only(func: Any, rows: int, n: int, target: TargetSpec) -> Any | None:
    """The register-tiled CPU schedule of the module docstring; None when no vector width divides N."""
    from tvm import s_tir

    lanes = target.lanes
    vec = vec_width(n, lanes)
    if vec is None:
        return None
    registers = 32 if lanes >= 16 or target.is_arm else 16
    tile = pick_matmul_tile(rows, n // vec, registers, vec)  # ti * tv * vec fits the stack
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("weight_only_matmul")
    *lead, col, k = sch.get_loops(block)
    row = sch.fuse(*lead) if len(lead) > 1 else lead[0]
    r_o, r_i = sch.split(row, [None, tile.ti])
    n_o, n_i = sch.split(col, [None, tile.tv * vec])
    sch.reorder(n_o, r_o, k, r_i, n_i)
    local = sch.cache_write(block, 0, "global")  # not "local": see the module docstring
    for consumer in sch.get_consumers(local):  # the bias, added on write-back
        sch.reverse_compute_inline(consumer)
    sch.reverse_compute_at(local, r_o)
    outer = sch.fuse(n_o, r_o)
    if rows * n * 4 > PARALLEL_MIN_WORK and target.num_cores > 1:
        sch.parallel(outer)
    n_io, n_ii = sch.split(n_i, [None, vec])
    sch.vectorize(n_ii)
    if tile.ti > 1:
        sch.unroll(r_i)
    if tile.tv > 1:
        sch.unroll(n_io)
    tail = list(sch.get_loops(local))[1:]  # the write-back below the fused outer loop
    if tail:
        *rest, last = tail
        if len(rest) > 1:
            rest = [sch.fuse(*rest)]
        _, wv = sch.split(last, [None, vec])
        sch.vectorize(wv)
        for lp in rest:
            sch.unroll(lp)
    sch.decompose_reduction(block, k)
    return sch.mod["main"]


def _kernel(
    ctx: LowerContext, x_shape: tuple[int, ...], n: int, block_size: int, zero: bool, bias: bool
) -> Kernel | None:
    """The scheduled CPU kernel (args x, Qᵀ, s[, z][, bias], out), or None (see the docstring)."""
    from tvm import te

    k = x_shape[-1]
    nb = block_count(k, block_size)
    x = te.placeholder(x_shape, "float32", "x")
    q = te.placeholder((k, n), "int8", "levels")
    s = te.placeholder((nb, n), "float32", "scales")
    z = te.placeholder((nb, n), "int8", "zero_points") if zero else None
    b = te.placeholder((n,), "float32", "bias") if bias else None
    y = weight_only_matmul_te(x, q, s, z, b, block_size)
    args = [t for t in (x, q, s, z, b) if t is not None]
    rows = int(np.prod(x_shape[:-1]))
    func = schedule_weight_only(te.create_prim_func([*args, y]), rows, n, ctx.target)
    if func is None:
        return None
    key = f"{x_shape}|{n}|{block_size}|{zero}|{bias}|{ctx.target.lanes}|{ctx.target.num_cores}"
    name = f"kiln_weight_only_matmul_{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    func = mark_scheduled(func.with_attr("global_symbol", name), RULE, "matmul", simd_isa(ctx.target))
    return Kernel(name=name, func=func, out_shape=(*x_shape[:-1], n), out_dtype="float32")


@lowers("kiln::WeightOnlyMatMul", check=_const_reason)
def _weight_only_matmul(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    bs = int(node.attrs.block_size)
    q = ctx.require_const(node, 1, "levels").astype(np.int8)
    s = ctx.require_const(node, 2, "scales").astype(np.float32)
    z, bias = ctx.input_const(node, 3), ctx.input_const(node, 4)
    n = int(q.shape[0])
    args = [
        ins[0],
        ctx.const(np.ascontiguousarray(q.T)),
        ctx.const(np.ascontiguousarray(s.T)),
        None if z is None else ctx.const(np.ascontiguousarray(z.T.astype(np.int8))),
        None if bias is None else ctx.const(np.ascontiguousarray(bias, np.float32)),
    ]
    x_shape = ctx.in_type(node, 0).static_shape
    kernel = None
    if ctx.target.is_cpu:
        kernel = _kernel(ctx, tuple(int(d) for d in x_shape), n, bs, z is not None, bias is not None)
    if kernel is not None:
        return [ctx.call_kernel(kernel, [a for a in args if a is not None])]
    y = ctx.bb.emit_te(weight_only_matmul_te, *args, bs, primfunc_name_hint="kiln_weight_only_matmul")
    return [y]
