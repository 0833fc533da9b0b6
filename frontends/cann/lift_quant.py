"""Lift Ascend's int8 ops back into Kiln's QDQ form (the inverse of ``lower_quant.py``).

* ``AscendQuant`` -> ``QuantizeLinear(x, s, z)`` with int8 output, s = ``_kiln_scale`` when
  present (Kiln's own files), else float32(1 / scale); z = offset.
* ``AscendAntiQuant`` -> ``DequantizeLinear(x, scale, -offset)``.
* ``Conv2D`` / ``FullyConnection`` with an int8 filter, followed by its only consumer
  ``AscendDequant`` -> ``Conv`` / ``Gemm`` of ``dq(x)``, ``dq(filter)`` and ``dq(bias)``:
  x's step comes from the AscendQuant that produced it and its zero point is ``offset_x``;
  the weight steps are ``_kiln_weight_scale`` when present, else deq_scale / s_x; the bias
  step is deq_scale (the float32 in the low 32 bits of each uint64; the high bits must be
  zero). ``relu_flag`` adds a Relu.
* A lone ``AscendDequant`` -> ``DequantizeLinear(x, deq_scale, 0)`` along the channel axis.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from frontends.cann.lift import Lifter, LiftError, lifter
from frontends.cann.lift_nn import conv_attrs, gemm_attrs
from schemas.cann.om_graph import OmOp, split_ref

__all__ = ["lift_weighted_int8", "quant_grid"]


def _f32(x: float) -> np.float32:
    return np.float32(x)


def _int8(lf: Lifter, op: OmOp, key: str, value: object) -> int:
    v = float(value)  # type: ignore[arg-type]
    if not np.isfinite(v) or v != int(v) or not -128 <= v <= 127:
        raise LiftError(f"{key} {value} is not an int8 value")
    return int(v)


def _step(s: float, what: str) -> np.float32:
    f = _f32(s)
    if not np.isfinite(f) or f <= 0:
        raise LiftError(f"{what} {s} is not a positive finite scale")
    return f


def quant_grid(lf: Lifter, op: OmOp) -> tuple[np.float32, int]:
    """(step, int8 zero point) of an AscendQuant op."""
    if lf.attr(op, "sqrt_mode", "b", False):
        raise LiftError("sqrt_mode=true is not supported")
    if lf.attr(op, "round_mode", "s", "Round") != "Round":
        raise LiftError(f"round_mode {op.attrs['round_mode'].value!r} (Kiln reads 'Round')")
    if lf.attr(op, "dst_type", "i", 2) != 2:
        raise LiftError("only dst_type 2 (int8) is supported")
    exact = op.attrs.get("_kiln_scale")
    if exact is not None and exact.kind == "f":
        step = _step(float(exact.value), "_kiln_scale")  # type: ignore[arg-type]
    else:
        inv = _step(float(lf.attr(op, "scale", "f")), "scale")  # type: ignore[arg-type]
        step = _step(float(_f32(1.0) / inv), "1/scale")
    return step, _int8(lf, op, "offset", lf.attr(op, "offset", "f", 0.0))


def _consts(lf: Lifter, base: str, scale: np.ndarray, zero: np.ndarray) -> tuple[Value, Value]:
    return lf.g.add_constant(scale, f"{base}_scale"), lf.g.add_constant(zero, f"{base}_zp")


@lifter("AscendQuant")
def _quant(lf: Lifter, op: OmOp) -> Value:
    step, zero = quant_grid(lf, op)
    s, z = _consts(lf, op.name, np.array(step, np.float32), np.array(zero, np.int8))
    return lf.node("QuantizeLinear", [lf.inputs(op)[0], s, z], None, op.name)


@lifter("AscendAntiQuant")
def _antiquant(lf: Lifter, op: OmOp) -> Value:
    if lf.attr(op, "sqrt_mode", "b", False) or lf.attr(op, "dtype", "i", 0) != 0:
        raise LiftError("only sqrt_mode=false with a float32 output is supported")
    scale = _step(float(lf.attr(op, "scale", "f")), "scale")  # type: ignore[arg-type]
    zero = _int8(lf, op, "-offset", -float(lf.attr(op, "offset", "f")))  # type: ignore[arg-type]
    s, z = _consts(lf, op.name, np.array(scale, np.float32), np.array(zero, np.int8))
    return lf.node("DequantizeLinear", [lf.inputs(op)[0], s, z], None, op.name)


def _deq_scale(lf: Lifter, dq: OmOp) -> np.ndarray:
    bits = lf.const(dq, 1, "deq_scale")
    if bits.dtype != np.uint64 or bits.ndim != 1 or bits.size == 0:
        raise LiftError("deq_scale must be a non-empty 1-D uint64 constant")
    if np.any(bits >> np.uint64(32)):
        raise LiftError("deq_scale uses its high 32 bits (requant N / weight offset): not supported")
    out = (bits & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    if not np.all(np.isfinite(out)) or np.any(out <= 0):
        raise LiftError("deq_scale holds non-positive or non-finite scales")
    return out


def _dequant_flags(lf: Lifter, dq: OmOp) -> bool:
    if lf.attr(dq, "sqrt_mode", "b", False) or lf.attr(dq, "dtype", "i", 0) != 0:
        raise LiftError("only sqrt_mode=false with a float32 output is supported")
    return bool(lf.attr(dq, "relu_flag", "b", False))


@lifter("AscendDequant")
def _dequant(lf: Lifter, op: OmOp) -> Value:
    relu = _dequant_flags(lf, op)
    x = lf.inputs(op)[0]
    if x is None or x.type.dtype is not DType.INT32 or (x.type.rank or 0) < 2:
        raise LiftError("AscendDequant reads an int32 tensor of rank >= 2")
    deq = _deq_scale(lf, op)
    per_channel = deq.size > 1
    attrs = {"axis": 1} if per_channel else None
    scale = deq if per_channel else deq.reshape(())
    s, z = _consts(lf, op.name, scale, np.zeros(scale.shape, np.int32))
    name = f"{op.name}/dq" if relu else op.name
    y = lf.node("DequantizeLinear", [x, s, z], attrs, name)
    return lf.node("Relu", [y], None, op.name) if relu else y


def lift_weighted_int8(lf: Lifter, op: OmOp) -> Value:
    """The QDQ Conv/Gemm of an int8 Conv2D/FullyConnection and its AscendDequant."""
    users = lf.users.get(f"{op.name}:0", [])
    if len(users) != 1 or users[0][0].type != "AscendDequant" or users[0][1] != 0:
        raise LiftError("an int8 Conv2D/FullyConnection must feed exactly one AscendDequant")
    dq = users[0][0]
    relu = _dequant_flags(lf, dq)
    deq = _deq_scale(lf, dq)
    src = lf.ops.get(split_ref(op.inputs[0])[0]) if op.inputs and op.inputs[0] else None
    if src is None or src.type != "AscendQuant":
        raise LiftError("its int8 input is not produced by an AscendQuant, so its scale is unknown")
    s_x, _ = quant_grid(lf, src)
    z_x = _int8(lf, op, "offset_x", lf.attr(op, "offset_x", "i", 0))
    if len(op.inputs) > 3 and op.inputs[3]:
        raise LiftError("offset_w (input 3) is not supported")
    ins = lf.inputs(op) + [None, None]
    x_q, w_q, b_q = ins[0], ins[1], ins[2]
    assert x_q is not None and w_q is not None
    if w_q.type.rank is None or w_q.type.rank < 2:
        raise LiftError(f"filter {w_q.type} has rank < 2")
    fc = op.type == "FullyConnection"
    gemm = gemm_attrs(lf, op) if fc else None
    out_axis = 1 if gemm is not None and gemm["transB"] == 0 else 0
    channels = w_q.type.static_shape[out_axis]
    if deq.size not in (1, channels):
        raise LiftError(f"deq_scale has {deq.size} values for {channels} output channels")
    exact = op.attrs.get("_kiln_weight_scale")
    if exact is not None and exact.kind == "lf":
        w_scale = np.array(exact.value, np.float32)
    else:
        w_scale = (deq / s_x).astype(np.float32)
    if w_scale.size not in (1, channels) or not np.all(np.isfinite(w_scale)) or np.any(w_scale <= 0):
        raise LiftError(f"weight scales ({w_scale.size}) do not fit {channels} output channels")
    per_channel = max(w_scale.size, deq.size) > 1
    if per_channel:
        w_scale = np.broadcast_to(w_scale, (channels,)).copy()
    base = op.name
    sx, zx = _consts(lf, f"{base}/x", np.array(s_x, np.float32), np.array(z_x, np.int8))
    x_dq = lf.node("DequantizeLinear", [x_q, sx, zx], None, f"{base}/x_dq")
    w_s = w_scale if per_channel else w_scale.reshape(-1)[:1].reshape(())
    sw, zw = _consts(lf, f"{base}/w", w_s, np.zeros(w_s.shape, np.int8))
    w_dq = lf.node(
        "DequantizeLinear", [w_q, sw, zw], {"axis": out_axis} if per_channel else None, f"{base}/w_dq"
    )
    b_dq: Value | None = None
    if b_q is not None:
        b_s = np.broadcast_to(deq, (channels,)).copy() if per_channel else deq.reshape(-1)[:1].reshape(())
        sb, zb = _consts(lf, f"{base}/b", b_s, np.zeros(b_s.shape, np.int32))
        b_dq = lf.node(
            "DequantizeLinear", [b_q, sb, zb], {"axis": 0} if per_channel else None, f"{base}/b_dq"
        )
    name = base if relu else dq.name
    operands = [x_dq, w_dq] + ([b_dq] if b_dq is not None else [])
    if fc:
        y = lf.node("Gemm", operands, gemm, name)
    else:
        y = lf.node("Conv", operands, conv_attrs(lf, op, w_q.type.static_shape), name)
    if relu:
        y = lf.node("Relu", [y], None, dq.name)
    lf.int32_outputs.add(op.name)
    lf.done.add(dq.name)
    lf.values[f"{dq.name}:0"] = y
    lf.check(dq, y)
    return y
