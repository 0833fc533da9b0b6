"""RNN, GRU and LSTM (every ONNX attribute: directions, activations, clip, layout, sequence_lens,
initial states, peepholes, all of Y, Y_h, Y_c).

With X as [seq, batch, input] (``layout=1`` transposed first) and W, R, B constants:

1. the input projection of every step and direction is one GEMM,
   ``xw = X Wcatᵀ + bcat`` with ``Wcat = [W_0; W_1]`` and ``bcat = Wb + Rb`` (GRU with
   ``linear_before_reset`` keeps Rbh out: it is multiplied by r);
2. each direction runs the step kernel (:mod:`backends.tvm.lowering.recurrent_cell`, the recurrent
   GEMM plus the fused gates) ``seq`` times, the state threaded from step to step: on CPU targets
   inside one sequence kernel per direction (:mod:`backends.tvm.lowering.recurrent_loop`, one
   runtime call); on CUDA as ``seq`` calls of the step kernel, whose step index is a tensor
   argument, so a direction compiles one PrimFunc whatever the sequence length;
3. Y is the concatenation of the per-step outputs (a reverse direction's in reverse order, or with
   ``sequence_lens`` gathered back to ``Y[t, b] = y_step[lens[b] - 1 - t, b]`` for ``t < lens[b]``),
   Y_h / Y_c the last states (0 on rows with ``lens[b] = 0``, as onnxruntime).

A constant ``sequence_lens`` equal to the sequence length everywhere is dropped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from backends.tvm.lowering.gpu_bind import bind_gpu
from backends.tvm.lowering.recurrent_cell import TIR_ACTIVATIONS, CellSpec, step_func, step_name
from backends.tvm.lowering.recurrent_loop import sequence_func
from backends.tvm.lowering.table import LowerContext, lowers
from compiler.ir.graph import Graph, Node
from compiler.ops.recurrent import ACTIVATIONS, resolve_activations

__all__: list[str] = []

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
# Below this many multiply-adds a step the sequence kernel's step runs on one thread: a fork/join
# every step costs more than it saves (hidden 128 LSTM, 65K: 2.56 us a step serial, 2.95 parallel).
_STEP_PARALLEL_MIN_MACS = 1 << 18
_FLOATS = ("float32", "float64")
_ACT_NAMES = {fn: name for name, (fn, _, _) in ACTIVATIONS.items()}


def _op() -> Any:
    from tvm import relax

    return relax.op


def _recurrent_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    x = ins[0]
    assert x is not None
    if x.type.dtype.numpy.name not in _FLOATS:
        return f"{node.op} on {x.type.dtype.short} has no TVM lowering (float32/float64 only)"
    consts = [(1, "W"), (2, "R"), (3, "B"), (7, "P")]
    for port, what in consts:
        v = ins[port] if port < len(ins) else None
        if (v is None and port < 3) or (v is not None and v.const is None):
            return f"{what} (input {port}) must be a constant for --target"
    try:
        acts = resolve_activations(node.op, node.attrs)
    except ValueError as exc:
        return str(exc)
    names = {_ACT_NAMES[fn] for direction in acts for fn, _, _ in direction}
    if not names <= TIR_ACTIVATIONS:
        return f"activation(s) {', '.join(sorted(names - TIR_ACTIVATIONS))} have no TVM lowering"
    return None


def _call_step(ctx: LowerContext, spec: CellSpec, args: list[Any]) -> list[Any]:
    """Emit one call of the step kernel (added to the module once per spec); its outputs."""
    from tvm import relax

    name = step_name(spec)
    gv = ctx.kernels.get(name)
    if gv is None:
        func = step_func(spec)
        if ctx.target.kind == "cuda":  # bound here: dlight's matmul/GEMV rules half-match the step
            func = bind_gpu(func, ctx.target)
        gv = ctx.bb.add_func(func.with_attr("global_symbol", name), name)
        ctx.kernels[name] = gv
    state = relax.TensorType((1, spec.batch, spec.hidden), spec.dtype)
    n = spec.num_outputs
    out = ctx.emit(relax.call_tir(gv, args, [state] * n if n > 1 else state))
    return [ctx.emit(relax.TupleGetItem(out, i)) for i in range(n)] if n > 1 else [out]


def _call_sequence(ctx: LowerContext, spec: CellSpec, reverse: bool, args: list[Any]) -> list[Any]:
    """Emit one call of the whole-direction kernel (:mod:`backends.tvm.lowering.recurrent_loop`);
    its outputs Y [seq, B, H], h_last[, c_last]."""
    from tvm import relax

    from backends.tvm.kernel_report import kernel_entry
    from backends.tvm.schedule_generic import schedule_primfunc

    name = f"{step_name(spec)}_seq{'_rev' if reverse else ''}"
    gv = ctx.kernels.get(name)
    if gv is None:
        macs = spec.batch * spec.gates * spec.hidden * spec.hidden
        target = ctx.target if macs >= _STEP_PARALLEL_MIN_MACS else replace(ctx.target, num_cores=1)
        func = sequence_func(schedule_primfunc(step_func(spec), target, name), spec, reverse)
        gv = ctx.bb.add_func(func.with_attr("global_symbol", name), name)
        ctx.kernels[name] = gv
        ctx.kernel_log.append(kernel_entry(name, func))
    state = relax.TensorType((1, spec.batch, spec.hidden), spec.dtype)
    ys = relax.TensorType((spec.seq, spec.batch, spec.hidden), spec.dtype)
    out = ctx.emit(relax.call_tir(gv, args, [ys] + [state] * spec.num_states))
    return [ctx.emit(relax.TupleGetItem(out, i)) for i in range(1 + spec.num_states)]


def _gather_reverse_te(ys: Any, lens: Any) -> Any:
    """Y[t, b, j] = ys[lens[b] - 1 - t, b, j] for t < lens[b], else 0 (ys indexed by step)."""
    from tvm import te, tirx

    seq = ys.shape[0]

    def body(t: Any, b: Any, j: Any) -> Any:
        src = tirx.max(lens[b] - tirx.const(1, "int32") - t.astype("int32"), tirx.const(0, "int32"))
        return tirx.Select(t.astype("int32") < lens[b], ys[src, b, j], tirx.const(0.0, ys.dtype))

    return te.compute((seq, ys.shape[1], ys.shape[2]), body, name="rnn_reverse_y")


def _initial_state(
    ctx: LowerContext, node: Node, ins: list[Any], port: int, d: int, shape: tuple[int, ...]
) -> Any:
    """Direction d's initial state [1, B, H] (zeros when the input is absent)."""
    dt = ctx.in_type(node, 0).dtype.numpy.name
    if port >= len(ins) or ins[port] is None:
        return ctx.const(np.zeros(shape, dt))
    c = ctx.input_const(node, port)
    if c is not None:
        arr = c.transpose(1, 0, 2) if node.attrs.layout else c
        return ctx.const(np.ascontiguousarray(arr[d : d + 1]).astype(dt))
    op = _op()
    x = ctx.emit(op.permute_dims(ins[port], [1, 0, 2])) if node.attrs.layout else ins[port]
    return ctx.emit(op.strided_slice(x, [0], [d], [d + 1]))


