"""``kiln::LayoutTransform``: move a tensor between ``NCHW`` and ``NCHW{b}c``.

* NCHW -> NCHW{b}c: y[n, c // b, h, w, c % b] = x[n, c, h, w]; padded lanes are 0.
* NCHW{b}c -> NCHW: x[n, c, h, w] = y[n, c // b, h, w, c % b] for c < C (padded lanes dropped).
* NCHW{a}c -> NCHW{b}c: the composition of the two.

``channels`` is the real channel count C (a blocked shape only gives ceil(C/b) * b).
The expansion into ONNX is Pad / Reshape / Transpose / Slice (static H and W needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.errors import ConversionError
from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import TensorType
from compiler.ops import blocked_layout as bl
from compiler.ops.fused import KILN
from compiler.ops.registry import InferContext, Layout, OpDef, register

__all__ = ["LayoutTransformAttrs", "LAYOUT_TRANSFORM"]

LAYOUT_TRANSFORM = "LayoutTransform"


@dataclass(frozen=True)
class LayoutTransformAttrs:
    """Source and destination layouts and the real channel count C (all required)."""

    src: str = ""
    dst: str = ""
    channels: int = 0


def _infer(ctx: InferContext) -> list[TensorType]:
    a: LayoutTransformAttrs = ctx.attrs
    t = ctx.type(0)
    if a.channels < 1:
        raise ctx.fail(f"channels must be >= 1, got {a.channels}")
    try:
        nchw = bl.nchw_shape(ctx.shape(0), a.src, a.channels)
        return [TensorType(t.dtype, bl.layout_shape(nchw, a.dst))]
    except bl.LayoutError as exc:
        raise ctx.fail(str(exc)) from None


def _reference(ins: list[np.ndarray | None], a: LayoutTransformAttrs, n: int) -> list[np.ndarray]:
    x = ins[0]
    assert x is not None
    return [bl.relayout(np.asarray(x), a.src, a.dst, a.channels)]


def _expand(g: Graph, node: Node) -> list[Value]:
    a: LayoutTransformAttrs = node.attrs
    x = g.inputs_of(node)[0]
    assert x is not None
    base = node.name or node.output_names[0]
    shape = x.type.shape or ()
    h, w = (shape[2], shape[3]) if len(shape) >= 4 else (None, None)
    if not (isinstance(h, int) and isinstance(w, int)):
        raise ConversionError(f"{node.describe()}: exporting a layout transform needs static H and W")
    i64 = np.int64
    sb, db = bl.block_of(a.src), bl.block_of(a.dst)
    if sb:  # [N, Cb, H, W, b] -> [N, C, H, W]
        x = g.value(g.add_node("Transpose", [x], {"perm": (0, 1, 4, 2, 3)}, name=f"{base}_unblock"))
        flat = bl.blocks(a.channels, sb) * sb
        shape_c = g.add_constant(np.array([0, flat, h, w], i64), f"{base}_shape")
        x = g.value(g.add_node("Reshape", [x, shape_c], name=f"{base}_merge"))
        if flat != a.channels:
            ends = [
                g.add_constant(np.array(v, i64), f"{base}_{k}") for k, v in (("s", [0]), ("e", [a.channels]))
            ]
            axes = g.add_constant(np.array([1], i64), f"{base}_axes")
            x = g.value(g.add_node("Slice", [x, *ends, axes], name=f"{base}_crop"))
    if db:  # [N, C, H, W] -> [N, Cb, H, W, b]
        cb = bl.blocks(a.channels, db)
        if cb * db != a.channels:
            pads = g.add_constant(np.array([0, 0, 0, 0, 0, cb * db - a.channels, 0, 0], i64), f"{base}_pads")
            x = g.value(g.add_node("Pad", [x, pads], name=f"{base}_pad"))
        shape_b = g.add_constant(np.array([0, cb, db, h, w], i64), f"{base}_bshape")
        x = g.value(g.add_node("Reshape", [x, shape_b], name=f"{base}_split"))
        x = g.value(g.add_node("Transpose", [x], {"perm": (0, 1, 3, 4, 2)}, name=f"{base}_block"))
    if not sb and not db:
        x = g.value(g.add_node("Identity", [x], name=base))
    return [x]


register(
    OpDef(
        LAYOUT_TRANSFORM,
        _infer,
        _reference,
        LayoutTransformAttrs,
        domain=KILN,
        layout=Layout.FIXED,
        expand=_expand,
        doc="y = x moved from layout src to dst (NCHW <-> NCHW{b}c); padded lanes are 0",
    )
)
