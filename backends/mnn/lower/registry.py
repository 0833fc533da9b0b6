"""What a lowering is: the :class:`~compiler.backend.OpSupport` of one op, plus its weight view.

Each op-family module exports ``LOWERINGS: dict[qualified Kiln op, Lowering]``;
:mod:`backends.mnn.lower.table` merges them into the one :class:`~compiler.backend.CapabilityTable`
the writer consults (which also requires static shapes of every node).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from compiler.backend import OpSupport
from compiler.ir.graph import Graph, Node

if TYPE_CHECKING:
    from backends.mnn.lower.context import LowerContext

__all__ = ["Lowering", "LowerFn", "WeightFn", "WeightView"]

LowerFn = Callable[["LowerContext", Node], None]
"""``lower(ctx, node)``: emit the MNN ops of a node."""


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


WeightFn = Callable[[Graph, Node], "WeightView | tuple[WeightView, ...] | None"]
"""``weight(graph, node)``: the :class:`WeightView` of a layer whose weight MNN stores compressed
(a tuple for a layer with several weight inputs, e.g. an LSTM's W and R; they share one storage)."""


@dataclass(frozen=True)
class Lowering(OpSupport[LowerFn]):
    """An MNN table entry: ``lower(ctx, node)``, ``check(graph, node) -> reason | None``, ``weight``.

    ``check`` only sees the graph (the table adds the static-shape requirement first);
    ``weight`` gives the :class:`WeightView` of ops whose weight MNN stores compressed
    (convolutions and fully connected layers); the mixed-precision planner uses it.
    """

    weight: WeightFn | None = None
