"""fp32 pooling over blocked data ``[N, Cb, H, W, b]`` -> ``[N, Cb, OH, OW, b]`` (dilation 1).

* max: ``y = max_{kh,kw} x_pad[n, c, oh*sh + kh - pt, ow*sw + kw - pl, j]`` with -inf padding;
* avg: ``y = sum_{kh,kw} x_pad[...] / count`` with zero padding, where ``count`` is the number
  of taps inside the input (``count_include_pad=False``) or inside the explicitly padded
  input ``[-pt, H + pb) x [-pl, W + pr)`` (``True``); taps ``ceil_mode`` adds past the end
  pad never count (ONNX Runtime / PyTorch rule);
* global_avg: ``y[n, c, 0, 0, j] = mean_{h,w} x[n, c, h, w, j]``.

``OH = floor((H + pt + pb - KH) / sh) + 1``; with ``ceil_mode`` the division rounds up, but
the last window must start inside the input or the leading pad.

Schedule: ``fuse(n, c, oh)`` parallel, a register tile of ``tw`` output columns (unrolled)
with the window loops outside it and the ``b`` axis vectorized innermost; accumulators live
in a small stack buffer, and the final division (or copy) runs inside the column-tile loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.tvm.kernels.kernel import Kernel, mark_scheduled, simd_isa, spec_key
from backends.tvm.schedule_nest import fits_stack

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["PoolSpec", "pool_kernel", "pool_compute", "POOL_MODES"]

POOL_MODES = ("max", "avg", "global_avg")
_MAX_ACCUMULATORS = 8


def _window_out(size: int, k: int, s: int, p0: int, p1: int, ceil: bool) -> int:
    num = size + p0 + p1 - k
    if not ceil:
        return num // s + 1
    out = -(-num // s) + 1
    if (out - 1) * s >= size + p0:
        out -= 1
    return out


@dataclass(frozen=True)
class PoolSpec:
    """One pooling op on ``[batch, chunks, in_h, in_w, block]`` data."""

    mode: str
    batch: int
    chunks: int
    in_h: int
    in_w: int
    block: int
    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    ceil_mode: bool = False
    count_include_pad: bool = False

    @property
    def out_h(self) -> int:
        """Output rows (1 for global_avg)."""
        if self.mode == "global_avg":
            return 1
        return _window_out(
            self.in_h, self.kernel[0], self.strides[0], self.pads[0], self.pads[2], self.ceil_mode
        )

    @property
    def out_w(self) -> int:
        """Output columns (1 for global_avg)."""
        if self.mode == "global_avg":
            return 1
        return _window_out(
            self.in_w, self.kernel[1], self.strides[1], self.pads[1], self.pads[3], self.ceil_mode
        )

    @property
    def data_shape(self) -> tuple[int, int, int, int, int]:
        """``[N, Cb, H, W, b]``."""
        return (self.batch, self.chunks, self.in_h, self.in_w, self.block)

    @property
    def out_shape(self) -> tuple[int, int, int, int, int]:
        """``[N, Cb, OH, OW, b]``."""
        return (self.batch, self.chunks, self.out_h, self.out_w, self.block)

    def key(self) -> str:
        """A short deterministic hash of all spec fields."""
        return spec_key(self)


def _check(spec: PoolSpec) -> None:
    if spec.mode not in POOL_MODES:
        raise ValueError(f"unknown pool mode {spec.mode!r} (choose from {', '.join(POOL_MODES)})")
    if min(spec.batch, spec.chunks, spec.in_h, spec.in_w, spec.block, *spec.kernel, *spec.strides) < 1:
        raise ValueError(f"pool sizes must be positive: {spec}")
    if min(spec.pads) < 0:
        raise ValueError(f"pads must be non-negative: {spec.pads}")
    if spec.mode != "global_avg":
        kh, kw = spec.kernel
        pt, pl, pb, pr = spec.pads
        if max(pt, pb) >= kh or max(pl, pr) >= kw:
            raise ValueError(f"pads {spec.pads} must be smaller than the kernel {spec.kernel}")
        if spec.out_h < 1 or spec.out_w < 1:
            raise ValueError(f"pool output would be empty: {spec}")


def pool_compute(spec: PoolSpec) -> Any:
    """The unscheduled PrimFunc ``(data, out)``: an ``acc`` reduction then an ``epilogue``."""
    from tvm import te, tirx

    _check(spec)
    data = te.placeholder(spec.data_shape, "float32", name="data")
    f32 = "float32"
    if spec.mode == "global_avg":
        rh = te.reduce_axis((0, spec.in_h), name="rh")
        rw = te.reduce_axis((0, spec.in_w), name="rw")
        acc = te.compute(
            spec.out_shape,
            lambda n, c, y, x, j: te.sum(data[n, c, y + rh, x + rw, j], axis=[rh, rw]),
            name="acc",
        )
        inv = tirx.const(1.0 / (spec.in_h * spec.in_w), f32)
        out = te.compute(spec.out_shape, lambda n, c, y, x, j: acc[n, c, y, x, j] * inv, name="epilogue")
        return te.create_prim_func([data, out])

    kh, kw = spec.kernel
    sh, sw = spec.strides
    pt, pl, pb, pr = spec.pads
    h_, w_ = spec.in_h, spec.in_w
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    is_max = spec.mode == "max"
    pad_value = tirx.const(float("-inf") if is_max else 0.0, f32)

    def tap(n: Any, c: Any, y: Any, x: Any, j: Any) -> Any:
        ih = y * sh + rh - pt
        iw = x * sw + rw - pl
        inside = tirx.all(ih >= 0, ih < h_, iw >= 0, iw < w_)
        return tirx.if_then_else(inside, data[n, c, ih, iw, j], pad_value)

    reducer = te.max if is_max else te.sum
    acc = te.compute(
        spec.out_shape, lambda n, c, y, x, j: reducer(tap(n, c, y, x, j), axis=[rh, rw]), name="acc"
    )
    if is_max:
        out = te.compute(spec.out_shape, lambda n, c, y, x, j: acc[n, c, y, x, j], name="epilogue")
        return te.create_prim_func([data, out])

    lo_h, hi_h = (-pt, h_ + pb) if spec.count_include_pad else (0, h_)
    lo_w, hi_w = (-pl, w_ + pr) if spec.count_include_pad else (0, w_)

    def count(y: Any, x: Any) -> Any:
        y0, x0 = y * sh - pt, x * sw - pl
        ch = te.min(y0 + kh, hi_h) - te.max(y0, lo_h)
        cw = te.min(x0 + kw, hi_w) - te.max(x0, lo_w)
        return te.max(ch * cw, 1).astype(f32)

    out = te.compute(spec.out_shape, lambda n, c, y, x, j: acc[n, c, y, x, j] / count(y, x), name="epilogue")
    return te.create_prim_func([data, out])


def pick_pool_tile(spec: PoolSpec, target: TargetSpec) -> int:
    """Output columns per register tile: the largest divisor of OW in 8..1 within ~8 vector accumulators."""
    vregs = max(1, -(-spec.block // target.lanes))
    for tw in range(min(8, spec.out_w), 0, -1):
        stack = tw == 1 or fits_stack(tw * spec.block)  # else a workspace buffer per tile
        if spec.out_w % tw == 0 and tw * vregs <= _MAX_ACCUMULATORS and stack:
            return tw
    return 1


def _schedule(func: Any, spec: PoolSpec, target: TargetSpec) -> Any:
    from tvm import s_tir

    tw = pick_pool_tile(spec, target)
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock("acc")
    epi = sch.get_sblock("epilogue")
    n, c, y, x, j, rh, rw = sch.get_loops(acc)
    x_o, x_i = sch.split(x, [None, tw])
    sch.reorder(n, c, y, x_o, rh, rw, x_i, j)
    outer = sch.fuse(n, c, y)
    # global, not "local": TVM serves every local buffer from the workspace pool (a call per tile);
    # a global one under 1 KiB is a stack array that LLVM keeps in registers
    sch.reverse_compute_at(epi, x_o)
    work = spec.batch * spec.chunks * spec.out_h * spec.out_w * spec.block
    if target.num_cores > 1 and spec.batch * spec.chunks * spec.out_h > 1 and work >= 4096:
        sch.parallel(outer)
    sch.vectorize(j)
    if tw > 1:
        sch.unroll(x_i)
    e_x, e_j = sch.get_loops(epi)[-2:]
    sch.vectorize(e_j)
    if tw > 1:
        sch.unroll(e_x)
    init = sch.decompose_reduction(acc, rh)
    i_x, i_j = sch.get_loops(init)[-2:]
    sch.vectorize(i_j)
    if tw > 1:
        sch.unroll(i_x)
    return sch.mod["main"]


def pool_kernel(spec: PoolSpec, target: TargetSpec) -> Kernel:
    """The scheduled pooling kernel for ``spec`` (args ``data, out``)."""
    func = _schedule(pool_compute(spec), spec, target)
    name = f"kiln_pool_{spec.mode}_nchwc_{spec.key()}"
    func = mark_scheduled(func.with_attr("global_symbol", name), "pool_nchwc", "pooling", simd_isa(target))
    return Kernel(name=name, func=func, out_shape=spec.out_shape, out_dtype="float32")
