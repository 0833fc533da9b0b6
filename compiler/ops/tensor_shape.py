"""Shape-changing ops that keep values and element order: Reshape, Flatten,
Transpose, Squeeze, Unsqueeze, Expand, plus the shape queries Shape and Size.

Every op takes its opset-21 ONNX form (axes and shapes as inputs). When the
output shape depends on an input's value and that input is not a constant,
inference keeps the rank where it can and marks unknown sizes ``"?"``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from compiler.ir.types import Dim, DType, Shape, TensorType
from compiler.ops.inputs import arg, const_len, first, int_const
from compiler.ops.registry import InferContext, NoAttrs, OpDef, QuantPolicy, register
from compiler.ops.shapes import UNKNOWN, broadcast, dims_of_const, normalize_axes, product

__all__ = ["ReshapeAttrs", "FlattenAttrs", "TransposeAttrs", "ShapeAttrs", "reshape_dims"]


# ---------------------------------------------------------------- Reshape
@dataclass(frozen=True)
class ReshapeAttrs:
    """Reshape: with ``allowzero=0`` a 0 in the shape copies the input dim; with 1 it means size 0."""

    allowzero: int = 0


def reshape_dims(src: Shape, target: list[int], allowzero: int) -> Shape:
    """Output shape of Reshape(src, target); raises ValueError on an impossible target.

    A 0 copies ``src``'s dim (unless ``allowzero``), one -1 takes the remaining
    size. Symbols cancel by name, so ``["N",3,4] -> [-1, 12]`` gives ``["N", 12]``.
    """
    if target.count(-1) > 1 or any(v < -1 for v in target):
        raise ValueError(f"invalid shape {target}")
    if allowzero and 0 in target and -1 in target:
        raise ValueError(f"shape {target} has both 0 and -1 with allowzero=1")
    out: list[Dim] = []
    for i, v in enumerate(target):
        if v == 0 and not allowzero:
            if i >= len(src):
                raise ValueError(f"shape {target} copies dim {i} of a rank-{len(src)} input")
            out.append(src[i])
        else:
            out.append(v)
    known = [d for d in out if d != -1]
    num, den = _cancel(list(src), known)
    if -1 in out:
        fill: Dim
        if any(isinstance(d, str) for d in den):
            fill = UNKNOWN
        elif not any(isinstance(d, str) for d in num):
            n, d = int(product(num)), int(product(den))
            if d == 0 or n % d:
                raise ValueError(f"cannot reshape {list(src)} to {target}")
            fill = n // d
        else:
            syms = [d for d in num if isinstance(d, str)]
            ints = int(product([d for d in num if isinstance(d, int)]))
            fill = syms[0] if len(syms) == 1 and syms[0] != UNKNOWN and ints == product(den) else UNKNOWN
        out[out.index(-1)] = fill
    elif all(isinstance(d, int) for d in num + den) and product(num) != product(den):
        raise ValueError(f"cannot reshape {list(src)} ({product(list(src))} elements) to {target}")
    return tuple(out)


def _cancel(num: list[Dim], den: list[Dim]) -> tuple[list[Dim], list[Dim]]:
    """Remove named symbols (not ``"?"``) that occur on both sides, one for one."""
    common = Counter(d for d in num if isinstance(d, str) and d != UNKNOWN) & Counter(
        d for d in den if isinstance(d, str) and d != UNKNOWN
    )
    for sym, k in common.items():
        for side in (num, den):
            for _ in range(k):
                side.remove(sym)
    return num, den


def _infer_reshape(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    target = int_const(ctx, 1, "shape")
    if target is None:
        n = const_len(ctx, 1)
        return [t.with_shape(None if n is None else (UNKNOWN,) * n)]
    if t.shape is None:
        if -1 in target or (0 in target and not ctx.attrs.allowzero):
            return [t.with_shape(tuple(UNKNOWN if v in (0, -1) else v for v in target))]
        return [t.with_shape(tuple(target))]
    try:
        return [t.with_shape(reshape_dims(t.shape, target, ctx.attrs.allowzero))]
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None


def _ref_reshape(ins: list[np.ndarray | None], a: ReshapeAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    target = dims_of_const(arg(ins, 1))
    shape = [x.shape[i] if v == 0 and not a.allowzero else v for i, v in enumerate(target)]
    return [x.reshape(shape)]


register(
    OpDef(
        "Reshape",
        _infer_reshape,
        _ref_reshape,
        ReshapeAttrs,
        inputs=(2, 2),
        quant=QuantPolicy.PASSTHROUGH,
        doc="y = x with shape `shape` (0 copies the input dim unless allowzero, -1 infers one dim)",
    )
)


# ---------------------------------------------------------------- Flatten
@dataclass(frozen=True)
class FlattenAttrs:
    """Flatten to 2-D: ``(prod(d[:axis]), prod(d[axis:]))``; axis in ``[-r, r]``."""

    axis: int = 1


def _flatten_axis(axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a <= rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return a


def _infer_flatten(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if t.shape is None:
        return [t.with_shape((1 if ctx.attrs.axis == 0 else UNKNOWN, UNKNOWN))]
    try:
        a = _flatten_axis(ctx.attrs.axis, len(t.shape))
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return [t.with_shape((_fold(t.shape[:a]), _fold(t.shape[a:])))]


def _fold(dims: Shape) -> Dim:
    """Product of dims that keeps a lone symbol: ``["N", 1] -> "N"``."""
    rest = [d for d in dims if d != 1]
    return rest[0] if len(rest) == 1 else product(rest)


def _ref_flatten(ins: list[np.ndarray | None], a: FlattenAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    ax = _flatten_axis(a.axis, x.ndim)
    return [x.reshape(int(np.prod(x.shape[:ax], dtype=np.int64)), int(np.prod(x.shape[ax:], dtype=np.int64)))]


register(
    OpDef(
        "Flatten",
        _infer_flatten,
        _ref_flatten,
        FlattenAttrs,
        quant=QuantPolicy.PASSTHROUGH,
        doc="y = reshape(x, (prod(d[:axis]), prod(d[axis:])))",
    )
)


# ---------------------------------------------------------------- Transpose
@dataclass(frozen=True)
class TransposeAttrs:
    """Transpose: output dim i is input dim ``perm[i]``; no perm reverses the axes."""

    perm: tuple[int, ...] | None = None


def _perm(perm: tuple[int, ...] | None, rank: int) -> list[int]:
    if perm is None:
        return list(range(rank - 1, -1, -1))
    if sorted(perm) != list(range(rank)):
        raise ValueError(f"perm {list(perm)} is not a permutation of rank {rank}")
    return list(perm)


def _infer_transpose(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    perm = ctx.attrs.perm
    if t.shape is None:
        return [t.with_shape(None if perm is None else (UNKNOWN,) * len(perm))]
    try:
        p = _perm(perm, len(t.shape))
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return [t.with_shape(tuple(t.shape[i] for i in p))]


register(
    OpDef(
        "Transpose",
        _infer_transpose,
        lambda ins, a, n: [np.ascontiguousarray(np.transpose(first(ins), _perm(a.perm, first(ins).ndim)))],
        TransposeAttrs,
        quant=QuantPolicy.PASSTHROUGH,
        doc="y = transpose(x, perm)",
    )
)


# ---------------------------------------------------------------- Squeeze / Unsqueeze
def _infer_squeeze(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if not ctx.has(1):
        # Which symbolic dims are 1 is unknown, so the rank is too.
        if t.shape is None or not t.is_static:
            return [t.with_shape(None)]
        return [t.with_shape(tuple(d for d in t.shape if d != 1))]
    axes = int_const(ctx, 1, "axes")
    if t.shape is None:
        return [t.with_shape(None)]
    if axes is None:
        n = const_len(ctx, 1)
        return [t.with_shape(None if n is None else (UNKNOWN,) * (len(t.shape) - n))]
    try:
        ax = normalize_axes(axes, len(t.shape), "axes")
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    if len(set(ax)) != len(ax):
        raise ctx.fail(f"repeated axes {axes}")
    bad = [a for a in ax if isinstance(t.shape[a], int) and t.shape[a] != 1]
    if bad:
        raise ctx.fail(f"cannot squeeze axes {bad} of shape {list(t.shape)}: size is not 1")
    return [t.with_shape(tuple(d for i, d in enumerate(t.shape) if i not in ax))]


def _ref_squeeze(ins: list[np.ndarray | None], a: NoAttrs, n: int) -> list[np.ndarray]:
    x, axes = first(ins), arg(ins, 1)
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(normalize_axes(dims_of_const(axes), x.ndim)))]


register(
    OpDef(
        "Squeeze",
        _infer_squeeze,
        _ref_squeeze,
        inputs=(1, 2),
        quant=QuantPolicy.PASSTHROUGH,
        doc="y = x without the size-1 dims listed in input `axes` (all size-1 dims if absent)",
    )
)


def _unsqueeze_shape(shape: Shape, axes: list[int]) -> Shape:
    rank = len(shape) + len(axes)
    ax = normalize_axes(axes, rank, "axes")
    if len(set(ax)) != len(ax):
        raise ValueError(f"repeated axes {axes}")
    rest = iter(shape)
    return tuple(1 if i in ax else next(rest) for i in range(rank))


def _infer_unsqueeze(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    axes = int_const(ctx, 1, "axes")
    if t.shape is None:
        return [t.with_shape(None)]
    if axes is None:
        n = const_len(ctx, 1)
        return [t.with_shape(None if n is None else (UNKNOWN,) * (len(t.shape) + n))]
    try:
        return [t.with_shape(_unsqueeze_shape(t.shape, axes))]
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None


def _ref_unsqueeze(ins: list[np.ndarray | None], a: NoAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    return [x.reshape([int(d) for d in _unsqueeze_shape(x.shape, dims_of_const(arg(ins, 1)))])]


register(
    OpDef(
        "Unsqueeze",
        _infer_unsqueeze,
        _ref_unsqueeze,
        inputs=(2, 2),
        quant=QuantPolicy.PASSTHROUGH,
        doc="y = x with size-1 dims inserted at the output positions in input `axes`",
    )
)


# ---------------------------------------------------------------- Expand
def _infer_expand(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    target = int_const(ctx, 1, "shape")
    if target is None:
        n = const_len(ctx, 1)
        if n is None or t.shape is None:
            return [t.with_shape(None)]
        rank = max(n, len(t.shape))
        src = (1,) * (rank - len(t.shape)) + t.shape
        # Where the target may be longer than the input, a target dim of 1 keeps the input dim.
        keep = rank - n
        return [
            t.with_shape(
                tuple(
                    d if i < keep or (isinstance(d, int) and d != 1) else UNKNOWN for i, d in enumerate(src)
                )
            )
        ]
    if any(v < 0 for v in target):
        raise ctx.fail(f"negative dim in shape {target}")
    if t.shape is None:
        return [t.with_shape(None)]
    try:
        return [t.with_shape(broadcast([t.shape, tuple(target)], ctx.where))]
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None


def _ref_expand(ins: list[np.ndarray | None], a: NoAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    shape = np.broadcast_shapes(x.shape, tuple(dims_of_const(arg(ins, 1))))
    return [np.broadcast_to(x, shape).copy()]


register(
    OpDef(
        "Expand",
        _infer_expand,
        _ref_expand,
        inputs=(2, 2),
        doc="y = x broadcast with input `shape` (two-way numpy broadcasting)",
    )
)


# ---------------------------------------------------------------- Shape / Size
@dataclass(frozen=True)
class ShapeAttrs:
    """Shape: dims ``[start, end)`` of the input's shape; negatives count from the back, then clamp."""

    start: int = 0
    end: int | None = None


def _infer_shape(ctx: InferContext) -> list[TensorType]:
    s = ctx.type(0).shape
    if s is None:
        return [TensorType(DType.INT64, (UNKNOWN,))]
    return [TensorType(DType.INT64, (len(s[slice(ctx.attrs.start, ctx.attrs.end)]),))]


register(
    OpDef(
        "Shape",
        _infer_shape,
        lambda ins, a, n: [np.array(first(ins).shape[slice(a.start, a.end)], dtype=np.int64)],
        ShapeAttrs,
        doc="y = int64(shape(x)[start:end])",
    )
)
register(
    OpDef(
        "Size",
        lambda ctx: [TensorType(DType.INT64, ())],
        lambda ins, a, n: [np.array(first(ins).size, dtype=np.int64)],
        doc="y = int64 number of elements of x (a scalar)",
    )
)
