"""A dense layer whose row count is known only at run time, on CPU: ``y[m, n] = sum_k x[m, k] w[k, n]
(+ b[n])`` with ``w`` a constant ``[K, N]``.

The generic schedule's matmul rule needs static extents (its row tile pads M), so a Gemm after a
NonZero (a detector's box head, ``[n, 12544] x [12544, 256]``) would stay a naive loop nest. This
kernel is scheduled here, in the packed form of :mod:`backends.tvm.kernels.dense`:

    Wp[c, k, j] = w[k, c*B + j]            (zero where c*B + j >= N; B = the vector width)
    acc[i, c, j] = sum_k x[min(i, m-1), k] * Wp[c, k, j]     for i < M' = 4 * ceil(m / 4)
    y[i, n] = acc[i, n // B, n % B] + b[n]                    for i < m

The rows are padded to a whole register tile by reading the last row again (the clamp), so the
inner loops carry no bounds test; the padded rows are never stored to ``y``. Loops:
``c_o (parallel), k_o, i_o, k_i, i_i (unrolled), c_i (unrolled), j (vectorized)``: a register
tile of ROWS rows x ``tn`` chunks of B lanes, and K cut into steps of about :data:`K_STEP` so that
one ``[K_STEP, tn * B]`` weight panel stays in cache while every row tile passes over it (without
the K step each row tile would stream the whole weight from memory again).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.table import LowerContext

__all__ = ["dynamic_dense", "ROWS", "K_STEP", "pack_columns"]

ROWS = 4
"""Rows per register tile (each ``k`` step updates ROWS x tn x B accumulators)."""
K_STEP = 128
"""Reduction step: the weight panel of one step is K_STEP x tn x B floats (32 KiB for tn x B = 64)."""
_MAX_ACCUMULATORS = 16  # vector registers the register tile may hold


def pack_columns(w_kn: np.ndarray, block: int) -> np.ndarray:
    """``w [K, N]`` -> ``Wp [ceil(N/B), K, B]``, ``Wp[c, k, j] = w[k, c*B + j]`` (zero padded): the
    static dense kernel's packing (:func:`backends.tvm.kernels.dense.pack_dense_weight`) of w^T."""
    from backends.tvm.kernels.dense import DenseSpec, pack_dense_weight

    k_ext, n_ext = w_kn.shape
    return pack_dense_weight(
        np.asarray(w_kn).T, DenseSpec(m=1, k=k_ext, n=n_ext, has_bias=False, block=block)
    )


def _compute(x: Any, wp: Any, b: Any | None, n_ext: int) -> Any:
    from tvm import te

    m, k_ext = x.shape
    chunks, _, block = wp.shape
    padded = (m + (ROWS - 1)) // ROWS * ROWS
    k = te.reduce_axis((0, k_ext), name="k")
    last = m - 1
    acc = te.compute(
        (padded, chunks, block),
        lambda i, c, j: te.sum(x[te.min(i, last), k] * wp[c, k, j], axis=k),
        name="acc",
    )

    def epi(i: Any, n: Any) -> Any:
        v = acc[i, n // block, n % block]
        return v if b is None else v + b[n]

    return te.compute((m, n_ext), epi, name="dense")


def _tile_chunks(chunks: int, lanes: int, block: int) -> int:
    vregs = max(1, block // lanes)
    return next(t for t in (4, 3, 2, 1) if chunks % t == 0 and ROWS * t * vregs <= _MAX_ACCUMULATORS)


def _schedule(func: Any, lanes: int, block: int, chunks: int, k_ext: int, n_ext: int) -> Any:
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    acc = sch.get_sblock("acc")
    i, c, j, k = sch.get_loops(acc)
    tn = _tile_chunks(chunks, lanes, block)
    io, ii = sch.split(i, [None, ROWS])
    co, ci = sch.split(c, [None, tn])
    steps = -(-k_ext // K_STEP)
    step = next((s for s in range(-(-k_ext // steps), k_ext + 1) if k_ext % s == 0), k_ext)
    if step < k_ext:
        ko, ki = sch.split(k, [None, step])
        sch.reorder(co, ko, io, ki, ii, ci, j)
    else:
        ko = k
        sch.reorder(co, io, k, ii, ci, j)
    sch.parallel(co)
    sch.unroll(ii)
    if tn > 1:
        sch.unroll(ci)
    sch.vectorize(j)
    init = sch.decompose_reduction(acc, ko)
    *_, init_c, init_j = sch.get_loops(init)
    sch.vectorize(init_j)
    epi = sch.get_sblock("dense")
    ei, en = sch.get_loops(epi)
    sch.parallel(ei)
    if n_ext % block == 0:
        _, ev = sch.split(en, [None, block])
        sch.vectorize(ev)
    return sch.mod["main"]


def dynamic_dense(ctx: LowerContext, x: Any, w_kn: np.ndarray, bias: np.ndarray | None) -> Any | None:
    """``x @ w_kn (+ bias)`` as a scheduled kernel (None when ``x``'s K differs from ``w_kn``'s)."""
    from tvm import relax, te, tirx

    from backends.tvm.dynamic_shapes import relax_shape

    dims = relax_shape(x)
    if dims is None or len(dims) != 2 or str(x.ty.dtype) != "float32":
        return None
    k_ext, n_ext = (int(d) for d in w_kn.shape)
    block = ctx.target.lanes
    wp = pack_columns(np.asarray(w_kn, np.float32), block)
    # a plain var: the kernel binds it from x's shape (Relax's may be an expression)
    rows = tirx.Var("m", "int64")
    x_t = te.placeholder((rows, k_ext), "float32", "x")
    w_t = te.placeholder(wp.shape, "float32", "w")
    b_t = None if bias is None else te.placeholder((n_ext,), "float32", "b")
    y_t = _compute(x_t, w_t, b_t, n_ext)
    args = [x_t, w_t] + ([b_t] if b_t is not None else []) + [y_t]
    func = _schedule(te.create_prim_func(args), ctx.target.lanes, block, wp.shape[0], k_ext, n_ext)
    from backends.tvm.kernels.kernel import OPAQUE_PATTERN

    attrs = {"kiln.scheduled": "dynamic_dense", "kiln.op_class": "dense", "op_pattern": OPAQUE_PATTERN}
    func = func.with_attrs(attrs)  # opaque: FuseOps leaves it whole
    gv = ctx.bb.add_func(func, "kiln_dynamic_dense")
    call_args = [x, ctx.const(wp)]
    if bias is not None:
        call_args.append(ctx.const(np.ascontiguousarray(bias, np.float32)))
    out = relax.TensorType([dims[0], n_ext], "float32")
    return ctx.emit(relax.call_tir(gv, call_args, out))
