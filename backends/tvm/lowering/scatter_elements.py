"""Kiln's ScatterElements kernel, for static and run-time (symbolic) shapes, CPU and CUDA.

With data D (rank r), indices I and updates U of one shape S, axis a and the reduction f
(update: f(o, u) = u; add: o + u; mul: o * u; max; min)::

    out = copy(D)
    for p in S, in row-major order:
        q = p;  q[a] = I[p] + (I[p] < 0) * D.shape[a]
        out[q] = f(out[q], U[p])

Two positions p, p' whose coordinates off the axis differ write to different q (q keeps p's
non-axis coordinates), so the loops over the non-axis dims of S are independent and only the loop
over S[a] is ordered: it runs serially, innermost, ascending (a duplicate index with ``update``
keeps the last one, onnxruntime's order). On CPU the copy's and the scatter's outermost loops are
parallel; on CUDA each phase is one launch, one thread per element (copy) or per non-axis position
(scatter), the second launch ordered after the first by the stream.

The PrimFunc takes fresh variables for the symbolic dims, so one function (named by its
:class:`ScatterElementsSpec`) serves every call of the same ranks, dtypes, axis and reduction.
Its loops are plain integer loops over the buffers (no TOPI nest): it compiles in well under a
second whatever the shapes (TOPI's form over four symbolic dims takes minutes in LLVM).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from backends.tvm.dynamic_shapes import relax_shape
from backends.tvm.kernels.kernel import mark_scheduled, spec_key
from backends.tvm.lowering.table import LowerContext

__all__ = ["ScatterElementsSpec", "scatter_elements_func", "emit_scatter_elements", "REDUCTIONS", "combine"]

REDUCTIONS = ("none", "add", "mul", "max", "min")
"""ONNX's ScatterElements reductions."""

_THREADS = 256  # CUDA threads per block


@dataclass(frozen=True)
class ScatterElementsSpec:
    """One kernel: ``data_dims`` and ``index_dims`` hold each static dim, -1 for a symbolic one."""

    data_dims: tuple[int, ...]
    index_dims: tuple[int, ...]
    axis: int
    reduction: str
    dtype: str
    index_dtype: str
    gpu: bool

    @property
    def name(self) -> str:
        return f"kiln_scatter_elements_{spec_key(self)}"


def _i64(v: Any) -> Any:
    from tvm import tirx

    if isinstance(v, int):
        return tirx.const(v, "int64")
    return v if str(getattr(v, "dtype", getattr(v, "ty", ""))) == "int64" else tirx.Cast("int64", v)


def _dims(spec_dims: tuple[int, ...], prefix: str) -> list[Any]:
    from tvm import tirx

    return [
        tirx.const(d, "int64") if d >= 0 else tirx.Var(f"{prefix}{k}", "int64")
        for k, d in enumerate(spec_dims)
    ]


def combine(reduction: str) -> Any:
    """f(old, new) of a scatter reduction (ONNX's ``none`` or TOPI's ``update``: replace)."""
    from tvm import tirx

    return {
        "none": lambda old, new: new,
        "update": lambda old, new: new,
        "add": lambda old, new: old + new,
        "mul": lambda old, new: old * new,
        "max": tirx.max,
        "min": tirx.min,
    }[reduction]


def _unravel(flat: Any, dims: list[Any]) -> list[Any]:
    """Row-major coordinates of ``flat`` in ``dims``."""
    from tvm import tirx

    coords: list[Any] = []
    rest = flat
    for d in reversed(dims):
        coords.insert(0, tirx.floormod(rest, d))
        rest = tirx.floordiv(rest, d)
    return coords


def _product(dims: list[Any]) -> Any:
    from tvm import sym, tirx

    out = tirx.const(1, "int64")
    for d in dims:
        out = out * d
    return sym.Analyzer().simplify(out)


@contextlib.contextmanager
def _cpu_nest(dims: list[Any]) -> Any:
    """Nested loops over ``dims`` (the outermost parallel); yields their variables."""
    from tvm.script.ir_builder import tirx as T

    with contextlib.ExitStack() as stack:
        coords = [stack.enter_context((T.parallel if k == 0 else T.serial)(0, d)) for k, d in enumerate(dims)]
        yield coords


