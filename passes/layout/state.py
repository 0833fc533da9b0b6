"""The placement state of choose-layout: which layouts each value has, and the planned nodes.

A value's representations map a block b to a Value holding it in NCHW{b}c (0 = NCHW);
:meth:`LayoutState.fetch` adds one shared ``kiln::LayoutTransform`` per (value, block).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ops import blocked_layout as bl
from compiler.ops.fused import KILN
from compiler.ops.layout_transform import LAYOUT_TRANSFORM, LayoutTransformAttrs
from compiler.pattern import NearMiss
from compiler.rewriter import Rewriter

__all__ = ["Spec", "Blocked", "LayoutState", "rank4_channels", "PASS_NAME"]

PASS_NAME = "choose-layout"

Spec = tuple[Value, int] | np.ndarray | None
"""How a new node gets one input: (value, block) fetched in that layout (-1 = as is),
a new constant array, or None (absent optional input)."""


@dataclass
class Blocked:
    """A planned blocked node: op, attrs, input specs, output block and channel count."""

    op: str
    attrs: Any
    inputs: list[Spec]
    block: int
    channels: int
    domain: str = ""
    decision: dict[str, Any] | None = None
    outputs: tuple[int, ...] = ()  # a multi-output node (Split): each output's channels


@dataclass
class LayoutState:
    """One placement run on one graph with global block ``block``."""

    graph: Graph
    rw: Rewriter
    lanes: int
    block: int
    peak: int
    record: bool = False
    reps: dict[tuple[int, int], dict[int, Value]] = field(default_factory=dict)
    channels: dict[tuple[int, int], int] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    misses: list[NearMiss] = field(default_factory=list)

    def block_for(self, c: int) -> int:
        """b(C): C below the lane count (no padding), else the global block."""
        return self.block if self.record or c >= self.lanes else c

    def layout_of(self, v: Value) -> int:
        """The block the value currently lives in (0 = NCHW)."""
        rep = self.reps.get((v.node, v.port))
        return next(iter(rep)) if rep else 0

    def chans(self, v: Value) -> int | None:
        """Real channel count of a rank-4 (or blocked) value, if static."""
        c = self.channels.get((v.node, v.port))
        if c is not None:
            return c
        s = v.type.shape
        return s[1] if s is not None and len(s) == 4 and isinstance(s[1], int) else None

    def fetch(self, v: Value, block: int) -> Value:
        """``v`` in layout ``block``, inserting (and caching) one LayoutTransform."""
        key = (v.node, v.port)
        rep = self.reps.setdefault(key, {0: v})
        if block in rep:
            return rep[block]
        src_block, src = next(iter(rep.items()))
        c = self.chans(v)
        assert c is not None
        attrs = LayoutTransformAttrs(bl.blocked(src_block), bl.blocked(block), c)
        rep[block] = self.rw.op(
            LAYOUT_TRANSFORM, [src], attrs, domain=KILN, name=f"{v.name}_to_{bl.blocked(block)}"
        )
        return rep[block]

    def miss(self, node: Node, reason: str) -> None:
        """Record why ``node`` stays NCHW."""
        self.misses.append(NearMiss(PASS_NAME, node.name or node.output_names[0], reason))


def rank4_channels(v: Value) -> int | None:
    """C of a rank-4 value with a static channel dim."""
    s = v.type.shape
    return s[1] if s is not None and len(s) == 4 and isinstance(s[1], int) else None