def _projection(ctx: LowerContext, node: Node, x: Any, seq: int, batch: int, dt: str) -> Any:
    """xw [seq, B, nd·G·H] = X Wcatᵀ + bcat (biases folded where they add to the pre-activation)."""
    op = _op()
    a = node.attrs
    hid, gh = a.hidden_size, _GATES[node.op] * a.hidden_size
    w = ctx.require_const(node, 1, "W").astype(dt)
    nd = w.shape[0]
    x2 = ctx.emit(op.reshape(x, (seq * batch, w.shape[2])))
    b = ctx.input_const(node, 3)
    bias = None
    if b is not None:
        b = b.astype(dt)
        rb = b[:, gh:].copy()
        if node.op == "GRU" and a.linear_before_reset:
            rb[:, 2 * hid :] = 0  # Rbh is inside r ⊙ (...): the step kernel adds it
        bias = np.ascontiguousarray((b[:, :gh] + rb).reshape(-1))
    if ctx.target.is_cpu and dt == "float32":  # Kiln's packed dense kernel, the bias in its epilogue
        xw = _dense(ctx, x2, seq * batch, w.reshape(nd * gh, w.shape[2]), bias)
    else:
        xw = ctx.emit(op.matmul(x2, ctx.const(np.ascontiguousarray(w.reshape(nd * gh, -1).T))))
        if bias is not None:
            xw = ctx.emit(op.add(xw, ctx.const(bias)))
    return ctx.emit(op.reshape(xw, (seq, batch, nd * gh)))


