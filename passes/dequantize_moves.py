"""dequantize-moves: dequantize integer tensors before the data movement that reads them.

With a per-tensor dq(q) = (q - z) s, dq is elementwise, so for any op M that only moves or
selects elements (Gather, Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Slice, Expand):

    dq(M(C_q, rest...)) = M(dq(C_q), rest...)

exactly. A quantized embedding table (onnxruntime's quantizer writes Gather(W_q, ids) -> dq) is then
a Gather of a float table (dq(C_q) folds to a constant), which a backend whose integer tensors must
come from its own quantize ops (MNN: a dq marks its input's grid, a gathered constant has none) can
write. Only where M's data input is an integer constant and dq's scale and zero point are
per-tensor constants; M keeps its other inputs and attributes.

With ``activations=1`` M's data input may be any integer tensor (a quantized activation moved
in int8, as onnxruntime's QOperator attention reshapes and transposes its uint8 Q, K and V): the
moves then run on the dequantized float tensor, for a backend whose integer tensors may only be
read by its dequantize and integer ops (CANN's AscendQuant data). Repeated until nothing moves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult, Rewriter

__all__ = ["DequantizeMoves", "MOVES"]

MOVES = frozenset(
    {"Gather", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Expand", "Split"}
)
"""Ops that only move, select or repeat elements of input 0."""


def _grid(graph: Graph, dq: Node) -> tuple[float, ...] | None:
    """A per-tensor dq's (scale, zero point) as numbers, None when not per-tensor constants."""
    if dq.op != "DequantizeLinear" or dq.domain:
        return None
    params = graph.inputs_of(dq)[1:]
    if any(v is not None and (v.const is None or v.const.size != 1) for v in params):
        return None
    return tuple(
        float(np.asarray(v.const).reshape(())) if v is not None and v.const is not None else 0.0
        for v in params
    )


def _movable(graph: Graph, dq: Node, activations: bool) -> Node | None:
    """The move M whose output ``dq`` dequantizes, when the rewrite applies: every reader of M's
    outputs is a dq on ``dq``'s grid (they are all rewritten to read the one moved M)."""
    grid = _grid(graph, dq)
    if grid is None:
        return None
    x = graph.inputs_of(dq)[0]
    if x is None or x.const is not None or graph.is_output(x):
        return None
    move = x.producer
    if move.op not in MOVES or move.domain:
        return None
    outs = graph.outputs_of(move)
    if any(graph.is_output(o) or any(_grid(graph, u) != grid for u, _ in graph.users(o)) for o in outs):
        return None
    data = graph.inputs_of(move)[0]
    if data is None or (data.const is None and not activations) or data.type.dtype.numpy.kind not in "iu":
        return None
    return move


@register_pass
@dataclass(frozen=True)
class DequantizeMoves(Pass):
    """dq(M(C_q, ...)) -> M(dq(C_q), ...) for data-movement M and per-tensor dq."""

    name = "dequantize-moves"
    activations: bool = False  # move dq above moves of integer activations too

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        total = PassResult()
        while True:
            step = self._sweep(graph)
            total.merge(step)
            if not step.changed:
                return total

    def _sweep(self, graph: Graph) -> PassResult:
        with Rewriter(graph) as rw:
            for dq in graph.nodes():
                if not graph.has_node(dq.id):
                    continue
                move = _movable(graph, dq, self.activations)
                if move is None:
                    continue
                data, *rest = graph.inputs_of(move)
                params = graph.inputs_of(dq)[1:]
                early = rw.op(
                    "DequantizeLinear",
                    [data, *params],
                    dq.attrs,
                    name=f"{dq.name}/before_move" if dq.name else "",
                )
                n = len(graph.outputs_of(move))
                first = rw.op(move.op, [early, *rest], move.attrs, like=move, num_outputs=n)
                moved = graph.outputs_of(first.producer)
                for old, new in zip(graph.outputs_of(move), moved, strict=True):
                    for reader in [user for user, _ in graph.users(old)]:
                        rw.replace(graph.value(reader), new, take_name=True)
                rw.applied("dequantize-move")
        return rw.result
