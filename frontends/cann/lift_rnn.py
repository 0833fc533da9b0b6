"""Lift GE's DynamicRNN and DynamicGRUV2 into Kiln LSTM / GRU: the inverse of ``backends/cann/lower_rnn.py``.

``DynamicRNN(x, w, b[, seq_length, init_h, init_c, wci, wcf, wco, mask])`` with w [I + H, 4H]
and b [4H] constant becomes ``LSTM(x, W, R, B, , init_h, init_c)`` of one direction
(UNIDIRECTIONAL forward, REDIRECTIONAL reverse) with W = w[:I]ᵀ, R = w[I:]ᵀ (blocks back in
ONNX's i, o, f, c order from ``gate_order``), B = [b (+ forget_bias on f), 0].

Outputs: y (port 0) is the LSTM's Y reshaped to [T, B, H]; output_h (port 1) equals y at every
step (no projection, no sequence mask). output_c (port 2) holds the cell state at every step,
which ONNX does not give: it may only be read through StridedSliceV2 ops that select the
final step (T-1 forward, 0 reverse), which become the LSTM's Y_c. The gate outputs (3-7) cannot
be read. Anything else (peepholes, masks, a projection, clipping, batch-major, another cell or
activation) is refused with the attribute named.

``DynamicGRUV2(x, weight_input, weight_hidden[, bias_input, bias_hidden, seq_length, init_h])``
with constant weights becomes ``GRU(x, W, R, B, , init_h)`` of one direction with W =
weight_inputᵀ, R = weight_hiddenᵀ (blocks back in ONNX's z, r, h order from ``gate_order`` "zrh"
or "rzh"), B = [bias_input, bias_hidden] (a missing one is zeros), linear_before_reset =
reset_after, and init_h [B, H] reshaped to [1, B, H]. y and output_h (ports 0, 1) are both the
GRU's Y reshaped to [T, B, H]; the gate outputs (2-5) cannot be read.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value
from frontends.cann.lift import Lifter, LiftError, lifter
from schemas.cann.om_graph import OmOp
from schemas.cann.op_table import (
    DYNAMIC_GRU_OUTPUTS,
    DYNAMIC_RNN_DIRECTIONS,
    DYNAMIC_RNN_OUTPUTS,
    gru_gate_blocks,
    lstm_gate_blocks,
)

__all__: list[str] = []

_DIRECTION = {v: k for k, v in DYNAMIC_RNN_DIRECTIONS.items()}


def _check_attrs(lf: Lifter, op: OmOp) -> tuple[str, str, float]:
    """(Kiln direction, gate order, forget bias); LiftError for what an ONNX LSTM cannot express."""
    if lf.attr(op, "cell_type", "s", "LSTM") != "LSTM":
        raise LiftError("only cell_type LSTM is supported")
    direction = _check_common(lf, op)
    order = lf.attr(op, "gate_order", "s", "ijfo")
    assert isinstance(order, str)
    bias = lf.attr(op, "forget_bias", "f", 0.0)
    assert isinstance(bias, float)
    return direction, order, bias


def _check_common(lf: Lifter, op: OmOp) -> str:
    """The Kiln direction of a DynamicRNN / DynamicGRUV2; LiftError for the attributes ONNX lacks."""
    direction = lf.attr(op, "direction", "s", "UNIDIRECTIONAL")
    if direction not in _DIRECTION:
        raise LiftError(f"direction {direction!r} (Kiln reads {', '.join(_DIRECTION)})")
    for key, kind, want in (
        ("use_peephole", "b", False),
        ("num_proj", "i", 0),
        ("time_major", "b", True),
        ("activation", "s", "tanh"),
    ):
        if lf.attr(op, key, kind, want) != want:
            raise LiftError(f"{key}={lf.attr(op, key, kind, want)!r} is not supported")
    if lf.attr(op, "cell_depth", "i", 1) not in (0, 1):
        raise LiftError("only cell_depth 1 is supported")
    keep = lf.attr(op, "keep_prob", "f", 1.0)
    if not isinstance(keep, float) or (keep != 1.0 and keep >= 0):
        raise LiftError(f"keep_prob={keep} (dropout) is not supported")
    clip = lf.attr(op, "cell_clip", "f", -1.0)
    if not isinstance(clip, float) or clip >= 0:
        raise LiftError(f"cell_clip={clip} (ONNX's clip bounds the gates, not the cell) is not supported")
    return _DIRECTION[str(direction)]


def _final_step_slice(lf: Lifter, user: OmOp, steps: int, direction: str) -> bool:
    """Whether ``user`` is a StridedSliceV2 that keeps exactly the final step along axis 0."""
    if user.type != "StridedSliceV2" or len(user.inputs) not in (3, 4, 5):
        return False
    try:
        begin, end = (lf.const(user, k, "bound").reshape(-1) for k in (1, 2))
        axes = lf.const(user, 3, "axes").reshape(-1) if len(user.inputs) > 3 and user.inputs[3] else [0]
        step = lf.const(user, 4, "strides").reshape(-1) if len(user.inputs) > 4 and user.inputs[4] else [1]
    except LiftError:
        return False
    if len(begin) != 1 or len(end) != 1 or list(axes) != [0] or list(step) != [1]:
        return False
    kept = list(range(steps))[slice(int(begin[0]), int(end[0]))]
    return kept == [steps - 1 if direction == "forward" else 0]


@lifter("DynamicRNN", multi_output=True)
def _dynamic_rnn(lf: Lifter, op: OmOp) -> list[Value | None]:
    direction, order, forget_bias = _check_attrs(lf, op)
    refs = list(op.inputs) + [""] * 10
    if refs[3] or any(refs[6:10]):
        raise LiftError("seq_length, peephole (wci/wcf/wco) and mask inputs are not supported")
    x = lf.value(refs[0])
    if x is None or x.type.rank != 3:
        raise LiftError("x must be a 3-D [T, B, I] tensor")
    w, b = lf.const(op, 1, "w"), lf.const(op, 2, "b")
    steps, batch, n_in = x.type.static_shape
    if w.ndim != 2 or w.shape[1] % 4 or w.shape[0] != n_in + w.shape[1] // 4 or b.shape != (w.shape[1],):
        raise LiftError(f"w {list(w.shape)} / b {list(b.shape)} do not fit x {list(x.type.static_shape)}")
    try:
        blocks = lstm_gate_blocks(order)
    except ValueError as exc:
        raise LiftError(str(exc)) from None
    hid = w.shape[1] // 4
    cols = np.concatenate([np.arange(m * hid, (m + 1) * hid) for m in blocks])
    wt, bias = w[:, cols], b[cols].copy()
    if forget_bias:
        bias[2 * hid : 3 * hid] += np.asarray(forget_bias, b.dtype)
    W = lf.g.add_constant(np.ascontiguousarray(wt[:n_in].T[None]), f"{op.name}/W")
    R = lf.g.add_constant(np.ascontiguousarray(wt[n_in:].T[None]), f"{op.name}/R")
    B = lf.g.add_constant(np.concatenate([bias, np.zeros_like(bias)])[None], f"{op.name}/B")
    inputs = [x, W, R, B, None, lf.value(refs[4]), lf.value(refs[5])]
    attrs = {"hidden_size": hid, "direction": direction}
    y4, _, y_c = lf.multi("LSTM", inputs, attrs, [f"{op.name}/Y", f"{op.name}/Y_h", f"{op.name}/Y_c"])
    shape = lf.g.add_constant(np.array([steps, batch, hid], np.int64), f"{op.name}/shape")
    y = lf.node("Reshape", [y4, shape], None, op.name)
    for user, port in lf.users.get(f"{op.name}:2", []):
        if port != 0 or not _final_step_slice(lf, user, steps, direction):
            raise LiftError(
                f"output_c (the cell state at every step) is read by {user.name!r}; Kiln reads it only "
                "through a StridedSliceV2 of the final step"
            )
        lf.check(user, y_c)
        lf.values[f"{user.name}:0"] = y_c
        lf.done.add(user.name)
    for port in range(3, len(DYNAMIC_RNN_OUTPUTS)):
        lf.unavailable(op, port, f"DynamicRNN's gate output {DYNAMIC_RNN_OUTPUTS[port]!r} has no ONNX form")
    lf.unavailable(op, 2, "output_c at every step has no ONNX form")
    return [y, y, None]


@lifter("DynamicGRUV2", multi_output=True)
def _dynamic_gru_v2(lf: Lifter, op: OmOp) -> list[Value | None]:
    direction = _check_common(lf, op)
    order, reset_after = lf.attr(op, "gate_order", "s", "zrh"), lf.attr(op, "reset_after", "b", True)
    try:
        blocks = gru_gate_blocks(str(order))
    except ValueError as exc:
        raise LiftError(str(exc)) from None
    refs = list(op.inputs) + [""] * 7
    if refs[5]:
        raise LiftError("seq_length is not supported")
    x = lf.value(refs[0])
    if x is None or x.type.rank != 3:
        raise LiftError("x must be a 3-D [T, B, I] tensor")
    steps, batch, n_in = x.type.static_shape
    wi, wh = lf.const(op, 1, "weight_input"), lf.const(op, 2, "weight_hidden")
    hid = wh.shape[0] if wh.ndim == 2 else 0
    if wi.shape != (n_in, 3 * hid) or wh.shape != (hid, 3 * hid):
        raise LiftError(f"weight_input {list(wi.shape)} / weight_hidden {list(wh.shape)} do not fit x")
    cols = np.concatenate([np.arange(m * hid, (m + 1) * hid) for m in blocks])
    biases: list[np.ndarray | None] = []
    for port, what in ((3, "bias_input"), (4, "bias_hidden")):
        b = lf.const(op, port, what).reshape(-1) if refs[port] else None
        if b is not None and b.shape != (3 * hid,):
            raise LiftError(f"{what} {list(b.shape)} is not [{3 * hid}]")
        biases.append(None if b is None else b[cols])
    W = lf.g.add_constant(np.ascontiguousarray(wi[:, cols].T[None]), f"{op.name}/W")
    R = lf.g.add_constant(np.ascontiguousarray(wh[:, cols].T[None]), f"{op.name}/R")
    B = None
    if any(b is not None for b in biases):
        parts = [np.zeros(3 * hid, wi.dtype) if b is None else b for b in biases]
        B = lf.g.add_constant(np.concatenate(parts)[None], f"{op.name}/B")
    h0 = lf.value(refs[6])
    if h0 is not None and h0.type.rank == 2:
        shape = lf.g.add_constant(np.array([1, batch, hid], np.int64), f"{op.name}/init_h_shape")
        h0 = lf.node("Reshape", [h0, shape], None, f"{op.name}/initial_h")
    attrs = {"hidden_size": hid, "direction": direction, "linear_before_reset": int(bool(reset_after))}
    y4, _ = lf.multi("GRU", [x, W, R, B, None, h0], attrs, [f"{op.name}/Y", f"{op.name}/Y_h"])
    shape = lf.g.add_constant(np.array([steps, batch, hid], np.int64), f"{op.name}/shape")
    y = lf.node("Reshape", [y4, shape], None, op.name)
    for port in range(2, len(DYNAMIC_GRU_OUTPUTS)):
        lf.unavailable(op, port, f"DynamicGRUV2's gate output {DYNAMIC_GRU_OUTPUTS[port]!r} has no ONNX form")
    return [y, y]