def _dense(ctx: LowerContext, x: Any, m: int, w_nk: np.ndarray, bias: np.ndarray | None) -> Any:
    """x [M, K] @ W [N, K]ᵀ (+ bias) by :mod:`backends.tvm.kernels.dense`."""
    from backends.tvm.kernels.dense import DenseSpec, dense_kernel, pack_dense_bias, pack_dense_weight

    spec = DenseSpec(m=m, k=w_nk.shape[1], n=w_nk.shape[0], has_bias=bias is not None, block=ctx.target.lanes)
    args = [x, ctx.const(pack_dense_weight(w_nk, spec))]
    if bias is not None:
        args.append(ctx.const(pack_dense_bias(bias, spec)))
    return ctx.call_kernel(dense_kernel(spec, ctx.target), args)


@lowers("RNN", "GRU", "LSTM", check=_recurrent_reason)
def _recurrent(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    op = _op()
    a = node.attrs
    dt = ctx.in_type(node, 0).dtype.numpy.name
    shape = ctx.in_type(node, 0).static_shape
    seq, batch = (shape[1], shape[0]) if a.layout else (shape[0], shape[1])
    hid = a.hidden_size
    x = ctx.emit(op.permute_dims(ins[0], [1, 0, 2])) if a.layout else ins[0]
    xw = _projection(ctx, node, x, seq, batch, dt)
    acts = resolve_activations(node.op, a)
    nd, gh = len(acts), _GATES[node.op] * hid
    r = ctx.require_const(node, 2, "R").astype(dt)
    b = ctx.input_const(node, 3)
    p = ctx.input_const(node, 7) if node.op == "LSTM" else None
    lens_c = ctx.input_const(node, 4)
    has_lens = len(ins) > 4 and ins[4] is not None and not (lens_c is not None and np.all(lens_c == seq))
    lbr = node.op == "GRU" and bool(a.linear_before_reset)
    ys, hs, cs = [], [], []
    for d in range(nd):
        reverse = a.direction == "reverse" or d == 1
        spec = CellSpec(
            op=node.op,
            seq=seq,
            batch=batch,
            hidden=hid,
            xw_cols=nd * gh,
            offset=d * gh,
            acts=tuple((_ACT_NAMES[fn], float(al), float(be)) for fn, al, be in acts[d]),
            clip=None if a.clip is None else float(a.clip),
            dtype=dt,
            lens_reverse=reverse and has_lens,
            has_lens=has_lens,
            peepholes=p is not None,
            input_forget=node.op == "LSTM" and bool(a.input_forget),
            linear_before_reset=lbr,
            fast_math=ctx.target.is_cpu and dt == "float32",
        )
        state_shape = (1, batch, hid)
        h = _initial_state(ctx, node, ins, 5, d, state_shape)
        c = _initial_state(ctx, node, ins, 6, d, state_shape) if node.op == "LSTM" else None
        extra: list[Any] = [ctx.const(np.ascontiguousarray(r[d].T))]
        if p is not None:
            extra.append(ctx.const(np.ascontiguousarray(p[d].astype(dt))))
        if lbr:
            rbh = np.zeros(hid, dt) if b is None else b[d, gh + 2 * hid :].astype(dt)
            extra.append(ctx.const(np.ascontiguousarray(rbh)))
        lens = ctx.emit(op.astype(ins[4], "int32")) if has_lens else None
        if lens is not None:
            extra.append(lens)
        states = [h] if c is None else [h, c]
        if ctx.target.is_cpu:
            y, *outs = _call_sequence(ctx, spec, reverse, [xw, *states, *extra])
            h = outs[0]
            c = outs[1] if c is not None else None
            ys.append(_gather_y(ctx, y, reverse, lens))
        else:
            steps = []
            for s in range(seq):
                t = seq - 1 - s if reverse and not has_lens else s
                outs = _call_step(ctx, spec, [xw, ctx.const(np.array([t], np.int32)), *states, *extra])
                states = outs[: spec.num_states]
                steps.append(outs[-1] if spec.has_lens else outs[0])
            h = states[0]
            c = states[1] if c is not None else None
            ys.append(_direction_y(ctx, steps, reverse, lens))
        hs.append(_final_state(ctx, h, lens, spec))
        if c is not None:
            cs.append(_final_state(ctx, c, lens, spec))
    return _outputs(ctx, node, ys, hs, cs, (seq, batch, hid))


def _direction_y(ctx: LowerContext, steps: list[Any], reverse: bool, lens: Any | None) -> Any:
    """One direction's Y [seq, B, H] from the per-step outputs [1, B, H] (``lens``: sequence_lens)."""
    from tvm import relax

    op = _op()
    if reverse and lens is None:
        steps = steps[::-1]
    y = steps[0] if len(steps) == 1 else ctx.emit(op.concat(relax.Tuple(steps), 0))
    return _gather_y(ctx, y, reverse, lens)


def _gather_y(ctx: LowerContext, y: Any, reverse: bool, lens: Any | None) -> Any:
    """Y in time order from the per-step outputs ``y`` [seq, B, H] (a reverse direction with
    ``sequence_lens`` produced them by step, not by time)."""
    if reverse and lens is not None:
        return ctx.bb.emit_te(_gather_reverse_te, y, lens, primfunc_name_hint="rnn_reverse_y")
    return y


def _final_state(ctx: LowerContext, s: Any, lens: Any | None, spec: CellSpec) -> Any:
    """The last state, 0 on rows whose sequence length is 0."""
    if lens is None:
        return s
    op = _op()
    dead = ctx.emit(op.reshape(ctx.emit(op.equal(lens, ctx.scalar(0, "int32"))), (1, spec.batch, 1)))
    zero = ctx.scalar(0.0, spec.dtype)
    return ctx.emit(op.where(dead, zero, s))


def _outputs(
    ctx: LowerContext, node: Node, ys: list[Any], hs: list[Any], cs: list[Any], dims: tuple[int, int, int]
) -> list[Any]:
    """Y [seq, nd, B, H], Y_h and Y_c [nd, B, H] (layout 1: batch first), as many as the node has."""
    from tvm import relax

    op = _op()
    seq, batch, hid = dims

    def cat(parts: list[Any], axis: int) -> Any:
        return parts[0] if len(parts) == 1 else ctx.emit(op.concat(relax.Tuple(parts), axis))

    y = cat([ctx.emit(op.reshape(v, (seq, 1, batch, hid))) for v in ys], 1)
    states = [cat(hs, 0)] + ([cat(cs, 0)] if cs else [])
    if node.attrs.layout:
        y = ctx.emit(op.permute_dims(y, [2, 0, 1, 3]))
        states = [ctx.emit(op.permute_dims(s, [1, 0, 2])) for s in states]
    return [y, *states][: node.num_outputs]
