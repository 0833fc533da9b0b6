"""ONNX GRU -> MNN's own RNNSequenceGRU (OpType 105, param ``RNNParam``), as MNN's converter
writes it with ``--useOriginRNNImpl``.

Inputs ``[X, (gate W, gate b, candidate W, candidate b, recurrent b) per direction, (initial_h)]``,
outputs ``Y`` [seq, dirs, batch, hidden] and ``Y_h`` [dirs, batch, hidden]. With ONNX's blocks
W = [W_z; W_r; W_h] (rows), R likewise and B = [Wb_z, Wb_r, Wb_h, Rb_z, Rb_r, Rb_h], each direction's
constants are (observed against the converter's file and checked in MNN's runtime):

* gate W = [[W_z; W_r]ᵀ; [R_z; R_r]ᵀ], [input + hidden, 2 hidden]; gate b = [Wb_z, Wb_r];
* candidate W = [W_hᵀ; R_hᵀ], [input + hidden, hidden]; candidate b = Wb_h;
* recurrent b = [Rb_z, Rb_r, Rb_h]; ``linearBeforeReset`` is ONNX's ``linear_before_reset``.

What MNN 3.6.1 computes fixes what Kiln hands it (the rest is refused): the default activations
(sigmoid, tanh), no ``clip``, ``layout`` 0, direction forward or bidirectional, no
``sequence_lens`` (or the full length everywhere), constant W, R, B. Observed: the ``Y_h`` of a
bidirectional layer is wrong (max abs error 0.52 against onnxruntime; ``Y`` is right), so Kiln
takes it from ``Y`` instead: ``Y_h = [Y[seq - 1, 0], Y[0, 1]]`` (StridedSlice, Concat, Reshape).
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.linear import reshape_table
from backends.mnn.lower.recurrent import recurrent_check
from backends.mnn.lower.registry import Lowering
from backends.mnn.lower.slicing import emit_strided_slice
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node, Value

__all__ = ["LOWERINGS"]


def _blocks(w: np.ndarray, r: np.ndarray, b: np.ndarray, hid: int) -> list[np.ndarray]:
    """One direction's five RNNSequenceGRU constants from ONNX's W [3h, in], R [3h, h], B [6h]."""
    wz, wr, wh = w[:hid], w[hid : 2 * hid], w[2 * hid :]
    rz, rr, rh = r[:hid], r[hid : 2 * hid], r[2 * hid :]
    gate_w = np.concatenate([np.concatenate([wz, wr]).T, np.concatenate([rz, rr]).T])
    cand_w = np.concatenate([wh.T, rh.T])
    return [gate_w, b[None, : 2 * hid], cand_w, b[None, 2 * hid : 3 * hid], b[None, 3 * hid :]]


def _used(graph: Graph, v: Value) -> bool:
    return bool(graph.users(v)) or any((o.node, o.port) == (v.node, v.port) for o in graph.outputs)


def _lower(ctx: LowerContext, node: Node) -> None:
    g = ctx.graph
    ins = list(g.inputs_of(node)) + [None] * 6
    x, w_v, r_v, b_v, h0 = ins[0], ins[1], ins[2], ins[3], ins[5]
    assert x is not None and w_v is not None and r_v is not None and w_v.const is not None
    assert r_v.const is not None
    hid = int(node.attrs.hidden_size)
    nd = w_v.const.shape[0]
    name = ctx.op_name(node)
    b = b_v.const if b_v is not None and b_v.const is not None else np.zeros((nd, 6 * hid), np.float32)
    tensors = [ctx.tensor(x, Format.NCHW)]
    for d in range(nd):
        for k, arr in enumerate(_blocks(w_v.const[d], r_v.const[d], b[d], hid)):
            tensors.append(ctx.const_tensor(np.ascontiguousarray(arr, np.float32), f"{name}__w{d}_{k}"))
    if h0 is not None:
        tensors.append(ctx.tensor(h0, Format.NCHW))
    y_v, yh_v = g.value(node, 0), g.value(node, 1) if node.num_outputs > 1 else None
    y = ctx.define(y_v, Format.NCHW)
    derive = nd == 2 and yh_v is not None and _used(g, yh_v)
    if yh_v is None:
        yh = ctx.temp(f"{y_v.name}__h")
    elif derive:
        yh = ctx.temp(f"{yh_v.name}__mnn")
    else:
        yh = ctx.define(yh_v, Format.NCHW)
    fields = {
        "numUnits": hid,
        "isBidirectionalRNN": nd == 2,
        "linearBeforeReset": bool(node.attrs.linear_before_reset),
    }
    fields["keepAllOutputs"] = True
    ctx.emit("RNNSequenceGRU", name, tensors, [y, yh], Table("RNNParam", fields))
    if derive:
        assert yh_v is not None
        seq, _, batch, _ = ctx.shape(y_v)
        parts = []
        for d, t in ((0, seq - 1), (1, 0)):
            part = ctx.temp(f"{yh_v.name}__dir{d}")
            emit_strided_slice(
                ctx, f"{name}__h{d}", y, part, [t, d, 0, 0], [t + 1, d + 1, batch, hid], [1] * 4, 0
            )
            parts.append(part)
        cat = ctx.temp(f"{yh_v.name}__cat")
        ctx.emit(
            "Concat", f"{name}__hcat", parts, [cat], Table("Axis", {"axis": 1}, force=frozenset({"axis"}))
        )
        ctx.emit(
            "Reshape", f"{name}__h", [cat], [ctx.define(yh_v, Format.NCHW)], reshape_table(ctx.shape(yh_v))
        )


LOWERINGS: dict[str, Lowering] = {"GRU": Lowering(_lower, recurrent_check)}
