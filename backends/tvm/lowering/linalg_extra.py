"""Det: LU factorization with partial pivoting, one matrix per thread, in float64.

For each matrix A (n x n, the batch dims flattened), in a float64 copy W of A, for k = 0..n-1::

    p = argmax_{i >= k} |W[i, k]|                    (the first of equal maxima)
    swap rows k and p of W (columns k..n-1);  det = -det if p != k
    det = det · W[k, k]
    if W[k, k] != 0:  W[i, j] -= (W[i, k] / W[k, k]) · W[k, j]   for i, j > k

so det(A) = (-1)^swaps · Π_k U[k, k]; a zero pivot (a singular matrix) makes it 0 and the
elimination of that column is skipped. The result is cast to A's type. The matrices run in
parallel (CPU) or one per GPU thread (64 per block); W is a workspace output of the kernel.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from backends.tvm.lowering.table import LowerContext, lowers
from compiler.ir.graph import Graph, Node

__all__ = ["det_te"]

_WORK = "float64"
_GPU_THREADS = 64


def det_te(x: Any, gpu: bool) -> Any:
    """(det [batch] of x's dtype, workspace [batch, n, n] float64) of x [batch, n, n]."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    batch, n = int(x.shape[0]), int(x.shape[1])
    dt = x.dtype

    def f64(v: float) -> Any:
        return tirx.const(v, _WORK)

    def one_matrix(xs: Any, ys: Any, w: Any, b: Any) -> None:
        acc = T.buffer_proxy(T.alloc_buffer((1,), _WORK, scope="local"))
        best = T.buffer_proxy(T.alloc_buffer((1,), _WORK, scope="local"))
        tmp = T.buffer_proxy(T.alloc_buffer((1,), _WORK, scope="local"))
        piv = T.buffer_proxy(T.alloc_buffer((1,), "int32", scope="local"))
        with T.serial(0, n) as i, T.serial(0, n) as j:
            w[b, i, j] = tirx.Cast(_WORK, xs[b, i, j])
        acc[0] = f64(1.0)
        with T.serial(0, n) as k:
            piv[0] = k
            best[0] = tirx.abs(w[b, k, k])
            with T.serial(k + 1, n) as i, T.If(tirx.abs(w[b, i, k]) > best[0]), T.Then():
                best[0] = tirx.abs(w[b, i, k])
                piv[0] = i
            with T.If(piv[0] != k), T.Then():
                acc[0] = -acc[0]
                with T.serial(k, n) as j:
                    tmp[0] = w[b, k, j]
                    w[b, k, j] = w[b, piv[0], j]
                    w[b, piv[0], j] = tmp[0]
            acc[0] = acc[0] * w[b, k, k]
            with T.If(w[b, k, k] != f64(0.0)), T.Then(), T.serial(k + 1, n) as i:
                tmp[0] = w[b, i, k] / w[b, k, k]
                with T.serial(k + 1, n) as j:
                    w[b, i, j] = w[b, i, j] - tmp[0] * w[b, k, j]
        ys[b] = tirx.Cast(dt, acc[0])

    def ir(xb: Any, yb: Any, wb: Any) -> Any:
        with IRBuilder() as ib, T.seq_scope():
            xs, ys, w = T.buffer_proxy(xb), T.buffer_proxy(yb), T.buffer_proxy(wb)
            if gpu:
                blocks = math.ceil(batch / _GPU_THREADS)
                with (
                    T.thread_binding(0, blocks, thread="blockIdx.x") as bx,
                    T.thread_binding(0, _GPU_THREADS, thread="threadIdx.x") as tx,
                ):
                    b = bx * _GPU_THREADS + tx
                    with T.If(b < batch), T.Then():
                        one_matrix(xs, ys, w, b)
            else:
                loop = T.parallel(0, batch) if batch > 1 else contextlib.nullcontext(0)
                with loop as b:
                    one_matrix(xs, ys, w, b)
        return ib.get()

    return te.extern(
        [(batch,), (batch, n, n)],
        [x],
        lambda ins, outs: ir(ins[0], outs[0], outs[1]),
        dtype=[dt, _WORK],
        name="kiln_det",
    )


def _det_reason(graph: Graph, node: Node) -> str | None:
    t = graph.inputs_of(node)[0]
    assert t is not None
    if not t.type.dtype.is_float:
        return f"Det of {t.type.dtype.short}: float matrices only"
    return None


@lowers("Det", check=_det_reason)
def _det(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax

    shape = ctx.in_type(node, 0).static_shape
    n, batch = shape[-1], math.prod(shape[:-2])
    x = ctx.emit(relax.op.reshape(ins[0], (batch, n, n)))
    out = ctx.bb.emit_te(det_te, x, ctx.target.kind == "cuda", primfunc_name_hint="kiln_det")
    det = ctx.emit(relax.TupleGetItem(out, 0))
    return [ctx.emit(relax.op.reshape(det, ctx.out_shape(node)))]
