"""LSTM -> DynamicRNN, the form ATC's CommonLSTM fusion pass writes (ops-nn ``common_lstm_fusion_pass``).

Per direction d (ONNX gate blocks i, o, f, c; DynamicRNN's gate_order "ijfo", j = c):

* ``w`` = [W_dᵀ; R_dᵀ] of shape [input + hidden, 4·hidden] with the column blocks reordered
  i, c, f, o (:func:`schemas.cann.op_table.lstm_gate_blocks`), so that [x_t, h] · w = x_t W_dᵀ + h R_dᵀ;
* ``b`` = Wb_d + Rb_d, reordered the same way (zeros without B);
* ``init_h`` / ``init_c`` = [1, batch, hidden] (the direction's slice of ONNX's initial states);
* attrs: direction UNIDIRECTIONAL (forward) or REDIRECTIONAL (reverse), time_major, tanh, no
  peephole, no clip, no projection, forget_bias 0 (``DYNAMIC_RNN_ATTRS``).

DynamicRNN's outputs are all [T, batch, hidden] in the input's time order: y = h at every step,
h, c at every step, then the gates. ONNX's Y is y reshaped to [T, 1, batch, hidden] (two
directions: ConcatD on axis 1), Y_h / Y_c the final step of output_h / output_c
(``StridedSliceV2``: step T-1 forward, step 0 reverse; two directions: ConcatD on axis 0).

Refused, with the reason: batch-major layout, activations other than (Sigmoid, Tanh, Tanh),
``clip`` (ONNX clips the gate pre-activations, DynamicRNN's cell_clip the cell state),
``input_forget``, non-constant weights (int8 weights, a DequantizeLinear of constants, are read as
their float values), non-zero peepholes, and sequence_lens other than a
constant full length (DynamicRNN's seq mask does not define ONNX's final states).
"""

from __future__ import annotations

import numpy as np

from backends.cann.lower import Lowerer, lowering
from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType, TensorType
from compiler.ops.recurrent import resolve_activations
from compiler.ops.registry import get_op
from schemas.cann.om_graph import Attr, TensorDesc
from schemas.cann.op_table import (
    DYNAMIC_RNN_ATTRS,
    DYNAMIC_RNN_DIRECTIONS,
    DYNAMIC_RNN_OUTPUTS,
    lstm_gate_blocks,
)

__all__ = ["dynamic_rnn_weights"]

_DEFAULT_ACTS = ("sigmoid", "tanh", "tanh")


def _arg(graph: Graph, node: Node, i: int) -> Value | None:
    ins = graph.inputs_of(node)
    return ins[i] if i < len(ins) else None


def _weight(graph: Graph, v: Value | None) -> np.ndarray | None:
    """A constant input, or the float value of a DequantizeLinear of constants (int8 W and R of
    ``--quantize int8``, which DynamicRNN reads as float weights: the QDQ model's numbers)."""
    if v is None or v.const is not None:
        return None if v is None else v.const
    p = v.producer
    if p.op != "DequantizeLinear" or p.domain:
        return None
    consts = [u.const if u is not None else None for u in graph.inputs_of(p)]
    if any(c is None for c, u in zip(consts, graph.inputs_of(p), strict=True) if u is not None):
        return None
    return np.asarray(get_op("DequantizeLinear").reference(consts, p.attrs, 1)[0])


def _lstm_reason(graph: Graph, node: Node) -> str | None:
    a = node.attrs
    x = graph.inputs_of(node)[0]
    assert x is not None
    if a.layout != 0:
        return "layout=1 (batch-major) has no DynamicRNN form Kiln can vouch for (time_major=false)"
    if x.type.dtype not in (DType.FLOAT32, DType.FLOAT16):
        return f"dtype {x.type.dtype.name} (DynamicRNN computes float32 or float16)"
    try:
        acts = resolve_activations("LSTM", a)
    except ValueError as exc:
        return str(exc)
    names = [n.lower() for n in a.activations] or list(_DEFAULT_ACTS)
    if any(tuple(names[k : k + 3]) != _DEFAULT_ACTS for k in range(0, len(names), 3)) or len(acts[0]) != 3:
        return f"activations {list(a.activations)} (DynamicRNN computes Sigmoid, Tanh, Tanh)"
    if a.activation_alpha or a.activation_beta:
        return "activation_alpha/beta have no DynamicRNN form"
    if a.clip is not None:
        return f"clip={a.clip}: ONNX clips the gate pre-activations, DynamicRNN's cell_clip the cell state"
    if a.input_forget:
        return "input_forget=1 (coupled forget gate) has no DynamicRNN form"
    for i, what in ((1, "W"), (2, "R"), (3, "B")):
        v = _arg(graph, node, i)
        if v is not None and _weight(graph, v) is None:
            return f"{what} must be constant (DynamicRNN's w and b are weights)"
    seq = _arg(graph, node, 4)
    if seq is not None:
        steps = x.type.static_shape[0] if x.type.is_static else None
        if seq.const is None or steps is None or np.any(seq.const != steps):
            return "sequence_lens other than the full length (DynamicRNN's seq mask does not give Y_h/Y_c)"
    p = _arg(graph, node, 7)
    if p is not None and (p.const is None or np.any(p.const != 0)):
        return "peepholes P (DynamicRNN's wci/wcf/wco layout is not documented)"
    return None


