"""A dense layer whose row count is known only at run time, on CPU: ``y[m, n] = sum_k x[m, k] w[k, n]
(+ b[n])`` with ``w`` a constant ``[K, N]`` (pre-transposed, so ``n`` is contiguous).

The generic schedule's matmul rule needs static extents (its row tile pads M), so a Gemm after a
NonZero (a detector's box head, ``[n, 12544] x [12544, 256]``) would stay a naive loop nest. This
kernel is scheduled here: ``N`` split by the vector width, rows in tiles of :data:`ROWS`, the loops
``n_o (parallel), m_o, k, m_i (unrolled), n_i (vectorized)``: each ``[K, vec]`` weight slab stays in
cache for every row tile.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.table import LowerContext

__all__ = ["dynamic_dense", "ROWS"]

ROWS = 4
"""Rows per register tile (each ``k`` step updates ROWS x vector-width accumulators)."""


def _compute(x: Any, w: Any, b: Any | None) -> Any:
    from tvm import te

    m, k_ext = x.shape
    n_ext = w.shape[1]
    k = te.reduce_axis((0, k_ext), name="k")
    y = te.compute((m, n_ext), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="dense")
    if b is None:
        return y
    return te.compute((m, n_ext), lambda i, j: y[i, j] + b[j], name="dense_bias")


def _schedule(func: Any, lanes: int, n_ext: int, has_bias: bool) -> Any:
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    block = sch.get_sblock("dense")
    i, j, k = sch.get_loops(block)
    vec = lanes if n_ext % lanes == 0 else 1
    io, ii = sch.split(i, [None, ROWS])
    jo, ji = sch.split(j, [None, vec])
    sch.reorder(jo, io, k, ii, ji)  # one [K, vec] weight slab (L2-resident) serves every row tile
    sch.parallel(jo)
    sch.unroll(ii)
    if vec > 1:
        sch.vectorize(ji)
    sch.decompose_reduction(block, k)
    if has_bias:
        bias = sch.get_sblock("dense_bias")
        bi, bj = sch.get_loops(bias)
        sch.parallel(bi)
        if vec > 1:
            _, bji = sch.split(bj, [None, vec])
            sch.vectorize(bji)
    return sch.mod["main"]


def dynamic_dense(ctx: LowerContext, x: Any, w_kn: np.ndarray, bias: np.ndarray | None) -> Any | None:
    """``x @ w_kn (+ bias)`` as a scheduled kernel (None when ``x``'s K differs from ``w_kn``'s)."""
    from tvm import relax, te, tirx

    from backends.tvm.dynamic_shapes import relax_shape

    dims = relax_shape(x)
    if dims is None or len(dims) != 2 or str(x.ty.dtype) != "float32":
        return None
    k_ext, n_ext = (int(d) for d in w_kn.shape)
    rows = tirx.Var(
        "m", "int64"
    )  # a plain var: the kernel binds it from x's shape (Relax's may be an expression)
    x_t = te.placeholder((rows, k_ext), "float32", "x")
    w_t = te.placeholder((k_ext, n_ext), "float32", "w")
    b_t = None if bias is None else te.placeholder((n_ext,), "float32", "b")
    y_t = _compute(x_t, w_t, b_t)
    args = [x_t, w_t] + ([b_t] if b_t is not None else []) + [y_t]
    func = _schedule(te.create_prim_func(args), ctx.target.lanes, n_ext, b_t is not None)
    from backends.tvm.kernels.kernel import OPAQUE_PATTERN

    attrs = {"kiln.scheduled": "dynamic_dense", "kiln.op_class": "dense", "op_pattern": OPAQUE_PATTERN}
    func = func.with_attrs(attrs)  # opaque: FuseOps leaves it whole
    gv = ctx.bb.add_func(func, "kiln_dynamic_dense")
    call_args = [x, ctx.const(np.ascontiguousarray(w_kn, np.float32))]
    if bias is not None:
        call_args.append(ctx.const(np.ascontiguousarray(bias, np.float32)))
    out = relax.TensorType([dims[0], n_ext], "float32")
    return ctx.emit(relax.call_tir(gv, call_args, out))
