"""LSTM -> DynamicRNN and GRU -> DynamicGRUV2, the forms ATC's fusion passes write.

LSTM -> DynamicRNN, as ATC's CommonLSTM fusion pass writes it (ops-nn ``common_lstm_fusion_pass``).

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

GRU -> DynamicGRUV2, the form ATC's CommonGRU fusion writes (ops-nn ``gru_fusion_pass``; op
definition ``rnn.h`` REG_OP(DynamicGRUV2), kernel ``impl/dynamic_gru_v2.py``). Per direction d:

* ``weight_input`` = W_dᵀ [input, 3·hidden], ``weight_hidden`` = R_dᵀ [hidden, 3·hidden], gate
  blocks in GE's ``gate_order`` "zrh", which is ONNX's z, r, h (:func:`gru_gate_blocks`);
* ``bias_input`` = Wb_d, ``bias_hidden`` = Rb_d (each [3·hidden]; both absent without B);
* ``init_h`` = [batch, hidden] (the direction's slice of ONNX's initial_h, reshaped);
* attrs ``DYNAMIC_GRU_ATTRS``: reset_after true, i.e. h̃ = tanh(x Whᵀ + Wbh + r ⊙ (H Rhᵀ + Rbh)),
  which is ONNX's linear_before_reset=1.

Outputs y, output_h, update, reset, new, hidden_new are [T, batch, hidden] in the input's time
order (the kernel walks t = T-1 .. 0 for REDIRECTIONAL and writes step t at row t), so Y and Y_h
are bound like the LSTM's: Y = y reshaped to [T, 1, batch, hidden], Y_h = output_h at T-1
(forward) or 0 (reverse), two directions concatenated.

Where GE's tools are wrong and what Kiln writes instead:

* ATC's ONNX GRU plugin reads only hidden_size (and direction) and the fusion never sets
  ``reset_after``, so an ONNX GRU with linear_before_reset=0 (the default) becomes a reset_after
  GRU: wrong numbers. The kernel refuses reset_after=false, so Kiln refuses linear_before_reset=0
  with that reason (no GE op computes (r ⊙ H) Rhᵀ).
* ATC's bidirectional fusion takes Y_h of the REDIRECTIONAL half from row T-1 (StridedSlice
  begin -1); the kernel's final reverse state is row 0. Kiln slices row 0.

Refused for GRU, with the reason: batch-major layout, activations other than (Sigmoid, Tanh),
activation_alpha/beta, ``clip``, linear_before_reset=0, non-constant W/R/B and sequence_lens
other than a constant full length.
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
    DYNAMIC_GRU_ATTRS,
    DYNAMIC_GRU_OUTPUTS,
    DYNAMIC_RNN_ATTRS,
    DYNAMIC_RNN_DIRECTIONS,
    DYNAMIC_RNN_OUTPUTS,
    gru_gate_blocks,
    lstm_gate_blocks,
)

__all__ = ["dynamic_rnn_weights", "dynamic_gru_weights"]

_DEFAULT_ACTS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh")}
_GE_OP = {"LSTM": "DynamicRNN", "GRU": "DynamicGRUV2"}


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


def _cell_reason(graph: Graph, node: Node) -> str | None:
    """What an LSTM or GRU node has that its GE op (DynamicRNN / DynamicGRUV2) cannot express."""
    a, ge = node.attrs, _GE_OP[node.op]
    x = graph.inputs_of(node)[0]
    assert x is not None
    if a.layout != 0:
        return f"layout=1 (batch-major) has no {ge} form Kiln can vouch for (time_major=false)"
    if x.type.dtype not in (DType.FLOAT32, DType.FLOAT16):
        return f"dtype {x.type.dtype.name} ({ge} computes float32 or float16)"
    try:
        acts = resolve_activations(node.op, a)
    except ValueError as exc:
        return str(exc)
    want = _DEFAULT_ACTS[node.op]
    names = [n.lower() for n in a.activations] or list(want)
    n = len(want)
    if any(tuple(names[k : k + n]) != want for k in range(0, len(names), n)) or len(acts[0]) != n:
        shown = ", ".join(w.capitalize() for w in want)
        return f"activations {list(a.activations)} ({ge} computes {shown})"
    if a.activation_alpha or a.activation_beta:
        return f"activation_alpha/beta have no {ge} form"
    for i, what in ((1, "W"), (2, "R"), (3, "B")):
        v = _arg(graph, node, i)
        if v is not None and _weight(graph, v) is None:
            return f"{what} must be constant ({ge}'s weights and biases are constants)"
    seq = _arg(graph, node, 4)
    if seq is not None:
        steps = x.type.static_shape[0] if x.type.is_static else None
        if seq.const is None or steps is None or np.any(seq.const != steps):
            return f"sequence_lens other than the full length ({ge}'s seq mask does not give the final state)"
    return None


def _lstm_reason(graph: Graph, node: Node) -> str | None:
    a = node.attrs
    if a.clip is not None:
        return f"clip={a.clip}: ONNX clips the gate pre-activations, DynamicRNN's cell_clip the cell state"
    if a.input_forget:
        return "input_forget=1 (coupled forget gate) has no DynamicRNN form"
    why = _cell_reason(graph, node)
    if why is not None:
        return why
    p = _arg(graph, node, 7)
    if p is not None and (p.const is None or np.any(p.const != 0)):
        return "peepholes P (DynamicRNN's wci/wcf/wco layout is not documented)"
    return None


def _gru_reason(graph: Graph, node: Node) -> str | None:
    a = node.attrs
    if a.clip is not None:
        return f"clip={a.clip}: DynamicGRUV2 has no gate clipping (its kernel requires cell_clip=-1)"
    if not a.linear_before_reset:
        return (
            "linear_before_reset=0: DynamicGRUV2's kernel computes only reset_after=true, "
            "r ⊙ (H Rhᵀ + Rbh); no GE op computes (r ⊙ H) Rhᵀ"
        )
    return _cell_reason(graph, node)


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


def dynamic_gru_weights(
    w: np.ndarray, r: np.ndarray, b: np.ndarray | None, gate_order: str = "zrh"
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """DynamicGRUV2's (weight_input, weight_hidden, bias_input, bias_hidden) of one direction from
    ONNX's W [3H, I], R [3H, H], B [6H] (or None: no biases)."""
    hid = r.shape[1]
    cols = np.empty(3 * hid, np.int64)  # GE column c holds ONNX row cols[c]
    for k, m in enumerate(gru_gate_blocks(gate_order)):
        cols[m * hid : (m + 1) * hid] = np.arange(k * hid, (k + 1) * hid)
    wi, wh = np.ascontiguousarray(w[cols].T), np.ascontiguousarray(r[cols].T)
    if b is None:
        return wi, wh, None, None
    return wi, wh, b[: 3 * hid][cols], b[3 * hid :][cols]


