"""Rules for nodes with a dim known only at run time: the same ops on symbolic Relax shapes.

Ops whose static rule never reads a shape (elementwise, casts, Where, RoiAlign on CPU,
ScatterElements) reuse it. The others get a rule here that computes its output shape from the
input's symbolic dims (PrimExprs) and writes the data movement as a TE compute over them:

    Shape(x)                 = [d_start, ..., d_end-1]           (the dims of x; also tracked as values)
    Reshape(x, s)            = x viewed as s', s'_i = d_i if s_i = 0, numel / prod(others) if s_i = -1
    Unsqueeze / Squeeze / Flatten: reshapes to dims computed from x's
    Slice(x, b, e, k)[.., i, ..] = x[.., b' + i k, ..],  b', e' clamped to [0, d] (k > 0)
    Expand(x, s)[i]          = x[j], j_a = 0 where x's dim a is 1, else i_a
    ConstantOfShape(s)       = full(s, value);   Range(a, l, k)[i] = a + i k, i < max(ceil((l - a) / k), 0)
    Gemm(A, B, C)            = A B' + C (Relax matmul; A has the run-time rows)

A shape given as a tensor is read symbolically when its elements are tracked in ``ctx.values``
(Shape of a run-time-shaped tensor and what is computed from it:
:mod:`backends.tvm.lowering.shape_values`); otherwise it is read at run time
(``tensor_to_shape``: fresh dims). Every output is then cast to its Kiln type's rank and static
dims (:func:`backends.tvm.dynamic_shapes.conform`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import backends.tvm.lowering.elementwise as _elementwise
import backends.tvm.lowering.indexing  # noqa: F401  (the static rules reused below)
from backends.tvm.dynamic_shapes import UNBOUNDED, relax_shape, shape_from_tensor
from backends.tvm.lowering.shape_values import values_of
from backends.tvm.lowering.table import _RULES, LowerContext, lowers_dynamic
from compiler.ir.graph import Graph, Node
from compiler.ops.reduce import reduce_axes

__all__ = ["SHAPE_FREE"]

SHAPE_FREE = (
    *_elementwise._BINARY,
    *_elementwise._UNARY,
    *_elementwise._ACT_OPS,
    "Clip",
    "Identity",
    "Cast",
    "Where",
)
"""Ops whose static rule reads no shape: the same rule lowers them on symbolic shapes."""

for _op_name in SHAPE_FREE:
    _entry = _RULES[_op_name]
    lowers_dynamic(_op_name, check=_entry.check)(_entry.lower)


def _op() -> Any:
    from tvm import relax

    return relax.op


def _i64(v: Any) -> Any:
    from tvm import tirx

    return v if str(getattr(v, "ty", "")) == "int64" else tirx.Cast("int64", v)


def _dims(ctx: LowerContext, node: Node, x: Any, port: int = 0) -> list[Any]:
    """The input's dims as int64 PrimExprs."""
    from tvm import tirx

    dims = relax_shape(x)
    if dims is None:
        t = ctx.in_type(node, port)
        raise AssertionError(f"{node.describe()}: input {port} ({t}) has no Relax shape")
    return [tirx.const(int(d), "int64") if isinstance(d, int) else _i64(d) for d in dims]


def _rank(ctx: LowerContext, node: Node, port: int = 0) -> int:
    return len(ctx.in_type(node, port).shape or ())


def _shape_arg(ctx: LowerContext, node: Node, port: int, x: Any) -> list[Any]:
    """A shape input: its tracked or constant elements, else read at run time."""
    vals = values_of(ctx, node, port, x)
    if vals is not None:
        return vals
    t = ctx.in_type(node, port)
    assert t.shape is not None and isinstance(t.shape[0], int), node.describe()
    return shape_from_tensor(ctx, x, int(t.shape[0]))


def _emit_te(ctx: LowerContext, fn: Callable[..., Any], *args: Any, name: str) -> Any:
    return ctx.bb.emit_te(fn, *args, primfunc_name_hint=name)


