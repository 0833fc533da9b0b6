"""Lifters: one function per MNN op type, turning an MNN op into Kiln IR nodes.

Shape arithmetic that MNN's converter leaves in files (Shape/Rank -> BinaryOp -> SliceTf ->
Concat -> Reshape) is folded while reading: a node whose inputs are all constants becomes a
constant (Kiln's shapes are static after import), so shape consumers see constant inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Value
from compiler.ir.types import DType, TensorType
from compiler.ops.registry import get_op
from frontends.mnn.reader import DTYPES, MnnReadError, Reader, ints, lifter, op_name, param
from schemas.mnn.generated import MNN_generated as M
from schemas.mnn.idst import decode
from schemas.mnn.quantized_weights import QuantizedWeights, dequantize_weights

__all__: list[str] = []


def _node(
    r: Reader, op_type: str, inputs: list[Value | None], attrs: Any, op: Any, out: int, domain: str = ""
) -> None:
    """``r.node`` that folds to a constant when every input is a constant (numpy reference)."""
    r.node(op_type, inputs, attrs, op, out, domain)
    args = [None if v is None else r.g.const_value(v) for v in inputs]
    if not inputs or any(a is None for v, a in zip(inputs, args, strict=True) if v is not None):
        return
    v = r.values.pop(out)
    n = r.g.node(v.node)
    arr = get_op(n.op, n.domain).reference(args, n.attrs, 1)[0]
    r.consts[out] = np.asarray(arr, n.output_types[0].dtype.numpy)
    r.g.remove(n)
    for c in inputs:
        if c is not None and not r.g.users(c) and not r.g.is_output(c) and r.g.has_node(c.node):
            r.g.remove(r.g.node(c.node))
            r.values = {k: x for k, x in r.values.items() if x.node != c.node}


def _is_const(r: Reader, idx: int) -> bool:
    return idx in r.consts or (idx in r.values and r.g.const_value(r.values[idx]) is not None)


def _shape(r: Reader, idx: int, what: str, op: Any) -> tuple[int, ...]:
    shape = r.consts[idx].shape if idx in r.consts else r.value(idx).type.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise MnnReadError(f"{what} {op_name(op)!r}: the input shape must be static")
    return tuple(int(d) for d in shape)


def _const_in(r: Reader, op: Any, arr: np.ndarray, tag: str) -> Value:
    return r.g.add_constant(np.ascontiguousarray(arr), f"{op_name(op)}_{tag}")


@lifter("Input")
def _input(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.Input)
    dims = [1 if d < 0 else d for d in ints(p.DimsAsNumpy())] if p.DimsLength() else []
    name = r.tname(outs[0])
    if name in r.input_shapes:
        dims = [int(d) for d in r.input_shapes[name]]
    dt = DTYPES.get(p.Dtype(), np.float32)
    r.set(outs[0], r.g.add_input(name, TensorType(DType.from_numpy(np.dtype(dt)), tuple(dims))))


@lifter("Const")
def _const(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    b = param(op, M.Blob)
    dims = ints(b.DimsAsNumpy()) if b.DimsLength() else []
    dt = b.DataType()
    np_dt = DTYPES.get(dt)
    if np_dt is None:
        raise MnnReadError(f"Const {op_name(op)!r} has unsupported data type {dt}")
    if b.ExternalLength():
        (arr,) = r.external(op, b.ExternalAsNumpy(), [np_dt])
    else:
        field = {
            np.float32: "Float32s",
            np.int32: "Int32s",
            np.int64: "Int64s",
            np.int8: "Int8s",
            np.uint8: "Uint8s",
        }[np_dt]
        arr = (
            np.asarray(getattr(b, field + "AsNumpy")(), np_dt)
            if getattr(b, field + "Length")()
            else np.zeros(0, np_dt)
        )
    count = int(np.prod(dims)) if dims else 1
    if arr.size != count:
        raise MnnReadError(f"Const {op_name(op)!r}: {arr.size} values for dims {dims}")
    r.consts[outs[0]] = arr.reshape(dims)


@lifter("ConvertTensor")
def _convert(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """A layout change only; a listed graph output keeps its name on the op that computes it."""
    v = r.value(ins[0])
    n, name = r.g.node(v.node), r.tname(outs[0])
    listed = {(r.net.OutputName(k) or b"").decode() for k in range(r.net.OutputNameLength())}
    if name in listed and n.op not in (INPUT_OP, CONSTANT_OP) and not r.g.has_name(name):
        r.g.rename(v, name)
    r.set(outs[0], v)


def _conv_weights(r: Reader, op: Any, p: Any, oc: int) -> tuple[np.ndarray, np.ndarray]:
    q = p.QuanParameter()
    ext = p.ExternalAsNumpy() if p.ExternalLength() else None
    if q is None or q.Type() == 8:
        if ext is not None:
            w, b = r.external(op, ext, [np.float32, np.float32])
        else:
            w = np.asarray(p.WeightAsNumpy(), np.float32) if p.WeightLength() else np.zeros(0, np.float32)
            b = np.asarray(p.BiasAsNumpy(), np.float32) if p.BiasLength() else np.zeros(0, np.float32)
        return w, b
    fp16_alpha = q.ScaleStorage() == 1
    if ext is not None:
        buf, alpha, b = r.external(op, ext, [np.int8, np.float16 if fp16_alpha else np.float32, np.float32])
        alpha = alpha.astype(np.float32)
    else:
        buf = q.BufferAsNumpy() if q.BufferLength() else np.zeros(0, np.int8)
        if fp16_alpha:
            alpha = (
                np.asarray(q.AlphaFp16AsNumpy(), np.uint16).view(np.float16).astype(np.float32)
                if q.AlphaFp16Length()
                else np.zeros(0, np.float32)
            )
        else:
            alpha = np.asarray(q.AlphaAsNumpy(), np.float32) if q.AlphaLength() else np.zeros(0, np.float32)
        b = np.asarray(p.BiasAsNumpy(), np.float32) if p.BiasLength() else np.zeros(0, np.float32)
    t = q.Type()
    buf = np.asarray(buf, np.int8)
    if t == 3:
        return buf.view(np.uint8).view(np.float16).astype(np.float32), b
    if t == 1:
        qi = decode(buf, bool(q.ShapeInt32())).reshape(oc, -1)
    elif t == 4:
        qi = buf.astype(np.int32).reshape(oc, -1)
    else:
        raise MnnReadError(f"op {op_name(op)!r}: IDSTQuan type {t} is not supported")
    asym = q.ReadType() != 0
    bits = int(q.AMaxOrBits()) or 8
    groups = alpha.size // (2 if asym else 1)
    if groups == 0 or qi.size % groups or groups % oc:
        raise MnnReadError(f"op {op_name(op)!r}: {alpha.size} scales for {oc} output channels")
    if q.QuantScale() not in (0.0, 1.0):
        alpha = alpha * np.float32(q.QuantScale())
    qw = QuantizedWeights(qi.astype(np.int32), alpha.astype(np.float32), bits, asym, groups)
    return dequantize_weights(qw).reshape(-1), b


@lifter("Convolution", "ConvolutionDepthwise")
def _conv(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.Convolution2D)
    c = p.Common()
    if c is None:
        raise MnnReadError(f"conv {op_name(op)!r} has no common parameters")
    x = r.value(ins[0])
    shape = x.type.shape
    ic = int(shape[1]) if shape is not None and len(shape) == 4 else c.InputCount()
    oc = c.OutputCount()
    group = c.Group() or 1
    if op.Type() == M.OpType.ConvolutionDepthwise:
        group = ic
    kh, kw = c.KernelY(), c.KernelX()
    w, b = _conv_weights(r, op, p, oc)
    if w.size != oc * (ic // group) * kh * kw:
        raise MnnReadError(f"conv {op_name(op)!r}: {w.size} weights for [{oc}, {ic // group}, {kh}, {kw}]")
    if b.size == 0:
        b = np.zeros(oc, np.float32)
    if b.size != oc:
        raise MnnReadError(f"conv {op_name(op)!r}: {b.size} biases for {oc} output channels")
    attrs: dict[str, Any] = {
        "group": group,
        "kernel_shape": (kh, kw),
        "strides": (c.StrideY(), c.StrideX()),
        "dilations": (c.DilateY(), c.DilateX()),
    }
    mode = c.PadMode()
    if mode == M.PadMode.SAME:
        attrs["auto_pad"] = "SAME_UPPER"
    elif mode == M.PadMode.VALID:
        attrs["pads"] = (0, 0, 0, 0)
    elif c.PadsLength() == 4:
        t, left, bottom, right = ints(c.PadsAsNumpy())
        attrs["pads"] = (t, left, bottom, right)
    else:
        attrs["pads"] = (c.PadY(), c.PadX(), c.PadY(), c.PadX())
    attrs["activation"] = "relu6" if c.Relu6() else ("relu" if c.Relu() else "none")
    wv = r.g.add_constant(w.reshape(oc, ic // group, kh, kw), f"{op_name(op)}_weight")
    bv = r.g.add_constant(b, f"{op_name(op)}_bias")
    r.node("FusedConv", [x, wv, bv], attrs, op, outs[0], domain="kiln")


@lifter("ReLU")
def _relu(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    tab = op.Main()
    slope = param(op, M.Relu).Slope() if tab is not None else 0.0
    if slope:
        r.node("LeakyRelu", [r.value(ins[0])], {"alpha": float(slope)}, op, outs[0])
    else:
        r.node("Relu", [r.value(ins[0])], None, op, outs[0])


@lifter("ReLU6")
def _relu6(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    lo, hi = 0.0, 6.0
    if op.Main() is not None:
        p = param(op, M.Relu6)
        lo, hi = float(p.MinValue()), float(p.MaxValue())
    if (lo, hi) == (0.0, 6.0):
        r.node("Relu6", [r.value(ins[0])], None, op, outs[0], domain="kiln")
        return
    x = r.value(ins[0])
    bounds = [
        r.g.add_constant(np.array(v, np.float32), f"{op_name(op)}_{k}") for k, v in (("min", lo), ("max", hi))
    ]
    r.node("Clip", [x, *bounds], None, op, outs[0])


_ELTWISE = {
    M.EltwiseType.SUM: "Add",
    M.EltwiseType.PROD: "Mul",
    M.EltwiseType.MAXIMUM: "Max",
    M.EltwiseType.SUB: "Sub",
}


@lifter("Eltwise")
def _eltwise(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.Eltwise)
    kind = _ELTWISE.get(p.Type())
    if kind is None or len(ins) < 2:
        raise MnnReadError(f"Eltwise {op_name(op)!r}: unsupported type {p.Type()} or arity {len(ins)}")
    if p.CoeffLength() and any(float(c) != 1.0 for c in p.CoeffAsNumpy()):
        raise MnnReadError(f"Eltwise {op_name(op)!r}: coefficients are not supported")
    acc = r.value(ins[0])
    for k, i in enumerate(ins[1:], 1):
        if k == len(ins) - 1:
            r.node(kind, [acc, r.value(i)], None, op, outs[0])
        else:
            acc = r.g.value(r.g.add_node(kind, [acc, r.value(i)], name=f"{op_name(op)}_{k}"))


@lifter("Concat")
def _concat(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    axis = param(op, M.Axis).Axis() if op.Main() is not None else 0
    _node(r, "Concat", [r.value(i) for i in ins], {"axis": axis}, op, outs[0])


@lifter("Softmax")
def _softmax(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    axis = param(op, M.Axis).Axis() if op.Main() is not None else 1
    r.node("Softmax", [r.value(ins[0])], {"axis": axis}, op, outs[0])


@lifter("Permute")
def _permute(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.Permute)
    _node(r, "Transpose", [r.value(ins[0])], {"perm": tuple(ints(p.DimsAsNumpy()))}, op, outs[0])


@lifter("Reshape")
def _reshape(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    if len(ins) >= 2:
        shape = np.asarray(r.const(ins[1]), np.int64).reshape(-1)
    else:
        p = param(op, M.Reshape)
        shape = np.asarray(ints(p.DimsAsNumpy()) if p.DimsLength() else [], np.int64)
    sv = r.g.add_constant(shape, f"{op_name(op)}_shape")
    _node(r, "Reshape", [r.value(ins[0]), sv], None, op, outs[0])


_BINARY = {
    M.BinaryOpOperation.ADD: "Add",
    M.BinaryOpOperation.SUB: "Sub",
    M.BinaryOpOperation.MUL: "Mul",
    M.BinaryOpOperation.DIV: "Div",
    M.BinaryOpOperation.REALDIV: "Div",
    M.BinaryOpOperation.POW: "Pow",
    M.BinaryOpOperation.MAXIMUM: "Max",
    M.BinaryOpOperation.MINIMUM: "Min",
    M.BinaryOpOperation.GREATER: "Greater",
    M.BinaryOpOperation.LESS: "Less",
    M.BinaryOpOperation.EQUAL: "Equal",
    M.BinaryOpOperation.GREATER_EQUAL: "GreaterOrEqual",
    M.BinaryOpOperation.LESS_EQUAL: "LessOrEqual",
}
# on bool tensors (MNN's int32 0 / 1), as Kiln's writer spells logic (backends/mnn/lower/compare.py)
_LOGIC = {
    M.BinaryOpOperation.MUL: "And",
    M.BinaryOpOperation.LOGICALOR: "Or",
    M.BinaryOpOperation.LOGICALXOR: "Xor",
}
# MNN's float MOD is the C-style remainder (ONNX Mod fmod=1), FLOORMOD Python's (fmod=0)
_MOD = {M.BinaryOpOperation.MOD: 1, M.BinaryOpOperation.FLOORMOD: 0}
_BINARY_CONST = {  # folded when both inputs are constants (shape arithmetic)
    M.BinaryOpOperation.MOD: np.fmod,
    M.BinaryOpOperation.FLOORMOD: np.mod,
    M.BinaryOpOperation.FLOORDIV: np.floor_divide,
}


def _lift_logic(r: Reader, kind: int, op: Any, ins: list[int], out: int) -> bool:
    """And / Or / Xor of two bool tensors, and Not(a) = EQUAL(a, 0) of a bool one; False otherwise."""
    if kind == M.BinaryOpOperation.EQUAL and _is_const(r, ins[1]) and not _is_const(r, ins[0]):
        a = r.value(ins[0])
        if a.type.dtype != DType.BOOL or np.any(r.const(ins[1])):
            return False
        _node(r, "Not", [a], None, op, out)
        return True
    if kind not in _LOGIC:
        return False
    consts = [np.asarray(r.const(i)) if _is_const(r, i) else None for i in ins]
    if all(c is not None for c in consts):
        return False
    for i, c in zip(ins, consts, strict=True):  # a bool constant is stored as int32 0 / 1
        if (c is None and r.value(i).type.dtype != DType.BOOL) or (
            c is not None and not np.isin(c, (0, 1)).all()
        ):
            return False
    vals: list[Value | None] = [
        r.value(i) if c is None else r.g.add_constant(c.astype(np.bool_), f"{op_name(op)}_bool{i}")
        for i, c in zip(ins, consts, strict=True)
    ]
    _node(r, _LOGIC[kind], vals, None, op, out)
    return True


@lifter("BinaryOp")
def _binary(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.BinaryOp)
    kind = _BINARY.get(p.OpType())
    fn = _BINARY_CONST.get(p.OpType())
    if fn is not None and len(ins) == 2 and all(_is_const(r, i) for i in ins):
        a0, b0 = (r.const(i) for i in ins)
        r.consts[outs[0]] = np.asarray(fn(a0, b0), np.result_type(a0, b0))
        return
    if p.OpType() in _MOD and len(ins) == 2 and p.ActivationType() == 0:
        a, b = r.value(ins[0]), r.value(ins[1])
        # observed in MNN 3.6.1: MOD of int32 tensors takes the sign of the divisor (fmod=0)
        fmod = 0 if a.type.dtype.is_integer else _MOD[p.OpType()]
        _node(r, "Mod", [a, b], {"fmod": fmod}, op, outs[0])
        return
    if len(ins) == 2 and p.ActivationType() == 0 and _lift_logic(r, p.OpType(), op, ins, outs[0]):
        return
    if kind is None or len(ins) != 2:
        raise MnnReadError(
            f"BinaryOp {op_name(op)!r}: unsupported operation {p.OpType()} or arity {len(ins)}"
        )
    a, b = r.value(ins[0]), r.value(ins[1])
    if p.ActivationType() == 1:
        y = r.g.value(r.g.add_node(kind, [a, b], name=f"{op_name(op)}__pre_relu"))
        r.node("Relu", [y], None, op, outs[0])
    elif p.ActivationType() == 0:
        _node(r, kind, [a, b], None, op, outs[0])
    else:
        raise MnnReadError(f"BinaryOp {op_name(op)!r}: unsupported activationType {p.ActivationType()}")


_UNARY = {
    M.UnaryOpOperation.ABS: "Abs",
    M.UnaryOpOperation.NEG: "Neg",
    M.UnaryOpOperation.FLOOR: "Floor",
    M.UnaryOpOperation.CEIL: "Ceil",
    M.UnaryOpOperation.SQRT: "Sqrt",
    M.UnaryOpOperation.EXP: "Exp",
    M.UnaryOpOperation.LOG: "Log",
    M.UnaryOpOperation.RECIPROCAL: "Reciprocal",
    M.UnaryOpOperation.ERF: "Erf",
    M.UnaryOpOperation.SIGMOID: "Sigmoid",
    M.UnaryOpOperation.TANH: "Tanh",
    M.UnaryOpOperation.HARDSWISH: "HardSwish",
}


# fused forms: SILU = x * sigmoid(x); GELU_STANDARD = Gelu (erf); GELU = Gelu (tanh form)
_GELU = {M.UnaryOpOperation.GELU_STANDARD: "none", M.UnaryOpOperation.GELU: "tanh"}


@lifter("UnaryOp")
def _unary(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.UnaryOp)
    x = r.value(ins[0])
    if p.OpType() == M.UnaryOpOperation.SILU:
        s = r.g.value(r.g.add_node("Sigmoid", [x], name=f"{op_name(op)}__sigmoid"))
        _node(r, "Mul", [x, s], None, op, outs[0])
        return
    if p.OpType() in _GELU:
        _node(r, "Gelu", [x], {"approximate": _GELU[p.OpType()]}, op, outs[0])
        return
    kind = _UNARY.get(p.OpType())
    if kind is None:
        raise MnnReadError(f"UnaryOp {op_name(op)!r}: unsupported operation {p.OpType()}")
    _node(r, kind, [x], None, op, outs[0])


@lifter("Sigmoid")
def _sigmoid(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    r.node("Sigmoid", [r.value(ins[0])], None, op, outs[0])


@lifter("Pooling")
def _pool(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.Pool)
    x = r.value(ins[0])
    kind = {M.PoolType.MAXPOOL: "Max", M.PoolType.AVEPOOL: "Average"}.get(p.Type())
    if kind is None:
        raise MnnReadError(f"Pooling {op_name(op)!r}: unsupported pool type {p.Type()}")
    if p.IsGlobal():
        r.node(f"Global{kind}Pool", [x], None, op, outs[0])
        return
    attrs: dict[str, Any] = {
        "kernel_shape": (p.KernelY(), p.KernelX()),
        "strides": (p.StrideY(), p.StrideX()),
        "ceil_mode": int(bool(p.CeilModel())),
    }
    if p.PadType() == M.PoolPadType.SAME:
        attrs["auto_pad"] = "SAME_UPPER"
    elif p.PadType() == M.PoolPadType.VALID:
        attrs["pads"] = (0, 0, 0, 0)
    elif p.PadsLength() == 4:
        attrs["pads"] = tuple(ints(p.PadsAsNumpy()))
    else:
        attrs["pads"] = (p.PadY(), p.PadX(), p.PadY(), p.PadX())
    if kind == "Average":
        attrs["count_include_pad"] = int(p.CountType() == M.AvgPoolCountType.INCLUDE_PADDING)
    r.node(f"{kind}Pool", [x], attrs, op, outs[0])


_CTM = {
    M.CoordinateTransformationMode.AlignCorners: "align_corners",
    M.CoordinateTransformationMode.HalfPixels: "half_pixel",
    M.CoordinateTransformationMode.PytorchHalfPixels: "pytorch_half_pixel",
    M.CoordinateTransformationMode.Asymmetric: "asymmetric",
    M.CoordinateTransformationMode.TensorflowHalfPixels: "tf_half_pixel_for_nn",
}


@lifter("Interp")
def _interp(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.Interp)
    x = r.value(ins[0])
    rt = p.ResizeType()
    attrs: dict[str, Any] = {}
    if rt in (1, 4):
        attrs = {"mode": "nearest", "nearest_mode": "floor" if rt == 1 else "round_prefer_floor"}
    elif rt == 2:
        attrs = {"mode": "linear"}
    elif rt == 3:
        attrs = {"mode": "cubic", "cubic_coeff_a": float(p.CubicCoeffA())}
    else:
        raise MnnReadError(f"Interp {op_name(op)!r}: unsupported resizeType {rt}")
    ctm = _CTM.get(p.Ctm())
    if ctm is None:
        ctm = (
            "align_corners" if p.AlignCorners() else ("half_pixel" if p.HalfPixelCenters() else "asymmetric")
        )
    attrs["coordinate_transformation_mode"] = ctm
    shape = x.type.shape
    if shape is None or len(shape) != 4:
        raise MnnReadError(f"Interp {op_name(op)!r}: the input must be 4-D")
    if len(ins) >= 2:
        scales = np.asarray(r.const(ins[1]), np.float32).reshape(-1)
        if scales.size != 4:
            raise MnnReadError(f"Interp {op_name(op)!r}: expected 4 scales")
        sv = r.g.add_constant(scales, f"{op_name(op)}_scales")
        r.node("Resize", [x, None, sv], attrs, op, outs[0])
        return
    if p.OutputHeight() > 0 and p.OutputWidth() > 0:
        sizes = np.asarray([shape[0], shape[1], p.OutputHeight(), p.OutputWidth()], np.int64)
        zv = r.g.add_constant(sizes, f"{op_name(op)}_sizes")
        r.node("Resize", [x, None, None, zv], attrs, op, outs[0])
        return
    if p.HeightScale() <= 0 or p.WidthScale() <= 0:
        raise MnnReadError(f"Interp {op_name(op)!r}: no output size and no scale")
    scales = np.asarray([1.0, 1.0, 1.0 / p.HeightScale(), 1.0 / p.WidthScale()], np.float32)
    sv = r.g.add_constant(scales, f"{op_name(op)}_scales")
    r.node("Resize", [x, None, sv], attrs, op, outs[0])


@lifter("StridedSlice")
def _strided_slice(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = param(op, M.StridedSliceParam)
    if p.FromType() == 1:  # ONNX form: x, starts, ends[, axes[, steps]]
        args = [np.asarray(r.const(i), np.int64).reshape(-1) for i in ins[1:]]
        cv = [_const_in(r, op, a, k) for a, k in zip(args, ("starts", "ends", "axes", "steps"), strict=False)]
        _node(r, "Slice", [r.value(ins[0]), *cv], None, op, outs[0])
        return
    if len(ins) != 4:
        raise MnnReadError(f"StridedSlice {op_name(op)!r}: expected 4 inputs, got {len(ins)}")
    if p.EllipsisMask() or p.NewAxisMask() or p.ShrinkAxisMask():
        raise MnnReadError(f"StridedSlice {op_name(op)!r}: ellipsis/new-axis/shrink masks are not supported")
    x = r.value(ins[0])
    begin, end, stride = (ints(r.const(i)) for i in ins[1:])
    big = np.iinfo(np.int64).max
    starts, ends = [], []
    for ax, (b, e, s) in enumerate(zip(begin, end, stride, strict=True)):
        if p.BeginMask() >> ax & 1:
            b = 0 if s > 0 else big
        if p.EndMask() >> ax & 1:
            e = big if s > 0 else -big
        starts.append(b)
        ends.append(e)
    consts = [
        r.g.add_constant(np.asarray(v, np.int64), f"{op_name(op)}_{k}")
        for k, v in (("starts", starts), ("ends", ends), ("axes", list(range(len(begin)))), ("steps", stride))
    ]
    _node(r, "Slice", [x, *consts], None, op, outs[0])
