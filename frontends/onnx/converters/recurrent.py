"""Converters of RNN, GRU and LSTM (opsets 7 to 21; ``layout`` exists from opset 14).

Each becomes the Kiln op of the same name with the same inputs (empty optional
inputs stay absent) and attributes, in the sequence-major form (``layout=0``):
``layout=1`` becomes Transposes around it (X and the initial states [batch, dirs, hidden]
-> [dirs, batch, hidden]; Y [seq, dirs, batch, hidden] -> [batch, seq, dirs, hidden]),
so that backends and onnxruntime (which refuses ``layout=1``) see one form. A missing
``hidden_size`` is read from R's static shape [num_directions, gates * hidden, hidden]. The version-1 forms
(``output_sequence``; GRU-1 without ``linear_before_reset``) are not converted:
opset 7 is the oldest handled.
"""

from __future__ import annotations

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter

__all__: list[str] = []


def _recurrent(ctx: NodeContext) -> list[Value | None]:
    """RNN / GRU / LSTM -> the op of the same name (layout 0); the outputs the ONNX node declares."""
    if ctx.opset < 14 and ctx.has_attr("layout"):
        raise ctx.fail(f"attribute layout needs opset 14, the model declares {ctx.opset}")
    hidden = ctx.pop("hidden_size")
    if hidden is None:
        r = ctx.type(2).shape
        if r is None or len(r) != 3 or not isinstance(r[2], int):
            raise ctx.fail("hidden_size is missing and R has no static hidden dim")
        hidden = r[2]
    layout = int(ctx.pop("layout", 0))
    if layout not in (0, 1):
        raise ctx.fail(f"layout must be 0 or 1, got {layout}")
    n = max(ctx.num_outputs, 1)
    attrs = ctx.rest(hidden_size=int(hidden))
    if not layout:
        direct: list[Value | None] = list(ctx.emit(ctx.op_type, ctx.inputs, attrs, num_outputs=n))
        return direct[: ctx.num_outputs]
    # batch-major: [batch, seq, input] and [batch, dirs, hidden] <-> the seq-major form
    ins = list(ctx.inputs)
    for i in (0, 5, 6):
        v = ins[i] if i < len(ins) else None
        if v is not None:
            ins[i] = ctx.emit("Transpose", [v], {"perm": (1, 0, 2)}, final=False)[0]
    outs = ctx.emit(ctx.op_type, ins, attrs, num_outputs=n, final=False)
    result: list[Value | None] = []
    for i, v in enumerate(outs[: ctx.num_outputs]):
        perm = (2, 0, 1, 3) if i == 0 else (1, 0, 2)
        t = ctx.emit("Transpose", [v], {"perm": perm}, final=False)[0]
        name = ctx.proto.output[i]
        if name:
            ctx.graph.rename(t, name)
        result.append(t)
    return result


for _op in ("RNN", "GRU", "LSTM"):
    converter(_op, since=7)(_recurrent)
    converter(_op, since=14)(_recurrent)
