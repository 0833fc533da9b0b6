"""Data-movement ops: reshape family, transpose, concat, slice, and Kiln's layout transforms."""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.table import LowerContext, const_inputs, lowers, single_output
from compiler.backend import all_of
from compiler.errors import ConversionError
from compiler.ir.graph import Graph, Node

__all__ = ["layout_block"]


def _op() -> Any:
    from tvm import relax

    return relax.op


@lowers("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [ctx.emit(_op().reshape(ins[0], ctx.out_shape(node)))]


@lowers("Transpose")
def _transpose(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    perm = node.attrs.perm
    rank = len(ctx.out_shape(node))
    axes = list(perm) if perm is not None else list(reversed(range(rank)))
    return [ctx.emit(_op().permute_dims(ins[0], axes))]


@lowers("Concat")
def _concat(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax

    rank = len(ctx.out_shape(node))
    return [
        ctx.emit(_op().concat(relax.Tuple([x for x in ins if x is not None]), int(node.attrs.axis) % rank))
    ]


def _slice_steps_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    steps = ins[4].const if len(ins) > 4 and ins[4] is not None else None
    if steps is not None and np.any(steps <= 0):
        return "negative Slice steps have no TVM lowering"
    return None


@lowers("Slice", check=all_of(const_inputs((1, "starts"), (2, "ends")), _slice_steps_reason))
def _slice(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    shape = ctx.in_type(node, 0).shape or ()
    rank = len(shape)
    starts = ctx.require_const(node, 1, "starts").astype(np.int64).ravel()
    ends = ctx.require_const(node, 2, "ends").astype(np.int64).ravel()
    axes_c = ctx.input_const(node, 3)
    steps_c = ctx.input_const(node, 4)
    axes = axes_c.astype(np.int64).ravel() if axes_c is not None else np.arange(len(starts))
    steps = steps_c.astype(np.int64).ravel() if steps_c is not None else np.ones(len(starts), np.int64)
    a_out, b_out, e_out, s_out = [], [], [], []
    for a, b, e, s in zip(axes, starts, ends, steps, strict=True):
        ax = int(a) % rank
        dim = int(shape[ax])
        lo, hi, _ = slice(int(np.clip(b, -(2**62), 2**62)), int(np.clip(e, -(2**62), 2**62))).indices(dim)
        a_out.append(ax)
        b_out.append(lo)
        e_out.append(max(hi, lo))
        s_out.append(int(s))
    return [ctx.emit(_op().strided_slice(ins[0], a_out, b_out, e_out, s_out, assume_inbound=True))]


def layout_block(layout: str) -> int:
    """The channel block of ``NCHW{b}c`` (0 for plain NCHW)."""
    if layout == "NCHW":
        return 0
    if layout.startswith("NCHW") and layout.endswith("c") and layout[4:-1].isdigit():
        return int(layout[4:-1])
    raise ConversionError(f"layout {layout!r} is not NCHW or NCHW<b>c")


def relayout_te(x: Any, src: int, dst: int, channels: int) -> Any:
    """TE compute moving channel c between NCHW (block 0) and NCHW{b}c; padded lanes are 0."""
    from tvm import te, tirx

    shape = [int(d) for d in x.shape]
    n = shape[0]
    h, w = (shape[2], shape[3])

    def read(nn: Any, c: Any, hh: Any, ww: Any) -> Any:
        return x[nn, c, hh, ww] if src == 0 else x[nn, c // src, hh, ww, c % src]

    if dst == 0:
        return te.compute((n, channels, h, w), lambda nn, c, hh, ww: read(nn, c, hh, ww), name="unpack")
    chunks = -(-channels // dst)

    def reblock(nn: Any, co: Any, hh: Any, ww: Any, ci: Any) -> Any | None:
        """The read with chunk and lane indices stated directly when one block divides the other:
        NCHW{s}c -> NCHW{d}c reads chunk co // (s/d), lane (co % (s/d))·d + ci (s = k·d: the
        lane index is visibly contiguous in ci, so the copy vectorizes), or chunk
        co·(d/s) + ci // s, lane ci % s (d = k·s)."""
        if src and src % dst == 0:
            r = src // dst
            return x[nn, co // r, hh, ww, (co % r) * dst + ci]
        if src and dst % src == 0:
            r = dst // src
            return x[nn, co * r + ci // src, hh, ww, ci % src]
        return None

    def body(nn: Any, co: Any, hh: Any, ww: Any, ci: Any) -> Any:
        c = co * dst + ci
        direct = reblock(nn, co, hh, ww, ci)
        if chunks * dst == channels:
            return direct if direct is not None else read(nn, c, hh, ww)
        if direct is None or (src and dst % src == 0):  # reading a chunk past the last: clamp c
            direct = read(nn, tirx.min(c, channels - 1), hh, ww)
        return tirx.if_then_else(c < channels, direct, tirx.const(0, x.dtype))

    return te.compute((n, chunks, h, w, dst), body, name="pack")


@lowers("kiln::LayoutTransform")
def _layout_transform(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    a = node.attrs
    src, dst = layout_block(a.src), layout_block(a.dst)
    if src == dst:
        return [ins[0]]
    return [
        ctx.bb.emit_te(relayout_te, ins[0], src, dst, int(a.channels), primfunc_name_hint="kiln_relayout")
    ]


@lowers("Gather")
def _gather(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    shape = ctx.in_type(node, 0).shape or ()
    axis = int(node.attrs.axis) % len(shape)
    idx = ctx.input_const(node, 1)
    if idx is not None:  # negative indices count from the end
        ind = ctx.const(np.where(idx < 0, idx + int(shape[axis]), idx).astype(np.int64))
    else:
        ind = ins[1]
    return [ctx.emit(_op().take(ins[0], ind, axis))]


@lowers("Expand")
def _expand(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [ctx.emit(_op().broadcast_to(ins[0], ctx.out_shape(node)))]


@lowers("Tile", check=const_inputs((1, "repeats")))
def _tile(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    reps = ctx.require_const(node, 1, "repeats")
    return [ctx.emit(_op().tile(ins[0], [int(r) for r in reps.ravel()]))]


@lowers("Split")
def _split(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax

    rank = len(ctx.in_type(node, 0).shape or ())
    axis = int(node.attrs.axis) % rank
    sizes = [ctx.out_shape(node, i)[axis] for i in range(node.num_outputs)]
    cuts = [int(v) for v in np.cumsum(sizes)[:-1]]
    if not cuts:  # one part: Relax's split of no cuts is the tensor itself, not a 1-tuple
        return [ins[0]]
    parts = ctx.emit(_op().split(ins[0], cuts, axis))
    return [ctx.emit(relax.TupleGetItem(parts, i)) for i in range(node.num_outputs)]


def _pad_mode_reason(graph: Graph, node: Node) -> str | None:
    if node.attrs.mode != "constant":
        return f"Pad mode {node.attrs.mode!r} has no TVM lowering"
    return None


@lowers("Pad", check=all_of(_pad_mode_reason, const_inputs((1, "pads"))))
def _pad(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    shape_in = ctx.in_type(node, 0).shape or ()
    rank = len(shape_in)
    out = ctx.out_shape(node)
    pads = ctx.require_const(node, 1, "pads").astype(np.int64).ravel()
    axes_c = ctx.input_const(node, 3)
    axes = [int(a) % rank for a in axes_c.ravel()] if axes_c is not None else list(range(rank))
    width = [0] * (2 * rank)
    for i, ax in enumerate(axes):
        width[2 * ax], width[2 * ax + 1] = int(pads[i]), int(pads[i + len(axes)])
    if any(w < 0 for w in width) or any(o <= 0 for o in out):
        raise ConversionError(f"{node.describe()}: negative Pad (cropping) has no TVM lowering")
    value = ctx.input_const(node, 2)
    fill = float(value.reshape(())) if value is not None and value.size else 0.0
    return [ctx.emit(_op().nn.pad(ins[0], width, "constant", fill))]


@lowers("Dropout", check=single_output("Dropout's mask output has no TVM lowering"))
def _dropout(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [ins[0]]


def _blocksize_reason(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    return None if x.type.rank == 4 and node.attrs.blocksize >= 1 else "only 4-D inputs with blocksize >= 1"


@lowers("DepthToSpace", check=_blocksize_reason)
def _depth_to_space(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """[N, C, H, W] -> [N, C/b², H b, W b]: DCR splits C as (b, b, C/b²), CRD as (C/b², b, b)."""
    op = _op()
    n, c, h, w = ctx.in_type(node, 0).static_shape
    b = int(node.attrs.blocksize)
    if node.attrs.mode == "CRD":
        x = op.reshape(ins[0], (n, c // (b * b), b, b, h, w))
        perm = [0, 1, 4, 2, 5, 3]
    else:
        x = op.reshape(ins[0], (n, b, b, c // (b * b), h, w))
        perm = [0, 3, 4, 1, 5, 2]
    y = ctx.emit(op.permute_dims(ctx.emit(x), perm))
    return [ctx.emit(op.reshape(y, ctx.out_shape(node)))]


@lowers("SpaceToDepth", check=_blocksize_reason)
def _space_to_depth(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """[N, C, H, W] -> [N, C b², H/b, W/b], the new channel as (bh, bw, c)."""
    op = _op()
    n, c, h, w = ctx.in_type(node, 0).static_shape
    b = int(node.attrs.blocksize)
    x = ctx.emit(op.reshape(ins[0], (n, c, h // b, b, w // b, b)))
    y = ctx.emit(op.permute_dims(x, [0, 3, 5, 1, 2, 4]))
    return [ctx.emit(op.reshape(y, ctx.out_shape(node)))]


def _k_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if len(ins) > 1 and ins[1] is not None and ins[1].const is None:
        return "k (input 1) must be a constant for --target"
    return None


@lowers("Trilu", check=_k_reason)
def _trilu(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    k_c = ctx.input_const(node, 1)
    k = int(k_c.reshape(-1)[0]) if k_c is not None else 0
    fn = _op().triu if node.attrs.upper else _op().tril
    return [ctx.emit(fn(ins[0], k))]


@lowers("Einsum")
def _einsum(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax

    equation = node.attrs.equation.replace(" ", "")
    return [ctx.emit(_op().einsum(relax.Tuple(list(ins)), equation))]


@lowers("CumSum", "CumProd", check=const_inputs((1, "axis")))
def _cumulative(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """Running sum/product along ``axis``; ``exclusive`` shifts by one, ``reverse`` runs from the end."""
    from tvm import topi

    op = _op()
    rank = len(ctx.in_type(node, 0).static_shape)
    axis = int(ctx.require_const(node, 1, "axis").reshape(-1)[0]) % rank
    lib = topi.gpu if ctx.target.kind == "cuda" else topi  # Relax 0.27 does not legalize cumsum
    fn = lib.cumsum if node.op == "CumSum" else lib.cumprod
    x = ctx.emit(op.flip(ins[0], axis)) if node.attrs.reverse else ins[0]
    with ctx.target.tvm_target():  # the GPU scan reads the thread limit of the current target
        y = ctx.bb.emit_te(fn, x, axis, None, bool(node.attrs.exclusive), primfunc_name_hint=node.op.lower())
    return [ctx.emit(op.flip(y, axis)) if node.attrs.reverse else y]
