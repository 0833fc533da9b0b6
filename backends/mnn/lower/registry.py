"""What a lowering is: a ``check`` that says why a node cannot be written, and a ``lower``.

Each op-family module exports ``LOWERINGS: dict[qualified Kiln op, Lowering]``;
:mod:`backends.mnn.lower.table` merges them into the one table the writer consults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler.ir.graph import Graph, Node

if TYPE_CHECKING:
    from backends.mnn.lower.context import LowerContext

import numpy as np

__all__ = ["Lowering", "WeightView", "require_static", "no_check"]


@dataclass(frozen=True)
class WeightView:
    """A layer's weight as MNN stores it, and the way back to the Kiln weight input.

    ``rows`` is the [R, K] float32 matrix MNN keeps (one row per output channel in MNN's
    order; the unit of per-channel scales); ``restore(rows)`` gives the array for the
    node's input ``port`` that computes the same thing in Kiln's graph. A block of
    ``block_size`` input channels spans ``block_size * area`` consecutive weights of a row,
    for rows of ``channels`` input channels.
    """

    port: int
    rows: np.ndarray
    restore: Callable[[np.ndarray], np.ndarray]
    channels: int
    area: int

    def block_elems(self, block_size: int | None) -> int | None:
        """Weights per scale block (None: one scale per row)."""
        if block_size is None or block_size >= self.channels or self.channels % block_size:
            return None
        return block_size * self.area


def no_check(ctx: LowerContext, node: Node) -> str | None:
    """A check that accepts every node with static shapes."""
    return require_static(node, ctx.graph)


@dataclass(frozen=True)
class Lowering:
    """``lower(ctx, node)`` emits the MNN ops of a node; ``check`` returns a reason it can't, or None.

    ``weight`` gives the :class:`WeightView` of ops whose weight MNN stores compressed
    (convolutions and fully connected layers); the mixed-precision planner uses it.
    """

    lower: Callable[[LowerContext, Node], None]
    check: Callable[[LowerContext, Node], str | None] = no_check
    weight: Callable[[Graph, Node], WeightView | None] | None = None


def require_static(node: Node, graph: Graph) -> str | None:
    """None if every input and output of ``node`` has a static shape, else the reason."""
    types = [v.type for v in graph.inputs_of(node) if v is not None] + list(node.output_types)
    if all(t.is_static for t in types):
        return None
    return "dynamic shape (fix it with --input-shape)"
