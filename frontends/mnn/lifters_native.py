"""MNN's own kernels that Kiln's writer (and MNN's converter) write, lifted into Kiln IR.

* LayerNorm (OpType 603): normalizes the last ``len(axis)`` axes (only the count is read, as
  MNN's kernel does), y = (x - mean) / sqrt(var + epsilon) * gamma + beta with gamma/beta one
  float per normalized element (inline or external) -> LayerNormalization(axis = rank - n);
  ``group`` > 1 and RMSNorm are refused.
* LSTM / RNN (ONNX form: inputs [X, W, R, B, (initial_h, initial_c)], ``outputCount`` = hidden,
  B [dirs, G*hidden] the sum of ONNX's two bias halves) -> LSTM / RNN with B = [B, 0] and the
  direction from W's leading dimension (2: bidirectional). An LSTM whose weights live in its
  parameter (the Caffe form) is refused.
* ScatterNd(indices, updates, shape[, data]) with a BinaryOp parameter naming the reduction
  -> ScatterND(data or zeros(shape), int64 indices, updates).
* BatchMatMul (adjX / adjY transpose the last two axes) -> MatMul; Cast -> Cast;
  BroadcastTo -> Expand; Reduction -> Reduce*; Padding ([begin, end] per axis) -> Pad; ELU -> Elu.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import Value
from frontends.mnn.lifters import _const_in, _node, _shape
from frontends.mnn.reader import MnnReadError, Reader, ints, lifter, op_name, param
from schemas.mnn.generated import MNN_generated as M

__all__ = ["ONNX_DTYPES", "SCATTER_REDUCTIONS", "REDUCE_OPS"]

# MNN DataType -> ONNX TensorProto data type
ONNX_DTYPES = {
    M.DataType.DT_FLOAT: 1,
    M.DataType.DT_UINT8: 2,
    M.DataType.DT_INT8: 3,
    M.DataType.DT_INT32: 6,
    M.DataType.DT_INT64: 7,
    M.DataType.DT_BOOL: 9,
}
SCATTER_REDUCTIONS = {
    M.BinaryOpOperation.ADD: "add",
    M.BinaryOpOperation.MUL: "mul",
    M.BinaryOpOperation.MAXIMUM: "max",
    M.BinaryOpOperation.MINIMUM: "min",
}
REDUCE_OPS = {
    M.ReductionType.SUM: "ReduceSum",
    M.ReductionType.MEAN: "ReduceMean",
    M.ReductionType.MAXIMUM: "ReduceMax",
    M.ReductionType.MINIMUM: "ReduceMin",
    M.ReductionType.PROD: "ReduceProd",
}
_PAD_MODES = {
    M.PadValueMode.CONSTANT: "constant",
    M.PadValueMode.REFLECT: "reflect",
    M.PadValueMode.EDGE: "edge",
}
_GATES = {"LSTM": 4, "RNN": 1}


def _floats(p: Any, field: str) -> np.ndarray:
    return (
        np.asarray(getattr(p, field + "AsNumpy")(), np.float32)
        if getattr(p, field + "Length")()
        else np.zeros(0, np.float32)
    )


@lifter("LayerNorm")
def _layer_norm(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.LayerNorm)
    if p.Group() > 1 or p.UseRmsnorm():
        raise MnnReadError(f"LayerNorm {op_name(op)!r}: group norm / RMSNorm has no Kiln lifting")
    if len(ins) != 1:
        raise MnnReadError(f"LayerNorm {op_name(op)!r}: {len(ins)} inputs (the fused residual form)")
    shape = _shape(r, ins[0], "LayerNorm", op)
    n = p.AxisLength() or 1
    inner = shape[len(shape) - n :]
    gamma, beta = _floats(p, "Gamma"), _floats(p, "Beta")
    if p.ExternalLength() and not gamma.size:
        ext = p.ExternalAsNumpy()
        gamma, beta = r.external(op, ext, [np.float32, np.float32])
    count = int(np.prod(inner, dtype=np.int64))
    if not gamma.size:
        gamma, beta = np.ones(count, np.float32), np.zeros(count, np.float32)
    if gamma.size != count or beta.size != count:
        raise MnnReadError(f"LayerNorm {op_name(op)!r}: gamma/beta of {gamma.size} values for {inner}")
    scale = _const_in(r, op, gamma.reshape(inner), "gamma")
    bias = _const_in(r, op, beta.reshape(inner), "beta")
    attrs = {"axis": len(shape) - n, "epsilon": float(p.Epsilon())}
    _node(r, "LayerNormalization", [r.value(ins[0]), scale, bias], attrs, op, outs[0])


@lifter("LSTM", "RNN")
def _recurrent(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    kind = "LSTM" if op.Type() == M.OpType.LSTM else "RNN"
    p = param(op, M.LSTM)
    if p.WeightI() is not None or p.WeightH() is not None or len(ins) < 4:
        raise MnnReadError(f"{kind} {op_name(op)!r}: weights in the parameter (Caffe form) are not read")
    hidden = int(p.OutputCount())
    w = r.const(ins[1])
    dirs = int(w.shape[0])
    gh = _GATES[kind] * hidden
    b = np.asarray(r.const(ins[3]), np.float32).reshape(dirs, gh)
    bias = _const_in(r, op, np.concatenate([b, np.zeros_like(b)], axis=1), "bias")
    states = [r.value(i) for i in ins[4:]]
    inputs: list[Value | None] = [r.value(ins[0]), r.value(ins[1]), r.value(ins[2]), bias, None, *states]
    attrs = {"hidden_size": hidden, "direction": "bidirectional" if dirs == 2 else "forward"}
    n = r.g.add_node(
        kind, inputs, attrs, name=op_name(op), output_names=[r.tname(o) for o in outs], num_outputs=len(outs)
    )
    for port, o in enumerate(outs):
        r.set(o, r.g.value(n, port))


@lifter("ScatterNd")
def _scatter_nd(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    reduction = "none"
    if op.Main() is not None:
        kind = param(op, M.BinaryOp).OpType()
        if kind not in SCATTER_REDUCTIONS:
            raise MnnReadError(f"ScatterNd {op_name(op)!r}: reduction BinaryOp {kind}")
        reduction = SCATTER_REDUCTIONS[kind]
    shape = [int(d) for d in np.asarray(r.const(ins[2])).reshape(-1)]
    updates = r.value(ins[1])
    if len(ins) > 3:
        data = r.value(ins[3])
    else:
        data = _const_in(r, op, np.zeros(shape, updates.type.dtype.numpy), "data")
    idx = r.value(ins[0])
    c = r.g.const_value(idx)
    if c is not None:
        idx = _const_in(r, op, np.asarray(c, np.int64), "indices")
    elif idx.type.dtype.numpy != np.int64:
        cast = r.g.add_node("Cast", [idx], {"to": 7}, name=f"{op_name(op)}__indices")
        idx = r.g.value(cast)
    r.node("ScatterND", [data, idx, updates], {"reduction": reduction}, op, outs[0])


@lifter("BatchMatMul")
def _batch_matmul(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.BatchMatMulParam) if op.Main() is not None else None
    vs: list[Value | None] = []
    for k, i in enumerate(ins[:2]):
        v = r.value(i)
        if p is not None and (p.AdjX() if k == 0 else p.AdjY()):
            rank = len(_shape(r, i, "BatchMatMul", op))
            perm = (*range(rank - 2), rank - 1, rank - 2)
            v = r.g.value(r.g.add_node("Transpose", [v], {"perm": perm}, name=f"{op_name(op)}__t{k}"))
        vs.append(v)
    _node(r, "MatMul", vs, None, op, outs[0])


@lifter("Cast")
def _cast(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    dst = param(op, M.CastParam).DstT()
    if dst not in ONNX_DTYPES:
        raise MnnReadError(f"Cast {op_name(op)!r}: to MNN data type {dst}")
    _node(r, "Cast", [r.value(ins[0])], {"to": ONNX_DTYPES[dst]}, op, outs[0])


@lifter("BroadcastTo")
def _broadcast_to(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    shape = _const_in(r, op, np.asarray(r.const(ins[1]), np.int64).reshape(-1), "shape")
    _node(r, "Expand", [r.value(ins[0]), shape], None, op, outs[0])


@lifter("Reduction")
def _reduction(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.ReductionParam)
    kind = REDUCE_OPS.get(p.Operation())
    if kind is None or p.Coeff() not in (0.0, 1.0):
        raise MnnReadError(f"Reduction {op_name(op)!r}: operation {p.Operation()} (coeff {p.Coeff()})")
    dims = ints(p.DimAsNumpy()) if p.DimLength() else list(range(len(_shape(r, ins[0], "Reduction", op))))
    axes = _const_in(r, op, np.asarray(dims, np.int64), "axes")
    _node(r, kind, [r.value(ins[0]), axes], {"keepdims": int(p.KeepDims())}, op, outs[0])


@lifter("Padding")
def _padding(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    mode = param(op, M.PadParam).Mode() if op.Main() is not None else M.PadValueMode.CONSTANT
    if mode not in _PAD_MODES:
        raise MnnReadError(f"Padding {op_name(op)!r}: mode {mode}")
    pairs = np.asarray(r.const(ins[1]), np.int64).reshape(-1, 2)  # [begin, end] per axis
    pads = _const_in(r, op, np.concatenate([pairs[:, 0], pairs[:, 1]]), "pads")
    inputs: list[Value | None] = [r.value(ins[0]), pads]
    if len(ins) > 2:
        inputs.append(r.value(ins[2]))
    _node(r, "Pad", inputs, {"mode": _PAD_MODES[mode]}, op, outs[0])


@lifter("ELU")
def _elu(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    alpha = float(param(op, M.ELU).Alpha()) if op.Main() is not None else 1.0
    _node(r, "Elu", [r.value(ins[0])], {"alpha": alpha}, op, outs[0])