@contextlib.contextmanager
def _gpu_nest(dims: list[Any]) -> Any:
    """One launch of ``ceil(prod(dims) / 256)`` blocks of 256 threads, a thread per position;
    yields the coordinates of its position (inside the bounds guard)."""
    from tvm import te, tirx
    from tvm.script.ir_builder import tirx as T

    total = _product(dims)
    blocks = tirx.max(tirx.floordiv(total + (_THREADS - 1), _THREADS), 1)  # an empty tensor: 1
    bx, tx = te.thread_axis("blockIdx.x"), te.thread_axis("threadIdx.x")
    with T.attr(bx, "thread_extent", blocks), T.attr(tx, "thread_extent", _THREADS):
        flat = T.bind(_i64(bx.var) * _THREADS + _i64(tx.var))
        with T.If(flat < total), T.Then():
            yield _unravel(flat, dims)


def scatter_elements_func(spec: ScatterElementsSpec) -> Any:
    """The scheduled PrimFunc (data, indices, updates, out) of ``spec`` (module docstring)."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    ddims, idims = _dims(spec.data_dims, "d"), _dims(spec.index_dims, "i")
    data = te.placeholder(ddims, spec.dtype, "data")
    indices = te.placeholder(idims, spec.index_dtype, "indices")
    updates = te.placeholder(idims, spec.dtype, "updates")
    a, f = spec.axis, combine(spec.reduction)
    nest = _gpu_nest if spec.gpu else _cpu_nest
    others = [d for k, d in enumerate(idims) if k != a]

    def gen(ins: Any, outs: Any) -> Any:
        src, idx, upd = (T.buffer_proxy(b) for b in ins)
        out = T.buffer_proxy(outs[0])
        with IRBuilder() as ib, T.seq_scope():
            with nest(ddims) as c:
                out[tuple(c)] = src[tuple(c)]
            with nest(others) as rest, T.serial(0, idims[a]) as j:
                p = [*rest[:a], j, *rest[a:]]
                i = T.bind(_i64(idx[tuple(p)]))
                q = list(p)
                q[a] = tirx.if_then_else(i < 0, i + ddims[a], i)
                out[tuple(q)] = f(out[tuple(q)], upd[tuple(p)])
        return ib.get()

    buf = tirx.decl_buffer(ddims, spec.dtype, "scatter_out")
    y = te.extern([ddims], [data, indices, updates], gen, dtype=spec.dtype, out_buffers=[buf], name=spec.name)
    func = te.create_prim_func([data, indices, updates, y])
    func = mark_scheduled(func, "scatter_elements", "scatter", "cuda" if spec.gpu else "generic")
    if spec.gpu:
        from backends.tvm.cuda_build import SCHEDULED_ATTR

        func = func.with_attr(SCHEDULED_ATTR, True)
    return func.with_attr("global_symbol", spec.name)


def _static_dims(dims: list[Any]) -> tuple[int, ...]:
    from tvm import tirx

    return tuple(int(d) if isinstance(d, tirx.IntImm) else -1 for d in dims)


def emit_scatter_elements(ctx: LowerContext, ins: list[Any], axis: int, reduction: str) -> Any:
    """``ScatterElements(data, indices, updates)`` with ``axis`` in [0, rank) and ONNX's
    ``reduction`` as a call of Kiln's kernel (added once per spec)."""
    from tvm import relax

    from backends.tvm.kernel_report import kernel_entry

    data, indices = ins[0], ins[1]
    ddims, idims = relax_shape(data), relax_shape(indices)
    if ddims is None or idims is None:
        raise ValueError("ScatterElements needs data and indices of known rank")
    spec = ScatterElementsSpec(
        _static_dims(ddims),
        _static_dims(idims),
        axis,
        reduction,
        str(data.ty.dtype),
        str(indices.ty.dtype),
        ctx.target.kind == "cuda",
    )
    gv = ctx.kernels.get(spec.name)
    if gv is None:
        func = scatter_elements_func(spec)
        gv = ctx.bb.add_func(func, spec.name)
        ctx.kernels[spec.name] = gv
        ctx.kernel_log.append(kernel_entry(spec.name, func))
    out = relax.TensorType(ddims, data.ty.dtype)
    return ctx.emit(relax.call_tir(gv, [data, indices, ins[2]], out))
