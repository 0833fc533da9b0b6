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

With ``--mnn-weights int8|int4`` W and R are weight layers of the plan (one storage per node,
rows = the G*hidden gate rows of each direction, one scale per row): an int storage writes each
as an int8 Const of its levels q and a float Const of its per-row scales s, dequantized by MNN's
constant folding at load: ``Cast(q) * s`` (symmetric) or ``(Cast(q) - aMin) * s + min``
(asymmetric), the same values :func:`backends.mnn.weights.decoded_weights` gives the plan.
fp16 storage keeps them fp32 (MNN has no half constants; the plan measured fp16, so the file is
at least as accurate).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.elementwise import binary_table
from backends.mnn.lower.registry import Lowering, WeightView
from backends.mnn.model import Table
from backends.mnn.weights import WeightStorage, quantize_weights
from compiler.ir.graph import Graph, Node, Value
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "recurrent_check"]

_GATES = {"LSTM": 4, "RNN": 1}
_DEFAULT_ACTS = {"LSTM": ("sigmoid", "tanh", "tanh"), "RNN": ("tanh",), "GRU": ("sigmoid", "tanh")}


def recurrent_check(graph: Graph, node: Node) -> str | None:
    """Why MNN's LSTM / RNN / GRU sequence kernels cannot run ``node`` (None if they can)."""
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


def _views(graph: Graph, node: Node) -> tuple[WeightView, ...] | None:
    """W and R as [dirs * G * hidden, K] rows (one scale per gate row; no blocks: channels 1)."""
    views = []
    for port in (1, 2):
        v = graph.inputs_of(node)[port]
        if v is None or v.const is None:
            return None
        w = np.ascontiguousarray(v.const, np.float32)
        shape = w.shape
        views.append(WeightView(port, w.reshape(-1, shape[-1]), _reshaper(shape), 1, 1))
    return tuple(views)


def _reshaper(shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    def restore(rows: np.ndarray) -> np.ndarray:
        return rows.reshape(shape)

    return restore


def _weight(ctx: LowerContext, value: Value, storage: WeightStorage, base: str) -> int:
    """The tensor of W or R: the float constant, or int8 levels dequantized by a Cast and scales."""
    assert value.const is not None
    if storage.bits is None:
        return ctx.tensor(value, Format.NCHW)
    w = np.ascontiguousarray(value.const, np.float32)
    rows = w.reshape(-1, w.shape[-1])
    qw = storage.levels
    if qw is None:
        qw = quantize_weights(rows, storage.bits, storage.asymmetric, None, storage.fp16_scales)
    col = (*w.shape[:-1], 1)
    q = ctx.const_tensor(qw.q.reshape(w.shape).astype(np.int8), f"{base}__q")
    out = ctx.temp(f"{base}__dequant")
    cast = Table("CastParam", {"srcT": fb.DataType.DT_INT8, "dstT": fb.DataType.DT_FLOAT})
    ctx.emit("Cast", f"{base}__cast", [q], [out], cast)
    steps: list[tuple[int, np.ndarray]] = [(fb.BinaryOpOperation.MUL, qw.alpha)]
    if qw.asymmetric:
        steps = [
            (fb.BinaryOpOperation.ADD, np.array(-qw.a_min, np.float32)),
            (fb.BinaryOpOperation.MUL, qw.alpha[1::2]),
            (fb.BinaryOpOperation.ADD, qw.alpha[0::2]),
        ]
    for i, (kind, arr) in enumerate(steps):
        c = ctx.const_tensor(np.asarray(arr, np.float32).reshape(col if arr.ndim else ()), f"{base}__s{i}")
        nxt = ctx.temp(f"{base}__dequant{i}")
        ctx.emit("BinaryOp", f"{base}__dequant{i}", [out, c], [nxt], binary_table(kind))
        out = nxt
    return out


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
    storage = ctx.storage(node)
    tensors = [
        ctx.tensor(x_value, Format.NCHW),
        _weight(ctx, w_value, storage, f"{name}__W"),
        _weight(ctx, r_value, storage, f"{name}__R"),
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


LOWERINGS: dict[str, Lowering] = {op: Lowering(_lower, recurrent_check, _views) for op in _GATES}
