"""Concat and Split on the channel axis in a blocked layout (choose-layout planners).

In NCHW{b}c, channel c sits at chunk c // b, lane c % b. When every part but the last holds a
multiple of b channels, the channel offsets fall on chunk boundaries and

    Concat_1(x_1, ..., x_k) = Concat_1 over chunks of the blocked x_i,
    Split_1(x, [c_1, ..., c_k]) = Split_1 of the blocked x into [c_1/b, ..., ceil(c_k/b)] chunks

(axis 1 of the rank-5 tensor); only the last part may end in a partial chunk, whose padded lanes
are the whole tensor's. When the value's own block b does not divide the parts, the largest
power-of-two block b' < b (at least ``lanes / 2``) that does is used: one transform to b' instead
of one to NCHW and back per part (MixNet's 120-channel groups: NCHW16c -> NCHW8c).
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Node, Value
from compiler.ops.shapes import normalize_axes
from compiler.ops.tensor_data import SplitAttrs
from passes.layout.state import Blocked, LayoutState, Spec, rank4_channels

__all__ = ["plan_concat", "plan_split", "part_block"]


def part_block(st: LayoutState, block: int, parts: list[int]) -> int | None:
    """The block for parts of ``parts`` channels: ``block`` or the largest power-of-two block
    below it, at least ``lanes / 2``, dividing every part but the last (None: none does)."""
    floor = max(1, st.lanes // 2)
    b = block
    while b >= min(floor, block):
        if all(c % b == 0 for c in parts[:-1]):
            return b
        if b % 2:
            return None
        b //= 2
    return None


def plan_concat(st: LayoutState, node: Node, ins: list[Value | None]) -> Blocked | str:
    """Concat on channels of blocked inputs (see the module docstring)."""
    c = rank4_channels(st.graph.value(node))
    if c is None or normalize_axes([node.attrs.axis], 4)[0] != 1:
        return "Concat is not on the channel axis of a rank-4 tensor"
    lead = next((v for v in ins if v is not None and st.layout_of(v)), None)
    if lead is None:
        return "no input is blocked"
    parts: list[int] = []
    for v in ins:
        vc = None if v is None or v.const is not None else st.chans(v)
        if vc is None:
            return "an input is a constant or has no static channel count"
        parts.append(vc)
    b = part_block(st, st.layout_of(lead), parts)
    if b is None:
        return f"the inputs' channels {parts} fill no whole blocks of {st.layout_of(lead)} or half of it"
    specs: list[Spec] = [(v, b) for v in ins if v is not None]
    return Blocked(node.op, node.attrs, specs, b, c)


def plan_split(st: LayoutState, node: Node, ins: list[Value | None]) -> Blocked | str:
    """Split on channels of a blocked input (see the module docstring)."""
    x = ins[0]
    assert x is not None
    have, c = st.layout_of(x), st.chans(x)
    if not have or c is None:
        return "input is not blocked"
    if normalize_axes([node.attrs.axis], 4)[0] != 1:
        return "Split is not on the channel axis"
    parts = [rank4_channels(st.graph.value(node, p)) for p in range(node.num_outputs)]
    if any(p is None for p in parts):
        return "an output has no static channel count"
    sizes = [int(p) for p in parts if p is not None]
    b = part_block(st, have, sizes)
    if b is None:
        return f"the parts {sizes} fill no whole blocks of {have} or half of it"
    chunks = np.array([-(-p // b) for p in sizes], np.int64)
    attrs = SplitAttrs(axis=1, num_outputs=None)
    return Blocked(node.op, attrs, [(x, b), chunks], b, c, outputs=tuple(sizes))