def _view(ctx: LowerContext, x: Any, dims: list[Any]) -> Any:
    from tvm import relax

    return ctx.emit(_op().reshape(x, relax.ShapeExpr(dims)))


# ---------------------------------------------------------------- shape values


@lowers_dynamic("Shape")
def _shape(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax, tirx

    dims = _dims(ctx, node, ins[0])
    r = len(dims)
    a = node.attrs
    start = 0 if a.start is None else int(a.start)
    end = r if a.end is None else int(a.end)
    start, end = (min(max(v + r if v < 0 else v, 0), r) for v in (start, end))
    picked = dims[start:end]
    if all(isinstance(d, tirx.IntImm) for d in picked):
        out = ctx.const(np.array([int(d) for d in picked], np.int64))
    else:
        out = ctx.emit(_op().shape_to_tensor(relax.ShapeExpr(picked)))
    ctx.values[out] = picked
    return [out]


def _resolve_reshape(dims: list[Any], target: list[Any], allowzero: bool) -> list[Any]:
    """ONNX Reshape's target with 0 (copy the input dim) and -1 (the rest) resolved."""
    from tvm import tirx

    numel = tirx.const(1, "int64")
    for d in dims:
        numel = numel * d
    out: list[Any] = []
    for i, s in enumerate(target):
        if isinstance(s, tirx.IntImm) and int(s) == 0 and not allowzero:
            out.append(dims[i])
        else:
            out.append(s)
    rest = [i for i, s in enumerate(out) if isinstance(s, tirx.IntImm) and int(s) == -1]
    if rest:
        known = tirx.const(1, "int64")
        for i, s in enumerate(out):
            if i != rest[0]:
                known = known * s
        out[rest[0]] = tirx.floordiv(numel, known)
    return out


def _runtime_reshape_te(shape_t: Any, dims: list[Any], allowzero: bool) -> Any:
    """TE: the reshape target (a run-time tensor) with 0 and -1 resolved against ``dims``."""
    from tvm import te, tirx

    r = int(shape_t.shape[0])
    numel = tirx.const(1, "int64")
    for d in dims:
        numel = numel * d

    def known(j: int) -> Any:
        s = tirx.Cast("int64", shape_t[j])
        if allowzero or j >= len(dims):
            return s
        return tirx.Select(s == 0, dims[j], s)

    prod = tirx.const(1, "int64")
    for j in range(r):
        prod = prod * tirx.Select(known(j) == -1, tirx.const(1, "int64"), known(j))

    def body(i: Any) -> Any:
        val = tirx.const(0, "int64")
        for j in range(r):
            kj = known(j)
            val = tirx.Select(i == j, tirx.Select(kj == -1, tirx.floordiv(numel, prod), kj), val)
        return val

    return te.compute((r,), body, name="kiln_reshape_shape")


@lowers_dynamic("Reshape")
def _reshape(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    dims = _dims(ctx, node, ins[0])
    allowzero = bool(getattr(node.attrs, "allowzero", 0))
    target = values_of(ctx, node, 1, ins[1])
    if target is None:
        resolved = _emit_te(ctx, _runtime_reshape_te, ins[1], dims, allowzero, name="kiln_reshape_shape")
        t = ctx.in_type(node, 1)
        assert t.shape is not None and isinstance(t.shape[0], int)
        out_dims = shape_from_tensor(ctx, resolved, int(t.shape[0]))
    else:
        out_dims = _resolve_reshape(dims, target, allowzero)
    return [_view(ctx, ins[0], out_dims)]


def _axes(ctx: LowerContext, node: Node, rank: int) -> list[int] | None:
    c = ctx.input_const(node, 1)
    if c is None:
        c = getattr(node.attrs, "axes", None)
    if c is None:
        return None
    return sorted(int(a) % rank for a in np.asarray(c).reshape(-1))


def _axes_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if len(ins) > 1 and ins[1] is not None and ins[1].const is None:
        return "axes (input 1) must be a constant for --target"
    return None


@lowers_dynamic("Unsqueeze", check=_axes_reason)
def _unsqueeze(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import tirx

    dims = _dims(ctx, node, ins[0])
    out_rank = _rank(ctx, node) + len(np.asarray(ctx.require_const(node, 1, "axes")).reshape(-1))
    axes = _axes(ctx, node, out_rank) or []
    it = iter(dims)
    out = [tirx.const(1, "int64") if i in axes else next(it) for i in range(out_rank)]
    return [_view(ctx, ins[0], out)]


@lowers_dynamic("Squeeze", check=_axes_reason)
def _squeeze(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    dims = _dims(ctx, node, ins[0])
    axes = _axes(ctx, node, len(dims))
    if axes is None:  # every dim that is 1 (the Kiln type knows which)
        axes = [i for i, d in enumerate(ctx.in_type(node, 0).shape or ()) if d == 1]
    return [_view(ctx, ins[0], [d for i, d in enumerate(dims) if i not in axes])]


@lowers_dynamic("Flatten")
def _flatten(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import tirx

    dims = _dims(ctx, node, ins[0])
    axis = int(node.attrs.axis) % (len(dims) + 1) if dims else 0
    lo, hi = tirx.const(1, "int64"), tirx.const(1, "int64")
    for d in dims[:axis]:
        lo = lo * d
    for d in dims[axis:]:
        hi = hi * d
    return [_view(ctx, ins[0], [lo, hi])]


@lowers_dynamic("Transpose")
def _transpose(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    rank = _rank(ctx, node)
    perm = node.attrs.perm
    axes = list(perm) if perm is not None else list(reversed(range(rank)))
    return [ctx.emit(_op().permute_dims(ins[0], axes))]


def _concat_te(*xs: Any, axis: int) -> Any:
    """TE concat along ``axis`` over symbolic extents."""
    from tvm import te, tirx

    shape = list(xs[0].shape)
    offsets = [tirx.const(0, "int64")]
    for x in xs:
        offsets.append(offsets[-1] + _i64(x.shape[axis]))
    shape[axis] = offsets[-1]

    def body(*i: Any) -> Any:
        k = _i64(i[axis])
        val = None
        for x, lo in zip(xs, offsets[:-1], strict=True):  # the last part starting at or before k
            idx = list(i)
            idx[axis] = tirx.max(k - lo, tirx.const(0, "int64"))
            v = x[tuple(idx)]
            val = v if val is None else tirx.Select(k >= lo, v, val)
        return val

    return te.compute(shape, body, name="kiln_concat")


@lowers_dynamic("Concat")
def _concat(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    xs = [x for x in ins if x is not None]
    axis = int(node.attrs.axis) % _rank(ctx, node)
    if len(xs) == 1:
        return [xs[0]]
    return [_emit_te(ctx, lambda *t: _concat_te(*t, axis=axis), *xs, name="kiln_concat")]


@lowers_dynamic("Gather")
def _gather(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import tirx

    axis = int(node.attrs.axis) % _rank(ctx, node)
    idx = ctx.input_const(node, 1)
    if idx is not None and np.any(idx < 0):
        dim = _dims(ctx, node, ins[0])[axis]
        if isinstance(dim, tirx.IntImm):
            ind = ctx.const(np.where(idx < 0, idx + int(dim), idx).astype(np.int64))
        else:
            from tvm import relax

            d = ctx.emit(_op().shape_to_tensor(relax.ShapeExpr([dim])))
            d = ctx.emit(_op().reshape(d, ()))
            raw = ctx.const(idx.astype(np.int64))
            ind = ctx.emit(_op().where(_op().less(raw, ctx.scalar(0, "int64")), _op().add(raw, d), raw))
    else:
        ind = ins[1]
    return [ctx.emit(_op().take(ins[0], ind, axis))]


def _slice_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    for port, what in ((3, "axes"), (4, "steps")):
        v = ins[port] if port < len(ins) else None
        if v is not None and v.const is None:
            return f"{what} (input {port}) must be a constant for --target"
    steps = ins[4].const if len(ins) > 4 and ins[4] is not None else None
    if steps is not None and np.any(steps <= 0):
        return "negative Slice steps have no TVM lowering"
    return None


def _clamp(v: Any, d: Any) -> Any:
    """ONNX's start/end clamping to [0, d] (v < 0 counts from the end)."""
    from tvm import tirx

    zero = tirx.const(0, "int64")
    if isinstance(v, tirx.IntImm):
        v = int(v)
    if not isinstance(v, int):  # known only at run time
        return tirx.Select(v < 0, tirx.max(d + v, zero), tirx.min(v, d))
    if v >= UNBOUNDED:  # "to the end": d itself (min(v, d) would make v the bound memory plans for)
        return d
    if v <= -UNBOUNDED:
        return zero
    if v < 0:
        return tirx.max(d + tirx.const(v, "int64"), zero)
    return tirx.min(tirx.const(v, "int64"), d)


def _slice_te(x: Any, begins: list[Any], steps: list[int], lengths: list[Any]) -> Any:
    from tvm import te

    def body(*i: Any) -> Any:
        return x[tuple(b + _i64(k) * s for b, k, s in zip(begins, i, steps, strict=True))]

    return te.compute(lengths, body, name="kiln_slice")


@lowers_dynamic("Slice", check=_slice_reason)
def _slice(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import tirx

    dims = _dims(ctx, node, ins[0])
    rank = len(dims)
    starts = _shape_arg(ctx, node, 1, ins[1])
    ends = _shape_arg(ctx, node, 2, ins[2])
    axes_c = ctx.input_const(node, 3)
    steps_c = ctx.input_const(node, 4)
    axes = axes_c.astype(np.int64).ravel() if axes_c is not None else np.arange(len(starts))
    steps = steps_c.astype(np.int64).ravel() if steps_c is not None else np.ones(len(starts), np.int64)
    begins = [tirx.const(0, "int64")] * rank
    strides = [1] * rank
    lengths = list(dims)
    for a, b, e, s in zip(axes, starts, ends, steps, strict=True):
        ax = int(a) % rank
        lo, hi = _clamp(b, dims[ax]), _clamp(e, dims[ax])
        step = int(s)
        begins[ax], strides[ax] = lo, step
        lengths[ax] = tirx.max(tirx.floordiv(hi - lo + step - 1, step), tirx.const(0, "int64"))
    out = _emit_te(ctx, _slice_te, ins[0], begins, strides, lengths, name="kiln_slice")
    return [out]


def _split_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if len(ins) > 1 and ins[1] is not None and ins[1].const is None:
        return "split (input 1) must be a constant for --target"
    x = ins[0]
    assert x is not None and x.type.shape is not None
    axis = int(node.attrs.axis) % len(x.type.shape)
    if not isinstance(x.type.shape[axis], int) and (len(ins) < 2 or ins[1] is None):
        return "Split into num_outputs parts along a run-time dim has no TVM lowering"
    return None


@lowers_dynamic("Split", check=_split_reason)
def _split(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax

    rank = _rank(ctx, node)
    axis = int(node.attrs.axis) % rank
    sizes_c = ctx.input_const(node, 1)
    if sizes_c is not None:
        sizes = [int(v) for v in sizes_c.reshape(-1)]
    else:
        sizes = [int(ctx.out_type(node, i).static_shape[axis]) for i in range(node.num_outputs)]
    cuts = [int(v) for v in np.cumsum(sizes)[:-1]]
    if not cuts:
        return [ins[0]]
    parts = ctx.emit(_op().split(ins[0], cuts, axis))
    return [ctx.emit(relax.TupleGetItem(parts, i)) for i in range(node.num_outputs)]


def _expand_te(x: Any, out: list[Any]) -> Any:
    """ONNX Expand (bidirectional broadcast) over symbolic dims."""
    from tvm import te, tirx

    xs = [_i64(d) for d in x.shape]
    lead = len(out) - len(xs)
    shape = list(out[:lead])
    for xd, od in zip(xs, out[lead:], strict=True):
        if isinstance(xd, tirx.IntImm) and int(xd) == 1:
            shape.append(od)
        elif isinstance(od, tirx.IntImm) and int(od) == 1:
            shape.append(xd)
        else:
            shape.append(tirx.max(xd, od))

    def body(*i: Any) -> Any:
        idx = []
        for k, xd in enumerate(xs):
            ik = _i64(i[lead + k])
            if isinstance(xd, tirx.IntImm):
                idx.append(tirx.const(0, "int64") if int(xd) == 1 else ik)
            else:
                idx.append(tirx.Select(xd == 1, tirx.const(0, "int64"), ik))
        return x[tuple(idx)]

    return te.compute(shape, body, name="kiln_expand")


@lowers_dynamic("Expand")
def _expand(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    target = _shape_arg(ctx, node, 1, ins[1])
    rank = max(len(target), _rank(ctx, node))
    target = [*([1] * (rank - len(target))), *target]
    from tvm import tirx

    target = [tirx.const(v, "int64") if isinstance(v, int) else v for v in target]
    return [_emit_te(ctx, _expand_te, ins[0], target, name="kiln_expand")]


@lowers_dynamic("ConstantOfShape")
def _constant_of_shape(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax

    dims = _shape_arg(ctx, node, 0, ins[0])
    value = node.attrs.value
    dtype = ctx.out_type(node).dtype.numpy.name
    fill = ctx.scalar(np.asarray(value).reshape(-1)[0] if value is not None else 0, dtype)
    return [ctx.emit(_op().full(relax.ShapeExpr(dims), fill, dtype))]


def _range_te(start: Any, delta: Any, n: Any, dtype: str) -> Any:
    from tvm import te, tirx

    return te.compute((n,), lambda i: start[()] + tirx.Cast(dtype, i) * delta[()], name="kiln_range")


@lowers_dynamic("Range")
def _range(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """n = max(ceil((limit - start) / delta), 0), read at run time (a float range too)."""
    from backends.tvm.dynamic_shapes import define_length

    op = _op()
    dtype = ctx.out_type(node).dtype.numpy.name
    start, limit, delta = (ctx.emit(op.reshape(x, ())) for x in ins[:3])
    span = op.divide(op.astype(op.subtract(limit, start), "float64"), op.astype(delta, "float64"))
    count = op.maximum(op.astype(op.ceil(span), "int64"), ctx.scalar(0, "int64"))
    n = define_length(ctx, ctx.emit(op.reshape(count, (1,))))
    return [_emit_te(ctx, _range_te, start, delta, n, dtype, name="kiln_range")]


# ---------------------------------------------------------------- compute


_REDUCE = {
    "ReduceMean": "mean",
    "ReduceSum": "sum",
    "ReduceMax": "max",
    "ReduceMin": "min",
    "ReduceProd": "prod",
}


def _reduce_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if len(ins) > 1 and ins[1] is not None and ins[1].const is None:
        return "axes (input 1) must be a constant for --target"
    return None


@lowers_dynamic(*_REDUCE, check=_reduce_reason)
def _reduce(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    rank = _rank(ctx, node)
    axes = reduce_axes(ctx.input_const(node, 1), rank, bool(node.attrs.noop_with_empty_axes))
    if not axes and node.attrs.noop_with_empty_axes:
        return [ins[0]]
    fn = getattr(_op(), _REDUCE[node.op])
    return [ctx.emit(fn(ins[0], list(axes), keepdims=bool(node.attrs.keepdims)))]


@lowers_dynamic("Softmax", "LogSoftmax")
def _softmax(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    fn = _op().nn.softmax if node.op == "Softmax" else _op().nn.log_softmax
    return [ctx.emit(fn(ins[0], int(node.attrs.axis) % _rank(ctx, node)))]


def _gemm_reason(graph: Graph, node: Node) -> str | None:
    from passes.normalize_gemm import canonical_gemm_reason

    return canonical_gemm_reason(node)


@lowers_dynamic("Gemm", check=_gemm_reason)
def _gemm(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """y = A @ B' + C (canonical Gemm: transA = 0, alpha = beta = 1)."""
    from backends.tvm.lowering.dynamic_dense import dynamic_dense

    op = _op()
    w = ctx.input_const(node, 1)
    c = ctx.input_const(node, 2) if len(ins) > 2 and ins[2] is not None else None
    n_out = None if w is None else (w.shape[0] if node.attrs.transB else w.shape[1])
    bias_ok = len(ins) < 3 or ins[2] is None or (c is not None and c.size == n_out)
    if ctx.target.is_cpu and w is not None and w.dtype == np.float32 and bias_ok:
        w_kn = w.T if node.attrs.transB else w
        y = dynamic_dense(ctx, ins[0], w_kn, None if c is None else c.reshape(-1))
        if y is not None:
            return [y]
    if w is not None:
        wt = ctx.const(np.ascontiguousarray(w.T if node.attrs.transB else w))
    else:
        wt = ctx.emit(op.permute_dims(ins[1], [1, 0])) if node.attrs.transB else ins[1]
    y = ctx.emit(op.matmul(ins[0], wt))
    if len(ins) > 2 and ins[2] is not None:
        y = ctx.emit(op.add(y, ins[2]))
    return [y]


@lowers_dynamic("MatMul")
def _matmul(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [ctx.emit(_op().matmul(ins[0], ins[1]))]


@lowers_dynamic("ScatterElements")
def _scatter_elements(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from backends.tvm.lowering.scatter_elements import emit_scatter_elements

    axis = int(node.attrs.axis) % _rank(ctx, node)
    return [emit_scatter_elements(ctx, ins, axis, node.attrs.reduction)]


_roi = _RULES["RoiAlign"]


@lowers_dynamic("RoiAlign", check=_roi.check)
def _roi_align(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """The static rule's Relax form (TOPI's roi_align over the run-time number of ROIs)."""
    from backends.tvm.lowering.indexing import roi_align_rows

    a = node.attrs
    rows, pooled, scale, half = roi_align_rows(ctx, node, ins)
    if ctx.target.kind != "cuda":
        return [ctx.emit(_op().vision.roi_align(ins[0], rows, pooled, scale, int(a.sampling_ratio), half))]
    return [_roi_align_gpu(ctx, ins[0], rows, pooled, scale, int(a.sampling_ratio), half)]


def _roi_align_gpu(
    ctx: LowerContext, x: Any, rows: Any, pooled: tuple[int, int], scale: float, ratio: int, half: bool
) -> Any:
    """TOPI's roi_align over symbolic ROIs, bound by :func:`bind_gpu` (dlight cannot bind its nest)."""
    from tvm import relax, te, tirx, topi

    from backends.tvm.lowering.gpu_bind import bind_gpu

    x_dims, r_dims = relax_shape(x), relax_shape(rows)
    assert x_dims is not None and r_dims is not None
    dtype = rows.ty.dtype
    x_t = te.placeholder(
        [d if isinstance(d, tirx.IntImm) else tirx.Var("d", "int64") for d in x_dims], x.ty.dtype, "x"
    )
    r_t = te.placeholder((tirx.Var("r", "int64"), 5), dtype, "rois")  # bound from the call's rows
    y_t = topi.vision.roi_align_nchw(x_t, r_t, pooled, scale, 0, ratio, half)
    gv = ctx.bb.add_func(bind_gpu(te.create_prim_func([x_t, r_t, y_t]), ctx.target), "roi_align")
    out = relax.TensorType([r_dims[0], x_dims[1], *pooled], x.ty.dtype)
    return ctx.emit(relax.call_tir(gv, [x, rows], out))