@lowering("GRU", check=_gru_reason, multi_output=True)
def _gru(low: Lowerer, node: Node) -> None:
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
    h0 = _arg(g, node, 5)
    grus: list[str] = []
    for d, direction in enumerate(dirs):
        name = low.names.fresh(f"{base}/DynamicGRUV2" + ("" if len(dirs) == 1 else f"_{direction}"))
        wi, wh, bi, bh = dynamic_gru_weights(w_all[d], r_all[d], None if b_all is None else b_all[d])
        inputs = [low.ref_of(x), low.const(wi, f"{name}/weight_input")]
        inputs.append(low.const(wh, f"{name}/weight_hidden"))
        if bi is None or bh is None:
            inputs += ["", ""]
        else:
            inputs += [low.const(bi, f"{name}/bias_input"), low.const(bh, f"{name}/bias_hidden")]
        inputs.append("")  # seq_length
        inputs.append("" if h0 is None else _init_h(low, h0, d, len(dirs), state_t, f"{name}/init_h"))
        while inputs[-1] == "":
            inputs.pop()
        attrs = {"direction": Attr.s(DYNAMIC_RNN_DIRECTIONS[direction]), **DYNAMIC_GRU_ATTRS}
        outs = [TensorDesc(dt, step_t.static_shape, "ND")] * len(DYNAMIC_GRU_OUTPUTS)
        low.emit(name, "DynamicGRUV2", inputs, outs, attrs)
        grus.append(name)
    _bind_outputs(low, node, grus, dirs, step_t, state_t)


def _init_h(low: Lowerer, h0: Value, d: int, nd: int, state_t: TensorType, name: str) -> str:
    """DynamicGRUV2's init_h [batch, hidden]: direction d of ONNX's initial_h [nd, batch, hidden]."""
    _, batch, hid = state_t.static_shape
    src = low.ref_of(h0)
    if nd > 1:
        src = low.slice(src, state_t, d, d + 1, 0, low.names.fresh(f"{name}/slice"))
    shape = low.int_const((batch, hid), f"{name}/shape")
    t = TensorType(state_t.dtype, (batch, hid))
    attrs = {"axis": Attr.i(0), "num_axes": Attr.i(-1)}
    return low.emit(low.names.fresh(name), "Reshape", [src, shape], [low.desc(t)], attrs)


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
