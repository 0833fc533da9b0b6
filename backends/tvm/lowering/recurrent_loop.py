"""A whole recurrent direction as one CPU PrimFunc: the scheduled step kernel inside a serial loop.

With the step kernel ``(h', c'[, y]) = step(xw, t, h, c, Rᵀ, ...)`` of
:mod:`backends.tvm.lowering.recurrent_cell`, the sequence kernel computes

    h ← h0, c ← c0
    for s in 0 .. seq-1:  t = seq-1-s (reverse without sequence_lens) else s
                          (h', c'[, y]) = step(xw, t, h, c, ...)
                          Y[t] = h' (with sequence_lens: Y[s] = y), h ← h', c ← c'
    h_last ← h, c_last ← c

in one call: the step's scheduled body (vectorized gate GEMM, fused gates) is the loop body, the
state lives in buffers of the function, and the runtime dispatches once per direction instead of
once per step. Parameters: ``xw, h0[, c0], Rᵀ[, P | Rbh][, lens]``, then the outputs
``Y [seq, B, H], h_last [1, B, H][, c_last]``.
"""

from __future__ import annotations

from typing import Any

from backends.tvm.kernels.kernel import mark_scheduled
from backends.tvm.lowering.recurrent_cell import CellSpec

__all__ = ["sequence_func"]


def _copy(dst: Any, src: Any, dst_lead: Any, src_lead: Any, spec: CellSpec) -> Any:
    """``dst[dst_lead, b, j] = src[src_lead, b, j]`` over [B, H]."""
    from tvm import tirx

    b, j = tirx.Var("b", "int32"), tirx.Var("j", "int32")
    store = tirx.BufferStore(dst, tirx.BufferLoad(src, [src_lead, b, j]), [dst_lead, b, j])
    inner = tirx.For(j, 0, spec.hidden, tirx.ForKind.SERIAL, store)
    return tirx.For(b, 0, spec.batch, tirx.ForKind.SERIAL, inner)


def sequence_func(step: Any, spec: CellSpec, reverse: bool) -> Any:
    """The sequence PrimFunc around the scheduled ``step`` PrimFunc of ``spec`` (one direction;
    ``reverse``: the direction runs backwards; with sequence_lens the step itself maps s to t_b)."""
    from tvm import s_tir, tirx

    params = list(step.params)  # buffers are the parameters
    n_in = len(params) - spec.num_outputs
    ins, outs = params[:n_in], params[n_in:]
    xw, step_buf, states, consts = ins[0], ins[1], ins[2 : 2 + spec.num_states], ins[2 + spec.num_states :]
    news = outs[: spec.num_states]
    y_step = outs[-1] if spec.has_lens else news[0]
    zero = tirx.const(0, "int32")
    init = [tirx.decl_buffer(s.shape, s.dtype, f"{s.name}0") for s in states]
    y = tirx.decl_buffer((spec.seq, spec.batch, spec.hidden), spec.dtype, "y_seq")
    lasts = [tirx.decl_buffer(s.shape, s.dtype, f"{s.name}_last") for s in states]
    s = tirx.Var("s", "int32")
    t = tirx.const(spec.seq - 1, "int32") - s if reverse and not spec.has_lens else s
    root = step.body.block
    body = tirx.SeqStmt(
        [
            tirx.BufferStore(step_buf, t, [zero]),
            root.body,
            *[_copy(st, nw, zero, zero, spec) for st, nw in zip(states, news, strict=True)],
            _copy(y, y_step, s if spec.has_lens else t, zero, spec),
        ]
    )
    loop = tirx.For(s, 0, spec.seq, tirx.ForKind.SERIAL, body)
    seq = tirx.SeqStmt(
        [
            *[_copy(st, i0, zero, zero, spec) for st, i0 in zip(states, init, strict=True)],
            loop,
            *[_copy(la, st, zero, zero, spec) for la, st in zip(lasts, states, strict=True)],
        ]
    )
    local = [step_buf, *states, *outs]
    block = s_tir.SBlock([], [], [], "root", seq, alloc_buffers=[*root.alloc_buffers, *local])
    func = tirx.PrimFunc([xw, *init, *consts, y, *lasts], s_tir.SBlockRealize([], True, block))
    return mark_scheduled(func, "recurrent-sequence", "recurrent", "generic")
