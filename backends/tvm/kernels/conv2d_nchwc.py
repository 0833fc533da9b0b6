"""General (groups == 1) and grouped fp32 conv2d in NCHW[b]c layout: TE compute plus an x86
register-tile schedule.

``y[n, o, oh, ow, bo] = act(bias[o, bo] (+ res[n, o, oh, ow, bo])
    + sum_{i, kh, kw, bi} xp[n, s(o) + i, oh*sh + kh*dh, ow*sw + kw*dw, bi] * W[o, i, kh, kw, bi, bo])``
with ``xp`` the input zero-padded by ``pads`` (a separate, parallel stage; absent when pads are 0),
``i`` over every input chunk and ``s(o) = 0`` for groups == 1, and for a grouped conv ``i`` over
the ``group_chunks`` input chunks of output chunk ``o`` from ``s(o) = group_chunk_start(o)``
(:mod:`backends.tvm.kernels.conv_geometry`).

Schedule (classic direct-conv register tiling): split ``o -> (oo, oi)``, ``oh -> (hho, hhi)``,
``ow -> (wo, wi)`` and order ``[n*oo*hho] (parallel), wo, i, kh, kw, bi, oi, hhi, wi, bo``; the
accumulator tile ``oi*hhi*wi*ceil(ob/lanes)`` lives in registers (a global-scope tile buffer, unrolled), the
out block is vectorized, ``kw`` stays a loop, and the epilogue is computed at ``wo``.

Convs whose taps mostly read padding (:func:`~backends.tvm.kernels.conv_regions.splits_regions`:
a dilated conv on a small map) run as their padding-free regions instead
(:func:`conv2d_regions_compute`): per region a conv over its live taps only, reading the input
unpadded, with its own register tile and epilogue as above, then a parallel, vectorized copy of
the regions into the output (no pad stage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.tvm.kernels.conv_geometry import grouped_fits
from backends.tvm.kernels.conv_regions import ConvRegion, conv_regions, region_spec, splits_regions
from backends.tvm.kernels.conv_spec import Conv2dSpec
from backends.tvm.kernels.epilogue import activation_expr, epilogue_stage
from backends.tvm.kernels.kernel import Kernel, mark_scheduled, simd_isa
from backends.tvm.schedule_nest import fits_stack

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = [
    "ConvTile",
    "pick_conv_tile",
    "conv2d_nchwc_compute",
    "conv2d_nchwc_kernel",
    "pad_stage",
    "schedule_pad",
]


@dataclass(frozen=True)
class ConvTile:
    """Register tile: output chunks ``oc``, output rows ``oh``, output columns ``ow``."""

    oc: int
    oh: int
    ow: int


def _vector_registers(target: TargetSpec) -> int:
    """32 zmm on AVX-512 (ymm16-31 too), 16 ymm on AVX2, 32 q-registers on NEON."""
    return 32 if target.lanes >= 16 or target.is_arm else 16


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _l2_budget(target: TargetSpec) -> int:
    """Bytes of weight slab a tile may stream and still find in L2 (half of a typical core's L2)."""
    return 512 * 1024 if target.lanes >= 16 else 256 * 1024


def pick_conv_tile(spec: Conv2dSpec, target: TargetSpec) -> ConvTile:
    """The register tile maximizing a simple throughput model, with no measurement.

    Per reduction step a tile issues ``acc = oc*oh*ow*vpb`` FMAs (``vpb`` vectors per out block),
    ``oc*vpb`` weight loads and ``oh*ow`` broadcasts. Modelled cycles are
    ``max(acc/2, loads/2, 4) + 1`` (two FMA pipes, FMA latency 4, loop overhead); the score is useful
    FMAs per cycle, where non-divisible splits waste their padded share. Registers must hold the
    accumulators, the weight vectors and one broadcast. Measured on Zen 4: ``oc`` must divide the
    output chunks (a predicated ``oc`` split is 1.6x slower), a predicated ``oh`` split costs extra
    (x0.85), and a weight slab ``oc*IC*KH*KW*ob*4`` bytes beyond the L2 budget costs x0.9. The
    ``oc*oh*ow*ob`` accumulators must fit TVM's stack limit (:func:`fits_stack`): a bigger tile comes
    from the workspace pool per tile (1x1 convs on Zen 4: 2x1x14 with it 20-25% slower than 2x1x7).
    """
    regs = _vector_registers(target)
    vpb = _ceil_div(spec.out_block, target.lanes)
    occ, oh_, ow_ = spec.out_chunks, spec.out_h, spec.out_w
    slab = spec.group_chunks * spec.in_block * spec.kernel[0] * spec.kernel[1] * spec.out_block * 4
    best: tuple[float, ConvTile] | None = None
    for oc in range(1, min(occ, 4) + 1):
        if occ % oc:
            continue
        for oh in (1, 2, 4):
            if oh > oh_:
                continue
            for ow in range(1, min(ow_, 32) + 1):
                acc = oc * oh * ow * vpb
                pixels = oc * oh * ow
                if acc + oc * vpb + 1 > regs or (pixels > 1 and not fits_stack(pixels * spec.out_block)):
                    continue
                useful = (oh_ * ow_) / (_ceil_div(oh_, oh) * oh * _ceil_div(ow_, ow) * ow)
                loads = oc * vpb + oh * ow
                cycles = max(acc / 2.0, loads / 2.0, 4.0) + 1.0
                score = acc * useful / cycles
                if oh_ % oh:
                    score *= 0.85
                if oc > 1 and oc * slab > _l2_budget(target):
                    score *= 0.9
                # Prefer wide rows (contiguous input), then fewer output chunks (smaller weight slab).
                key = score - oh * 0.001 - oc * 0.0001
                if best is None or key > best[0] + 1e-9:
                    best = (key, ConvTile(oc, oh, ow))
    assert best is not None
    return best[1]


def pad_stage(data: Any, pads: tuple[int, int, int, int]) -> Any:
    """``xp[n, c, h, w, b] = data[n, c, h - pt, w - pl, b]`` inside the bounds, else 0.

    Returns ``data`` itself when all pads are 0 (no stage).
    """
    from tvm import te, tirx

    pt, pl, pb, pr = pads
    if not any(pads):
        return data
    n, c, h, w, b = (int(v) for v in data.shape)

    def body(i: Any, j: Any, y: Any, x: Any, k: Any) -> Any:
        inside = tirx.all(y >= pt, y < pt + h, x >= pl, x < pl + w)
        return tirx.if_then_else(inside, data[i, j, y - pt, x - pl, k], tirx.const(0.0, "float32"))

    return te.compute((n, c, h + pt + pb, w + pl + pr, b), body, name="pad")


def schedule_pad(sch: Any) -> None:
    """Parallel over ``n*c*h`` and vectorized over the channel block (when there is a pad block)."""
    try:
        blk = sch.get_sblock("pad")
    except Exception:  # noqa: BLE001 - no pad stage
        return
    n, c, h, w, b = sch.get_loops(blk)
    sch.parallel(sch.fuse(n, c, h))
    sch.vectorize(b)


def conv2d_nchwc_compute(spec: Conv2dSpec) -> Any:
    """The unscheduled PrimFunc ``(data, weight, bias[, residual], out)``."""
    from tvm import te

    n_, icc, ih, iw, ib = spec.data_shape
    _, occ, oh, ow, ob = spec.out_shape
    kh, kw = spec.kernel
    sh, sw = spec.strides
    dh, dw = spec.dilations
    data = te.placeholder(spec.data_shape, "float32", name="data")
    weight = te.placeholder(spec.weight_shape, "float32", name="weight")
    bias = te.placeholder((occ, ob), "float32", name="bias")
    residual = te.placeholder(spec.out_shape, "float32", name="residual") if spec.residual else None
    xp = pad_stage(data, spec.pads)
    ric = te.reduce_axis((0, spec.group_chunks), name="ic")
    rkh = te.reduce_axis((0, kh), name="kh")
    rkw = te.reduce_axis((0, kw), name="kw")
    rib = te.reduce_axis((0, ib), name="ib")
    conv = te.compute(
        spec.out_shape,
        lambda n, o, y, x, bo: te.sum(
            xp[n, spec.group_chunk_start(o) + ric, y * sh + rkh * dh, x * sw + rkw * dw, rib]
            * weight[o, ric, rkh, rkw, rib, bo],
            axis=[ric, rkh, rkw, rib],
        ),
        name="conv",
    )
    out = epilogue_stage(conv, bias, residual, spec.activation, spec.alpha, spec.beta)
    args = [data, weight, bias] + ([residual] if residual is not None else []) + [out]
    return te.create_prim_func(args)


def _region_stage(spec: Conv2dSpec, ph: dict[str, Any], region: ConvRegion, k: int) -> Any:
    """``epilogue{k}``: region ``k``'s output, ``act(conv{k} + bias (+ residual))`` over its live taps
    only, reading ``data`` unpadded (:mod:`backends.tvm.kernels.conv_regions`)."""
    from tvm import te

    rows, cols = region.rows, region.cols
    (sh, sw), (dh, dw), (pt, pl) = spec.strides, spec.dilations, spec.pads[:2]
    n_, occ, ob = spec.batch, spec.out_chunks, spec.out_block
    shape = (n_, occ, rows.size, cols.size, ob)
    data, weight, bias, residual = ph["data"], ph["weight"], ph["bias"], ph.get("residual")
    conv: Any = None
    if rows.taps and cols.taps:
        ric = te.reduce_axis((0, spec.group_chunks), name="ic")
        rkh = te.reduce_axis((0, rows.taps), name="kh")
        rkw = te.reduce_axis((0, cols.taps), name="kw")
        rib = te.reduce_axis((0, spec.in_block), name="ib")

        def tap(n: Any, o: Any, y: Any, x: Any, bo: Any) -> Any:
            ih = (y + rows.o0) * sh + (rkh + rows.t0) * dh - pt
            iw = (x + cols.o0) * sw + (rkw + cols.t0) * dw - pl
            xv = data[n, spec.group_chunk_start(o) + ric, ih, iw, rib]
            return xv * weight[o, ric, rkh + rows.t0, rkw + cols.t0, rib, bo]

        conv = te.compute(shape, lambda *i: te.sum(tap(*i), axis=[ric, rkh, rkw, rib]), name=f"conv{k}")

    def body(n: Any, o: Any, y: Any, x: Any, bo: Any) -> Any:
        v = bias[o, bo] if conv is None else conv[n, o, y, x, bo] + bias[o, bo]
        if residual is not None:
            v = v + residual[n, o, y + rows.o0, x + cols.o0, bo]
        return activation_expr(v, spec.activation, spec.alpha, spec.beta)

    return te.compute(shape, body, name=f"epilogue{k}")


def conv2d_regions_compute(spec: Conv2dSpec) -> Any:
    """The unscheduled PrimFunc ``(data, weight, bias[, residual], out)`` as padding-free regions:
    ``out[n, o, y, x, b] = epilogue{k}[n, o, y - r.o0, x - c.o0, b]`` for the region ``k`` (row
    band ``r``, column band ``c``) holding ``(y, x)``."""
    from tvm import te, tirx

    ph = {
        "data": te.placeholder(spec.data_shape, "float32", name="data"),
        "weight": te.placeholder(spec.weight_shape, "float32", name="weight"),
        "bias": te.placeholder((spec.out_chunks, spec.out_block), "float32", name="bias"),
    }
    if spec.residual:
        ph["residual"] = te.placeholder(spec.out_shape, "float32", name="residual")
    regions = conv_regions(spec)
    stages = [_region_stage(spec, ph, r, k) for k, r in enumerate(regions)]

    def assemble(n: Any, o: Any, y: Any, x: Any, b: Any) -> Any:
        expr: Any = None
        for region, stage in zip(regions, stages, strict=True):  # the last region tested first
            rows, cols = region.rows, region.cols
            v = stage[n, o, y - rows.o0, x - cols.o0, b]
            inside = tirx.all(y >= rows.o0, x >= cols.o0)
            expr = v if expr is None else tirx.if_then_else(inside, v, expr)
        return expr

    out = te.compute(spec.out_shape, assemble, name="assemble")
    return te.create_prim_func([*ph.values(), out])


def _schedule_tile(sch: Any, conv: Any, epi: Any, tile: ConvTile) -> None:
    """The register-tile schedule of one conv block and its epilogue block (module docstring)."""
    n, o, y, x, bo, ric, rkh, rkw, rib = sch.get_loops(conv)
    oo, oi = sch.split(o, [None, tile.oc])
    yo, yi = sch.split(y, [None, tile.oh])
    xo, xi = sch.split(x, [None, tile.ow])
    sch.reorder(n, oo, yo, xo, ric, rkh, rkw, rib, yi, xi, oi, bo)
    sch.parallel(sch.fuse(n, oo, yo))
    # global, not "local": TVM serves every local buffer from the workspace pool (a call per tile);
    # a global one under 1 KiB is a stack array that LLVM keeps in registers
    sch.reverse_compute_at(epi, xo)
    sch.vectorize(bo)
    for loop in (oi, xi, yi):
        sch.unroll(loop)
    ep_loops = sch.get_loops(epi)[2:]  # below the parallel loop and wo
    sch.vectorize(ep_loops[-1])
    for loop in ep_loops[:-1]:
        sch.unroll(loop)
    init = sch.decompose_reduction(conv, ric)
    init_loops = sch.get_loops(init)[2:]
    sch.vectorize(init_loops[-1])
    for loop in init_loops[:-1]:
        sch.unroll(loop)


def _schedule(func: Any, spec: Conv2dSpec, tile: ConvTile) -> Any:
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    schedule_pad(sch)
    _schedule_tile(sch, sch.get_sblock("conv"), sch.get_sblock("epilogue"), tile)
    return sch.mod["main"]


def _schedule_regions(func: Any, spec: Conv2dSpec, target: TargetSpec, tile: ConvTile | None) -> Any:
    """Each live region's conv and epilogue as :func:`_schedule_tile` (its own tile unless ``tile``
    is given), then the parallel, vectorized assembly copy."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    for k, region in enumerate(conv_regions(spec)):
        epi = sch.get_sblock(f"epilogue{k}")
        if region.rows.taps * region.cols.taps == 0:
            sch.vectorize(sch.get_loops(epi)[-1])
            continue
        t = tile or pick_conv_tile(region_spec(spec, region), target)
        t = ConvTile(t.oc, min(t.oh, region.rows.size), min(t.ow, region.cols.size))
        _schedule_tile(sch, sch.get_sblock(f"conv{k}"), epi, t)
    n, o, y, x, b = sch.get_loops(sch.get_sblock("assemble"))
    sch.parallel(sch.fuse(n, o, y))
    sch.vectorize(b)
    return sch.mod["main"]


def conv2d_nchwc_kernel(
    spec: Conv2dSpec, target: TargetSpec, tile: ConvTile | None = None, regions: bool | None = None
) -> Kernel:
    """The scheduled groups == 1 or grouped conv kernel; ``tile`` overrides the analytic register
    tile, ``regions`` whether it runs as padding-free regions (default :func:`splits_regions`)."""
    if spec.groups != 1 and not (spec.is_grouped and grouped_fits(spec)):
        raise NotImplementedError("conv2d_nchwc handles groups == 1 and grouped convs that fit their blocks")
    if splits_regions(spec) if regions is None else regions:
        func = _schedule_regions(conv2d_regions_compute(spec), spec, target, tile)
    else:
        func = _schedule(conv2d_nchwc_compute(spec), spec, tile or pick_conv_tile(spec, target))
    grouped = spec.is_grouped
    name = f"kiln_{'gconv2d' if grouped else 'conv2d'}_nchwc_{spec.key()}"
    rule, op_class = ("grouped_nchwc", "grouped_conv") if grouped else ("conv2d_nchwc", "conv")
    func = mark_scheduled(func.with_attr("global_symbol", name), rule, op_class, simd_isa(target))
    return Kernel(name=name, func=func, out_shape=spec.out_shape, out_dtype="float32")
