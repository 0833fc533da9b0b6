"""Data-movement ops: Concat, Split, Slice, Pad, Tile and Where, plus the
generators ConstantOfShape and Range.

Every op takes its opset-21 ONNX form (starts/ends/pads/split/repeats as
inputs). When an output shape depends on a non-constant input, inference
keeps the rank and marks the affected sizes ``"?"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.types import Dim, DType, TensorType
from compiler.ops.inputs import arg, const_len, first, int_const
from compiler.ops.registry import (
    AttrError,
    InferContext,
    Layout,
    NoAttrs,
    OpDef,
    QuantPolicy,
    QuantSpec,
    register,
)
from compiler.ops.shapes import (
    UNKNOWN,
    broadcast_all,
    dims_of_const,
    merge_dim,
    normalize_axes,
    normalize_axis,
    slice_bounds,
    sum_dims,
)

__all__ = [
    "ConcatAttrs",
    "SplitAttrs",
    "PadAttrs",
    "ConstantOfShapeAttrs",
    "split_sizes",
    "padded_dim",
    "range_count",
]

# A bound at or beyond +-_FULL_END covers a whole symbolic axis (exporters use INT32/64 max and min);
# ends of exactly INT32/64 max mean "to the end in the step's direction" (see ``slice_bounds``).
_FULL_END = 2**31 - 1
_INT_MAXES = (2**31 - 1, 2**63 - 1)


def _fail(ctx: InferContext, exc: ValueError) -> Exception:
    return ctx.fail(str(exc))


# ---------------------------------------------------------------- Concat
@dataclass(frozen=True)
class ConcatAttrs:
    """Concat along ``axis`` (required, may be negative)."""

    axis: int


def _infer_concat(ctx: InferContext) -> list[TensorType]:
    ts = [ctx.type(i) for i in range(len(ctx.types))]
    if any(t.dtype != ts[0].dtype for t in ts):
        raise ctx.fail(f"input dtypes differ: {', '.join(t.dtype.short for t in ts)}")
    shapes = [t.shape for t in ts if t.shape is not None]
    if not shapes:
        return [ts[0].with_shape(None)]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise ctx.fail(f"input ranks differ: {[list(s) for s in shapes]}")
    try:
        axis = normalize_axis(ctx.attrs.axis, rank, "axis")
    except ValueError as exc:
        raise _fail(ctx, exc) from None
    out: list[Dim] = list(shapes[0])
    for s in shapes[1:]:
        for i, d in enumerate(s):
            if i != axis:
                m = merge_dim(out[i], d)
                if m is None:
                    raise ctx.fail(f"dim {i} differs: {[list(s) for s in shapes]}")
                out[i] = m
    axis_dims = [s[axis] for s in shapes] + [UNKNOWN] * (len(ts) - len(shapes))
    out[axis] = sum_dims(axis_dims)
    return [ts[0].with_shape(tuple(out))]


def _ref_concat(ins: list[np.ndarray | None], a: ConcatAttrs, n: int) -> list[np.ndarray]:
    xs = [np.asarray(x) for x in ins if x is not None]
    return [np.concatenate(xs, axis=normalize_axis(a.axis, xs[0].ndim))]


register(
    OpDef(
        "Concat",
        _infer_concat,
        _ref_concat,
        ConcatAttrs,
        inputs=(1, -1),
        quant=QuantPolicy.ACTIVATION,
        qspec=QuantSpec(activations=None, weight=None, bias=None, shares_output_grid=True),
        doc="y = concatenate(inputs, axis)",
    )
)


# ---------------------------------------------------------------- Split
@dataclass(frozen=True)
class SplitAttrs:
    """Split along ``axis`` by the ``split`` input or into ``num_outputs`` parts (exactly one is given)."""

    axis: int = 0
    num_outputs: int | None = None


def split_sizes(dim: int, parts: int) -> list[int]:
    """Part sizes for ``num_outputs=parts``: ``ceil(dim / parts)`` each, the last one the rest (maybe 0)."""
    chunk = -(-dim // parts)
    last = dim - chunk * (parts - 1)
    if last < 0:
        raise ValueError(f"dim {dim} cannot be split into {parts} parts of size {chunk}")
    return [chunk] * (parts - 1) + [last]


def _infer_split(ctx: InferContext) -> list[TensorType]:
    t, n, num = ctx.type(0), ctx.num_outputs, ctx.attrs.num_outputs
    if (num is None) != ctx.has(1):
        raise ctx.fail("needs exactly one of the split input and the num_outputs attribute")
    if num is not None and num != n:
        raise ctx.fail(f"num_outputs={num} but the node has {n} outputs")
    if t.shape is None:
        return [t] * n
    try:
        axis = normalize_axis(ctx.attrs.axis, len(t.shape), "axis")
    except ValueError as exc:
        raise _fail(ctx, exc) from None
    dim = t.shape[axis]
    sizes: list[Dim]
    if ctx.has(1):
        split = int_const(ctx, 1, "split")
        if split is None:
            sizes = [UNKNOWN] * n
        elif len(split) != n or any(v < 0 for v in split) or (isinstance(dim, int) and sum(split) != dim):
            raise ctx.fail(f"split {split} does not cut dim {dim} into {n} outputs")
        else:
            sizes = list(split)
    elif isinstance(dim, int):
        try:
            sizes = list(split_sizes(dim, n))
        except ValueError as exc:
            raise _fail(ctx, exc) from None
    else:
        sizes = [dim if n == 1 else UNKNOWN] * n
    return [t.with_shape(t.shape[:axis] + (s,) + t.shape[axis + 1 :]) for s in sizes]


def _ref_split(ins: list[np.ndarray | None], a: SplitAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    axis = normalize_axis(a.axis, x.ndim)
    s = arg(ins, 1)
    sizes = dims_of_const(s) if s is not None else split_sizes(x.shape[axis], n)
    if len(sizes) != n or sum(sizes) != x.shape[axis]:
        raise ValueError(f"split {sizes} does not cut dim {x.shape[axis]} into {n} outputs")
    return [p.copy() for p in np.split(x, np.cumsum(sizes)[:-1], axis=axis)]


register(
    OpDef(
        "Split",
        _infer_split,
        _ref_split,
        SplitAttrs,
        inputs=(1, 2),
        outputs=(1, -1),
        quant=QuantPolicy.PASSTHROUGH,
        doc="outputs = consecutive parts of x along axis",
    )
)


# ---------------------------------------------------------------- Slice
def _slice_dim(d: Dim, start: int, end: int, step: int) -> Dim:
    if isinstance(d, int):
        return slice_bounds(d, start, end, step)[2]
    forward = step == 1 and (start == 0 or start <= -_FULL_END) and end >= _FULL_END
    backward = step == -1 and (start == -1 or start >= _FULL_END) and (end <= -_FULL_END or end in _INT_MAXES)
    full = forward or backward
    return d if full else UNKNOWN


def _infer_slice(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if t.shape is None:
        return [t]
    rank = len(t.shape)
    starts, ends = int_const(ctx, 1, "starts"), int_const(ctx, 2, "ends")
    axes = int_const(ctx, 3, "axes") if ctx.has(3) else None
    steps = int_const(ctx, 4, "steps") if ctx.has(4) else None
    if ctx.has(3) and axes is None:
        return [t.with_shape((UNKNOWN,) * rank)]
    n = len(starts) if starts is not None else len(ends) if ends is not None else const_len(ctx, 1)
    if axes is None:
        if n is None:
            return [t.with_shape((UNKNOWN,) * rank)]
        axes = list(range(n))
    try:
        ax = normalize_axes(axes, rank, "axes")
    except ValueError as exc:
        raise _fail(ctx, exc) from None
    if len(set(ax)) != len(ax):
        raise ctx.fail(f"repeated axes {axes}")
    lens = {len(v) for v in (starts, ends, steps) if v is not None} | {len(ax)}
    if len(lens) != 1:
        raise ctx.fail(f"starts/ends/axes/steps lengths differ: {starts}, {ends}, {axes}, {steps}")
    if steps is not None and 0 in steps:
        raise ctx.fail(f"steps {steps} contain 0")
    out = list(t.shape)
    for k, a in enumerate(ax):
        if starts is None or ends is None or (ctx.has(4) and steps is None):
            out[a] = UNKNOWN
        else:
            out[a] = _slice_dim(t.shape[a], starts[k], ends[k], steps[k] if steps else 1)
    return [t.with_shape(tuple(out))]


def _ref_slice(ins: list[np.ndarray | None], a: NoAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    starts, ends = dims_of_const(arg(ins, 1)), dims_of_const(arg(ins, 2))
    ax_in, st_in = arg(ins, 3), arg(ins, 4)
    axes = normalize_axes(dims_of_const(ax_in), x.ndim) if ax_in is not None else list(range(len(starts)))
    steps = dims_of_const(st_in) if st_in is not None else [1] * len(starts)
    index: list[slice] = [slice(None)] * x.ndim
    for k, axis in enumerate(axes):
        b, e, _ = slice_bounds(x.shape[axis], starts[k], ends[k], steps[k])
        index[axis] = slice(b, None if e < 0 else e, steps[k])
    return [x[tuple(index)].copy()]


register(
    OpDef(
        "Slice",
        _infer_slice,
        _ref_slice,
        inputs=(3, 5),
        quant=QuantPolicy.PASSTHROUGH,
        doc="y = x[starts:ends:steps] on `axes` (ONNX clamping; negative steps walk backwards)",
    )
)


# ---------------------------------------------------------------- Pad
@dataclass(frozen=True)
class PadAttrs:
    """Pad mode: ``constant`` (input ``constant_value``, default 0), ``reflect``, ``edge`` or ``wrap``."""

    mode: str = "constant"


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad_axes(ins_axes: list[int] | None, rank: int) -> list[int]:
    axes = normalize_axes(ins_axes, rank, "axes") if ins_axes is not None else list(range(rank))
    if len(set(axes)) != len(axes):
        raise ValueError(f"repeated axes {ins_axes}")
    return axes


def _infer_pad(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    if ctx.attrs.mode not in _PAD_MODES:
        raise ctx.fail(f"unknown mode {ctx.attrs.mode!r}")
    if ctx.has(2) and ctx.type(2).dtype != t.dtype:
        raise ctx.fail("constant_value dtype differs from the data dtype")
    if t.shape is None:
        return [t]
    rank = len(t.shape)
    pads = int_const(ctx, 1, "pads")
    axes_in = int_const(ctx, 3, "axes")
    if ctx.has(3) and axes_in is None:
        return [t.with_shape((UNKNOWN,) * rank)]
    try:
        axes = _pad_axes(axes_in, rank)
    except ValueError as exc:
        raise _fail(ctx, exc) from None
    out = list(t.shape)
    if pads is not None and len(pads) != 2 * len(axes):
        raise ctx.fail(f"pads {pads} must have 2 values per padded axis ({len(axes)} axes)")
    for k, a in enumerate(axes):
        d, b, e = t.shape[a], *((pads[k], pads[k + len(axes)]) if pads is not None else (0, 0))
        if pads is None:
            out[a] = UNKNOWN
        elif isinstance(d, int):
            try:
                out[a] = padded_dim(ctx.attrs.mode, d, b, e)
            except ValueError as exc:
                raise ctx.fail(f"axis {a} of shape {list(t.shape)}: {exc}") from None
        elif b or e:
            out[a] = UNKNOWN
    return [t.with_shape(tuple(out))]


def padded_dim(mode: str, d: int, b: int, e: int) -> int:
    """Length ``d + b + e`` of an axis padded by ``(b, e)``; ValueError where ONNX Runtime rejects it.

    Non-constant modes crop first and pad from what is left, which must not be
    empty; ``reflect`` pads must be smaller than it.
    """
    if d + b + e < 0:
        raise ValueError(f"pads ({b}, {e}) remove more than the whole dim {d}")
    if mode != "constant":
        kept = d + min(b, 0) + min(e, 0)
        if kept <= 0 and (b or e):
            raise ValueError(f"{mode} pads ({b}, {e}) leave nothing of dim {d} to pad from")
        if mode == "reflect" and max(b, e) >= max(kept, 1):
            raise ValueError(f"reflect pads ({b}, {e}) must be smaller than the {kept} kept elements")
    return d + b + e


def _ref_pad(ins: list[np.ndarray | None], a: PadAttrs, n: int) -> list[np.ndarray]:
    x = first(ins)
    pads = dims_of_const(arg(ins, 1))
    ax_in, cv = arg(ins, 3), arg(ins, 2)
    axes = _pad_axes(dims_of_const(ax_in) if ax_in is not None else None, x.ndim)
    begin, end = [0] * x.ndim, [0] * x.ndim
    for k, axis in enumerate(axes):
        begin[axis], end[axis] = pads[k], pads[k + len(axes)]
        padded_dim(a.mode, x.shape[axis], begin[axis], end[axis])
    width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end, strict=True)]

    def crop(y: np.ndarray) -> np.ndarray:
        return y[tuple(slice(max(-b, 0), y.shape[i] - max(-end[i], 0)) for i, b in enumerate(begin))]

    if a.mode == "constant":  # pad, then crop (a crop may reach into the padding)
        value = np.asarray(cv).reshape(-1)[0] if cv is not None and np.size(cv) else 0
        return [crop(np.pad(x, width, mode="constant", constant_values=value).astype(x.dtype))]
    return [np.pad(crop(x), width, mode=_PAD_MODES[a.mode])]  # type: ignore[call-overload]


register(
    OpDef(
        "Pad",
        _infer_pad,
        _ref_pad,
        PadAttrs,
        inputs=(2, 4),
        doc="y = x padded by `pads` ([begins..., ends...] over `axes`); negative pads crop",
    )
)


# ---------------------------------------------------------------- Tile
def _infer_tile(ctx: InferContext) -> list[TensorType]:
    t = ctx.type(0)
    reps = int_const(ctx, 1, "repeats")
    if t.shape is None:
        return [t.with_shape(None if reps is None else (UNKNOWN,) * len(reps))]
    if reps is None:
        return [t.with_shape(tuple(0 if d == 0 else UNKNOWN for d in t.shape))]
    if len(reps) != len(t.shape) or any(r < 0 for r in reps):
        raise ctx.fail(f"repeats {reps} do not fit shape {list(t.shape)}")
    out = [
        d * r if isinstance(d, int) else d if r == 1 else 0 if r == 0 else UNKNOWN
        for d, r in zip(t.shape, reps, strict=True)
    ]
    return [t.with_shape(tuple(out))]


register(
    OpDef(
        "Tile",
        _infer_tile,
        lambda ins, a, n: [np.tile(first(ins), dims_of_const(arg(ins, 1)))],
        inputs=(2, 2),
        doc="y = x repeated repeats[i] times along each axis i",
    )
)


# ---------------------------------------------------------------- Where
def _infer_where(ctx: InferContext) -> list[TensorType]:
    c, x, y = ctx.type(0), ctx.type(1), ctx.type(2)
    if c.dtype != DType.BOOL:
        raise ctx.fail(f"condition must be bool, got {c.dtype.short}")
    if x.dtype != y.dtype:
        raise ctx.fail(f"branch dtypes differ: {x.dtype.short} vs {y.dtype.short}")
    try:
        return [TensorType(x.dtype, broadcast_all([c.shape, x.shape, y.shape], ctx.where))]
    except ValueError as exc:
        raise _fail(ctx, exc) from None


def _ref_where(ins: list[np.ndarray | None], a: NoAttrs, n: int) -> list[np.ndarray]:
    c, x, y = (np.asarray(v) for v in ins[:3])
    return [np.where(c, x, y).astype(x.dtype)]


register(
    OpDef(
        "Where",
        _infer_where,
        _ref_where,
        inputs=(3, 3),
        layout=Layout.AGNOSTIC,
        doc="y = x where condition else y (three-way broadcasting)",
    )
)


# ---------------------------------------------------------------- ConstantOfShape
def _zero_f32() -> np.ndarray:
    return np.zeros(1, dtype=np.float32)


@dataclass(frozen=True, eq=False)
class ConstantOfShapeAttrs:
    """ConstantOfShape fill ``value``: a 1-element array whose dtype is the output's (ONNX: float32 0).

    Attrs compare and hash by the value's dtype and bytes.
    """

    value: np.ndarray = field(default_factory=_zero_f32)

    def __post_init__(self) -> None:
        if np.asarray(self.value).size != 1:
            raise AttrError(f"ConstantOfShape value must have one element, got shape {np.shape(self.value)}")

    def _key(self) -> tuple[str, bytes]:
        v = np.asarray(self.value)
        return v.dtype.str, v.tobytes()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstantOfShapeAttrs) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def _infer_constant_of_shape(ctx: InferContext) -> list[TensorType]:
    try:
        dtype = DType.from_numpy(np.asarray(ctx.attrs.value).dtype)
    except TypeError as exc:
        raise ctx.fail(str(exc)) from None
    shape = int_const(ctx, 0, "shape")
    if shape is None:
        n = const_len(ctx, 0)
        return [TensorType(dtype, None if n is None else (UNKNOWN,) * n)]
    if any(d < 0 for d in shape):
        raise ctx.fail(f"negative dim in shape {shape}")
    return [TensorType(dtype, tuple(shape))]


def _ref_constant_of_shape(ins: list[np.ndarray | None], a: ConstantOfShapeAttrs, n: int) -> list[np.ndarray]:
    v = np.asarray(a.value).reshape(-1)
    return [np.full(dims_of_const(first(ins)), v[0], dtype=v.dtype)]


register(
    OpDef(
        "ConstantOfShape",
        _infer_constant_of_shape,
        _ref_constant_of_shape,
        ConstantOfShapeAttrs,
        doc="y = a tensor of the given shape filled with value",
    )
)


# ---------------------------------------------------------------- Range
def range_count(start: Any, limit: Any, delta: Any) -> int:
    """ONNX Range length ``max(ceil((limit - start) / delta), 0)``.

    Integers use exact arithmetic; floats subtract in their dtype and divide in
    float64 (as ONNX Runtime does).
    """
    s, lim, d = np.asarray(start), np.asarray(limit), np.asarray(delta)
    if d == 0:
        raise ValueError("Range delta must not be 0")
    if s.dtype.kind in "iu":
        return max(-(-(int(lim) - int(s)) // int(d)), 0)
    return max(math.ceil(float(lim - s) / float(d)), 0)


def _infer_range(ctx: InferContext) -> list[TensorType]:
    ts = [ctx.type(i) for i in range(3)]
    if any(t.dtype != ts[0].dtype for t in ts) or any(t.shape not in ((), (1,), None) for t in ts):
        raise ctx.fail(f"start, limit, delta must be scalars of one dtype: {', '.join(map(str, ts))}")
    vals = [ctx.const(i) for i in range(3)]
    if any(v is None for v in vals):
        return [TensorType(ts[0].dtype, (UNKNOWN,))]
    try:
        return [TensorType(ts[0].dtype, (range_count(*(np.asarray(v).reshape(()) for v in vals)),))]
    except ValueError as exc:
        raise _fail(ctx, exc) from None


def _ref_range(ins: list[np.ndarray | None], a: NoAttrs, n: int) -> list[np.ndarray]:
    s, lim, d = (np.asarray(v).reshape(()) for v in ins[:3])
    count = range_count(s, lim, d)
    # Accumulate start, start+delta, ... in the input dtype, as ONNX's function body and ORT do.
    steps = np.full(count, d, dtype=s.dtype)
    if count:
        steps[0] = s
    return [np.add.accumulate(steps, dtype=s.dtype)]


register(
    OpDef(
        "Range",
        _infer_range,
        _ref_range,
        inputs=(3, 3),
        doc="y[0] = start, y[i] = y[i-1] + delta, for max(ceil((limit-start)/delta), 0) elements",
    )
)
