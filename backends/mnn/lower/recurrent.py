"""Recurrent ops: ONNX LSTM and RNN -> MNN's own LSTM / RNN op (OpType 38 / 147, param ``LSTM``).

MNN 3.6.1's runtime runs an ONNX-style recurrent layer natively: ``GeometryLSTM`` turns
``LSTM{outputCount = hidden}`` with inputs ``[X, W, R, B, (initial_h, initial_c)]`` into
its loop kernels (the per-op callback reports them as ``While`` commands of the op), with
outputs ``Y`` [seq, dirs, batch, hidden], ``Y_h`` and ``Y_c`` [dirs, batch, hidden]. W and R
are ONNX's ([dirs, G*hidden, input], gates i, o, f, c for LSTM), B is the sum of ONNX's
``Wb`` and ``Rb`` halves ([dirs, G*hidden]; what MNN's converter writes with
``--useOriginRNNImpl``). Direction 1 of a bidirectional layer runs reversed, as in ONNX.

What MNN's kernel computes fixes what Kiln can hand it (the rest is refused):

* the default activations only (LSTM: sigmoid, tanh, tanh; RNN: tanh), no ``clip``,
  no ``input_forget``, no peepholes, ``layout`` 0;
* ``direction`` forward or bidirectional (a one-direction ``reverse`` layer would run forward);
* no ``sequence_lens``, or a constant one equal to the sequence length for every row
  (MNN ignores it);
* constant W, R and B; initial states either both absent (zeros) or given (a missing one
  is written as a zero constant: MNN reads them by position).
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node

__all__ = ["LOWERINGS"]

_GATES = {"LSTM": 4, "RNN": 1}
_DEFAULT_ACTS = {"LSTM": ("sigmoid", "tanh", "tanh"), "RNN": ("tanh",)}


def _check(graph: Graph, node: Node) -> str | None:
    a = node.attrs
    ins = graph.inputs_of(node)
    x = ins[0]
    assert x is not None
    if not x.type.dtype.is_float:
        return "float tensors only"
    if a.layout != 0:
        return "layout 1 (MNN's kernel reads [seq, batch, input])"
    if a.direction not in ("forward", "bidirectional"):
        return f"direction {a.direction} (MNN runs a single direction forward)"
    acts = tuple(s.lower() for s in a.activations)
    default = _DEFAULT_ACTS[node.op]
    if acts not in (default, default * 2) or a.activation_alpha or a.activation_beta:
        return f"activations {list(a.activations)} (MNN's kernel has the defaults only)"
    if a.clip is not None:
        return "clip"
    if node.op == "LSTM" and a.input_forget:
        return "input_forget"
    if any(v is None or v.const is None for v in ins[1:3]) or (
        len(ins) > 3 and ins[3] is not None and ins[3].const is None
    ):
        return "W, R and B must be constant"
    if len(ins) > 7 and ins[7] is not None:
        return "peepholes"
    lens = ins[4] if len(ins) > 4 else None
    if lens is not None:
        seq = x.type.static_shape[0]
        if lens.const is None or not np.all(lens.const == seq):
            return "sequence_lens other than the full length (MNN ignores them)"
    return None


def _lower(ctx: LowerContext, node: Node) -> None:
    ins = ctx.graph.inputs_of(node)
    x_value, w_value, r_value = ins[0], ins[1], ins[2]
    assert x_value is not None and w_value is not None and r_value is not None
    assert w_value.const is not None
    name = ctx.op_name(node)
    hidden = int(node.attrs.hidden_size)
    dirs = int(w_value.const.shape[0])
    gh = _GATES[node.op] * hidden
    b_value = ins[3] if len(ins) > 3 else None
    if b_value is not None and b_value.const is not None:
        b = b_value.const.astype(np.float32).reshape(dirs, 2 * gh)
        bias = b[:, :gh] + b[:, gh:]
    else:
        bias = np.zeros((dirs, gh), np.float32)
    tensors = [
        ctx.tensor(x_value, Format.NCHW),
        ctx.tensor(w_value, Format.NCHW),
        ctx.tensor(r_value, Format.NCHW),
        ctx.const_tensor(np.ascontiguousarray(bias, np.float32), f"{name}__bias"),
    ]
    states = [ins[i] if len(ins) > i else None for i in ((5, 6) if node.op == "LSTM" else (5,))]
    if any(s is not None for s in states):
        batch = ctx.shape(x_value)[1]
        zeros = np.zeros((dirs, batch, hidden), np.float32)
        for s in states:
            tensors.append(
                ctx.tensor(s, Format.NCHW) if s is not None else ctx.const_tensor(zeros, f"{name}__zero")
            )
    outs = [ctx.define(ctx.graph.value(node, p), Format.NCHW) for p in range(node.num_outputs)]
    for p in range(node.num_outputs, 1 + len(states)):
        outs.append(ctx.temp(f"{name}__out{p}"))
    param = Table("LSTM", {"outputCount": hidden}, force=frozenset({"outputCount"}))
    ctx.emit(node.op, name, tensors, outs, param)


LOWERINGS: dict[str, Lowering] = {op: Lowering(_lower, _check) for op in _GATES}