def dynamic_rnn_weights(
    w: np.ndarray, r: np.ndarray, b: np.ndarray | None, gate_order: str = "ijfo"
) -> tuple[np.ndarray, np.ndarray]:
    """DynamicRNN's (w, b) of one direction from ONNX's W [4H, I], R [4H, H], B [8H] (or None)."""
    hid = r.shape[1]
    blocks = lstm_gate_blocks(gate_order)
    wt = np.concatenate([w.T, r.T], axis=0)  # [I + H, 4H], ONNX block order
    bias = np.zeros(4 * hid, w.dtype) if b is None else b[: 4 * hid] + b[4 * hid :]
    w_ge, b_ge = np.empty_like(wt), np.empty_like(bias)
    for k, m in enumerate(blocks):
        w_ge[:, m * hid : (m + 1) * hid] = wt[:, k * hid : (k + 1) * hid]
        b_ge[m * hid : (m + 1) * hid] = bias[k * hid : (k + 1) * hid]
    return w_ge, b_ge


@lowering("LSTM", check=_lstm_reason, multi_output=True)
def _lstm(low: Lowerer, node: Node) -> None:
    g = low.g
    a = node.attrs
    x = g.inputs_of(node)[0]
    assert x is not None
    steps, batch, _ = x.type.static_shape
    hid = a.hidden_size
    dirs = ["forward", "reverse"] if a.direction == "bidirectional" else [a.direction]
    w_all, r_all = _weight(g, _arg(g, node, 1)), _weight(g, _arg(g, node, 2))
    b_all = _weight(g, _arg(g, node, 3))
    assert w_all is not None and r_all is not None
    base = g.value(node).name
    dt = x.type.dtype
    step_t = TensorType(dt, (steps, batch, hid))
    state_t = TensorType(dt, (1, batch, hid))
    rnns: list[str] = []
    for d, direction in enumerate(dirs):
        name = low.names.fresh(f"{base}/DynamicRNN" + ("" if len(dirs) == 1 else f"_{direction}"))
        b = None if b_all is None else b_all[d]
        w_ge, b_ge = dynamic_rnn_weights(w_all[d], r_all[d], b)
        inputs = [low.ref_of(x), low.const(w_ge, f"{name}/w"), low.const(b_ge, f"{name}/b"), ""]
        for port in (5, 6):
            s = _arg(g, node, port)
            if s is None:
                inputs.append("")
            elif len(dirs) == 1:
                inputs.append(low.ref_of(s))
            else:
                part = low.names.fresh(f"{name}/{('init_h', 'init_c')[port - 5]}")
                inputs.append(low.slice(low.ref_of(s), state_t, d, d + 1, 0, part))
        while inputs[-1] == "":
            inputs.pop()
        attrs = {"direction": Attr.s(DYNAMIC_RNN_DIRECTIONS[direction]), **DYNAMIC_RNN_ATTRS}
        outs = [TensorDesc(dt, step_t.static_shape, "ND")] * len(DYNAMIC_RNN_OUTPUTS)
        low.emit(name, "DynamicRNN", inputs, outs, attrs)
        rnns.append(name)
    _bind_outputs(low, node, rnns, dirs, step_t, state_t)


def _bind_outputs(
    low: Lowerer, node: Node, rnns: list[str], dirs: list[str], step_t: TensorType, state_t: TensorType
) -> None:
    steps, batch, hid = step_t.static_shape
    for port in range(node.num_outputs):
        if not low.used(node, port):
            continue
        out = low.g.value(node, port)
        parts = []
        for rnn, direction in zip(rnns, dirs, strict=True):
            part = out.name if len(rnns) == 1 else low.names.fresh(f"{out.name}/{direction}")
            if port == 0:
                shape = low.int_const((steps, 1, batch, hid), f"{part}/shape")
                t = TensorType(step_t.dtype, (steps, 1, batch, hid))
                attrs = {"axis": Attr.i(0), "num_axes": Attr.i(-1)}
                ref = low.emit(part, "Reshape", [f"{rnn}:0", shape], [low.desc(t)], attrs)
            else:
                at = steps - 1 if direction == "forward" else 0
                ref = low.slice(f"{rnn}:{port}", state_t, at, at + 1, 0, part)
            parts.append(ref)
        if len(parts) > 1:
            attrs = {"concat_dim": Attr.i(1 if port == 0 else 0), "N": Attr.i(2)}
            parts = [low.emit(out.name, "ConcatD", parts, [low.desc(out.type, node)], attrs)]
        low.bind(node, parts[0], port)
