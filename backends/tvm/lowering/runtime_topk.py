"""TopK on run-time shapes: a k computed at run time, or an axis whose length only the data decides.

With L the axis length and o = the stable argsort of x along the axis (descending for largest, so
equal values keep the lower index first, ONNX's rule; ascending for smallest),

    TopK(x, k) = (x[.., o_i, ..], o_i)   for i < k'

k is read symbolically when it is a constant or tracked (``k = min(K, n)`` with ``n`` from Shape of
a run-time-shaped tensor: :mod:`backends.tvm.lowering.shape_values`), k' = min(k, L), so the output
dim stays ``min(n, K)``; else at run time (its one value bound to a symbolic dim,
:func:`backends.tvm.dynamic_shapes.define_length`), k' = min(max(k, 0), L). ONNX makes k > L an
error; here k' is clamped to L instead (a constant k > a static L is refused by shape inference).
``sorted=0`` allows any order, so the sorted one is kept. On CUDA the sort is TVM's GPU argsort
(built in the tests, not run: there is no GPU to check its tie order on).
"""

from __future__ import annotations

from typing import Any

from backends.tvm.dynamic_shapes import define_length, relax_shape
from backends.tvm.lowering.shape_values import values_of
from backends.tvm.lowering.table import LowerContext, lowers_dynamic
from compiler.ir.graph import Graph, Node

__all__ = ["topk_prefix_te"]


def _i64(v: Any) -> Any:
    from tvm import tirx

    if isinstance(v, int):
        return tirx.const(v, "int64")
    return v if str(getattr(v, "ty", "")) == "int64" else tirx.Cast("int64", v)


def topk_prefix_te(x: Any, order: Any, k: Any, axis: int) -> Any:
    """(values, indices): the first ``k`` entries of ``order`` along ``axis`` and x read there."""
    from tvm import te

    shape = list(order.shape)
    shape[axis] = k
    idx = te.compute(shape, lambda *i: order(*i), name="kiln_topk_indices")

    def value(*i: Any) -> Any:
        src = list(i)
        src[axis] = idx(*i)
        return x(*src)

    return [te.compute(shape, value, name="kiln_topk_values"), idx]


def _k_reason(graph: Graph, node: Node) -> str | None:
    k = graph.inputs_of(node)[1]
    assert k is not None
    if k.type.shape is not None and any(isinstance(d, int) and d != 1 for d in k.type.shape):
        return f"k must hold one value, got shape {list(k.type.shape)}"
    if not k.type.dtype.is_integer:
        return "k must be an integer tensor"
    return None


def _k(ctx: LowerContext, node: Node, k_in: Any, length: Any) -> Any:
    """k' as an int64 PrimExpr: k known symbolically (capped at L), else bound from its run-time
    value (clamped to [0, L])."""
    from tvm import relax, sym, tirx

    vals = values_of(ctx, node, 1, k_in)
    if vals is not None and len(vals) == 1:
        return sym.Analyzer().simplify(tirx.min(_i64(vals[0]), length))
    vec = ctx.emit(relax.op.reshape(relax.op.astype(k_in, "int64"), relax.ShapeExpr([1])))
    k = define_length(ctx, vec, "k")
    return sym.Analyzer().simplify(tirx.min(tirx.max(k, tirx.const(0, "int64")), length))


@lowers_dynamic("TopK", check=_k_reason)
def _topk(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax, topi

    dims = relax_shape(ins[0])
    assert dims is not None, node.describe()
    axis = int(node.attrs.axis) % len(dims)
    k = _k(ctx, node, ins[1], _i64(dims[axis]))
    descending = bool(node.attrs.largest)
    gpu = ctx.target.kind == "cuda"
    sort = topi.gpu.argsort if gpu else topi.argsort  # CPU: a stable sort (ties: lower index first)
    with ctx.target.tvm_target():  # the GPU sort reads the thread limit of the current target
        order = ctx.bb.emit_te(
            lambda v: sort(v, axis=axis, is_ascend=not descending, dtype="int64"),
            ins[0],
            primfunc_name_hint="kiln_topk_argsort",
        )
    out = ctx.bb.emit_te(topk_prefix_te, ins[0], order, k, axis, primfunc_name_hint="kiln_topk")
    return [ctx.emit(relax.TupleGetItem(out, i)) for i in range(2)][: node.num_outputs]
