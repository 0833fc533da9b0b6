"""Lifters for MNN's TFLite-style quantized ops (``schemas/mnn/TFQuantizeOp.fbs``) into Kiln QDQ form.

MNN's converter writes these ops for quantized (uint8 asymmetric) TFLite models. Every
quantized tensor is a uint8 Kiln value with real = scale * (q - zero_point); an op becomes

    y_q = QuantizeLinear(f(DequantizeLinear(x_q, s_x, z_x), ...), s_y, z_y)

with the scales and zero points of its ``QuantizedParam`` tables and the op's
``FusedActivation`` (RELU -> Relu, RELU6 -> Clip(0, 6), RELU1 -> Clip(-1, 1), TANH -> Tanh,
SIGMOID -> Sigmoid) applied in float before the output QuantizeLinear.

* TfQuantizedConv2D / QuantizedDepthwiseConv2D: uint8 weights (HWIO, depthwise [kh, kw,
  ci * m]) become DequantizeLinear of a uint8 constant with the filter zero point (OIHW for
  ONNX's Conv), the int32 bias DequantizeLinear with scale s_bias (s_x * s_w when unset).
* QuantizedAvgPool / QuantizedMaxPool carry no scales: input and output share one, so the
  pool runs on the stored integers (DequantizeLinear with scale 1, zero point 0), clamped
  to ``[outputActivationMin, outputActivationMax]``.
* QuantizedSoftmax: softmax(beta * s_in * q) on the last axis (shift invariant, so the input
  zero point does not matter), output scale 1/256, zero point 0 (TFLite's fixed output).
* QuantizedReshape: a Reshape of the uint8 tensor. Dequantize: DequantizeLinear (TFLite) or
  lo + q * (hi - lo) / 255 with range inputs (TF). QuantizeV2: TF's quantization with a
  [lo, hi] range from two constant inputs, s = (hi - lo) / 255: MIN_COMBINED is
  round((x - lo) / s), MIN_FIRST round(x / s) - round(lo / s).

Rounding: QuantizeLinear rounds halves to even; TFLite rounds them away from zero, so
outputs that land exactly on .5 can differ by one step. Tensors are NHWC, as MNN's
converter writes them for TF/TFLite models; convs and pools are wrapped in Transposes to
NCHW and back (on the uint8 values, so DequantizeLinear -> Conv -> QuantizeLinear stays
one pattern); SAME padding becomes explicit pads. Concat axes and reshape dims apply to
the NHWC tensors unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from frontends.mnn.reader import MnnReadError, Reader, ints, lifter, op_name, param
from schemas.mnn.generated import MNN_generated as M

__all__: list[str] = []

_TO_NCHW = (0, 3, 1, 2)
_TO_NHWC = (0, 2, 3, 1)
_UNIT = (1.0, 0)


def _qparam(op: Any, tab: Any, what: str) -> tuple[float, int]:
    """(scale, zero point) of a QuantizedParam table; the table must be present with scale > 0."""
    if tab is None or not tab.Scale() > 0.0:
        raise MnnReadError(f"op {op_name(op)!r}: {what} quantisation parameter is missing or has scale <= 0")
    return float(tab.Scale()), int(tab.ZeroPoint())


def _emit(r: Reader, kind: str, inputs: list[Value | None], name: str, attrs: Any = None) -> Value:
    return r.g.value(r.g.add_node(kind, inputs, attrs, name=name))


def _const(r: Reader, arr: Any, name: str) -> Value:
    return r.g.add_constant(np.asarray(arr), name)


def _zero_point(op: Any, zp: int, dtype: Any) -> np.ndarray:
    info = np.iinfo(dtype)
    if not info.min <= zp <= info.max:
        raise MnnReadError(f"op {op_name(op)!r}: zero point {zp} does not fit {np.dtype(dtype).name}")
    return np.asarray(zp, dtype)


def _dq(r: Reader, op: Any, x: Value, q: tuple[float, int], tag: str) -> Value:
    """DequantizeLinear(x, scale, zero point) with the zero point in x's integer type."""
    dt = x.type.dtype
    if dt not in (DType.UINT8, DType.INT8):
        raise MnnReadError(f"op {op_name(op)!r}: quantized input must be uint8/int8, got {dt.short}")
    name = f"{op_name(op)}__{tag}"
    s = _const(r, np.float32(q[0]), f"{name}_scale")
    z = _const(r, _zero_point(op, q[1], dt.numpy), f"{name}_zero_point")
    return _emit(r, "DequantizeLinear", [x, s, z], name)


def _q(r: Reader, op: Any, y: Value, q: tuple[float, int], tag: str, out: int | None = None) -> Value:
    """QuantizeLinear to uint8; names the MNN output tensor when ``out`` is given."""
    name = f"{op_name(op)}__{tag}"
    s = _const(r, np.float32(q[0]), f"{name}_scale")
    z = _const(r, _zero_point(op, q[1], np.uint8), f"{name}_zero_point")
    if out is None:
        return _emit(r, "QuantizeLinear", [y, s, z], name)
    r.node("QuantizeLinear", [y, s, z], None, op, out)
    return r.value(out)


def _activation(r: Reader, op: Any, y: Value, act: int) -> Value:
    """The FusedActivation in float."""
    base = f"{op_name(op)}__act"
    A = M.FusedActivation
    if act == A.kTfLiteActNone:
        return y
    if act == A.kTfLiteActRelu:
        return _emit(r, "Relu", [y], base)
    if act in (A.kTfLiteActRelu6, A.kTfLiteActRelu1):
        lo, hi = (0.0, 6.0) if act == A.kTfLiteActRelu6 else (-1.0, 1.0)
        bounds = [_const(r, np.float32(v), f"{base}_{k}") for k, v in (("min", lo), ("max", hi))]
        return _emit(r, "Clip", [y, *bounds], base)
    if act == A.kTfLiteActTanh:
        return _emit(r, "Tanh", [y], base)
    if act == A.kTfLiteActSigmoid:
        return _emit(r, "Sigmoid", [y], base)
    raise MnnReadError(f"op {op_name(op)!r}: fused activation {act} is not supported")


def _transpose(r: Reader, op: Any, x: Value, perm: tuple[int, ...], tag: str) -> Value:
    return _emit(r, "Transpose", [x], f"{op_name(op)}__{tag}", {"perm": perm})


def _nhwc(op: Any, x: Value) -> tuple[int, int, int, int]:
    s = x.type.shape
    if s is None or len(s) != 4 or not all(isinstance(d, int) for d in s):
        raise MnnReadError(f"op {op_name(op)!r}: the input must be a 4-D NHWC tensor of known shape, got {s}")
    n, h, w, c = (int(d) for d in s)
    return n, h, w, c


def _pad_attrs(
    mode: int,
    pads: list[int],
    pad_yx: tuple[int, int],
    hw: tuple[int, int],
    k: tuple[int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int],
) -> dict[str, Any]:
    """Explicit ONNX pads [top, left, bottom, right]; SAME as TensorFlow (the odd pixel at the end)."""
    if mode == M.PadMode.SAME:
        begin, end = [], []
        for size, kk, st, d in zip(hw, k, strides, dilations, strict=True):
            total = max((-(-size // st) - 1) * st + (kk - 1) * d + 1 - size, 0)
            begin.append(total // 2)
            end.append(total - total // 2)
        return {"pads": (*begin, *end)}
    if mode == M.PadMode.VALID:
        return {"pads": (0, 0, 0, 0)}
    if len(pads) == 4:
        return {"pads": tuple(pads)}
    return {"pads": (pad_yx[0], pad_yx[1], pad_yx[0], pad_yx[1])}


# --------------------------------------------------------------------------- conv
@lifter("TfQuantizedConv2D", "QuantizedDepthwiseConv2D")
def _conv(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """y = Q(act(conv(DQ(x), DQ(W_u8, s_w, z_w)) + DQ(b_i32, s_b)), s_y, z_y), NHWC in and out."""
    p = param(op, M.TfQuantizedConv2D)
    c = p.Common()
    if c is None:
        raise MnnReadError(f"conv {op_name(op)!r} has no common parameters")
    x = r.value(ins[0])
    _, h, w_, ic = _nhwc(op, x)
    qx = _qparam(op, p.InputQuantizedParam(), "input")
    qw = _qparam(op, p.FilterQuantizedParam(), "filter")
    qy = _qparam(op, p.OutputQuantizedParam(), "output")
    kh, kw = c.KernelY(), c.KernelX()
    w = np.asarray(p.WeightAsNumpy(), np.uint8) if p.WeightLength() else np.zeros(0, np.uint8)
    depthwise = op.Type() == M.OpType.QuantizedDepthwiseConv2D
    if depthwise:
        oc = w.size // max(kh * kw, 1)
        mult = oc // ic if ic else 0
        if mult < 1 or oc != ic * mult or w.size != kh * kw * oc:
            raise MnnReadError(f"depthwise conv {op_name(op)!r}: {w.size} weights for {ic} input channels")
        wt = w.reshape(kh, kw, oc).transpose(2, 0, 1).reshape(oc, 1, kh, kw)
        group = ic
    else:
        oc = c.OutputCount() or (w.size // max(kh * kw * ic, 1))
        if w.size != kh * kw * ic * oc:
            raise MnnReadError(f"conv {op_name(op)!r}: {w.size} weights for [{kh}, {kw}, {ic}, {oc}]")
        wt = w.reshape(kh, kw, ic, oc).transpose(3, 2, 0, 1)
        group = 1
    base = op_name(op)
    wq = _const(r, np.ascontiguousarray(wt), f"{base}_weight")
    inputs: list[Value | None] = [
        _dq(r, op, _transpose(r, op, x, _TO_NCHW, "to_nchw"), qx, "dq_input"),
        _dq(r, op, wq, qw, "dq_weight"),
    ]
    if p.BiasLength() or p.Biasflag():
        b = np.asarray(p.BiasAsNumpy(), np.int32) if p.BiasLength() else np.zeros(0, np.int32)
        if b.size != oc:
            raise MnnReadError(f"conv {op_name(op)!r}: {b.size} biases for {oc} output channels")
        bq = p.BiasQuantizedParam()
        sb = float(bq.Scale()) if bq is not None and bq.Scale() > 0 else qx[0] * qw[0]
        bs = _const(r, np.float32(sb), f"{base}_bias_scale")
        inputs.append(_emit(r, "DequantizeLinear", [_const(r, b, f"{base}_bias"), bs], f"{base}__dq_bias"))
    attrs: dict[str, Any] = {
        "group": group,
        "kernel_shape": (kh, kw),
        "strides": (c.StrideY() or 1, c.StrideX() or 1),
        "dilations": (c.DilateY() or 1, c.DilateX() or 1),
    }
    pads = ints(c.PadsAsNumpy()) if c.PadsLength() else []
    attrs.update(
        _pad_attrs(
            c.PadMode(), pads, (c.PadY(), c.PadX()), (h, w_), (kh, kw), attrs["strides"], attrs["dilations"]
        )
    )
    y = _activation(r, op, _emit(r, "Conv", inputs, f"{base}__conv", attrs), p.ActivationType())
    yq = _q(r, op, y, qy, "quantize")
    r.node("Transpose", [yq], {"perm": _TO_NHWC}, op, outs[0])


# ----------------------------------------------------------------- elementwise
@lifter("QuantizedAdd")
def _add(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """y = Q(act(DQ(a) + DQ(b)), s_y, z_y)."""
    if len(ins) != 2:
        raise MnnReadError(f"QuantizedAdd {op_name(op)!r}: expected 2 inputs, got {len(ins)}")
    p = param(op, M.QuantizedAdd)
    a = _dq(r, op, r.value(ins[0]), _qparam(op, p.Input1QuantizedParam(), "input1"), "dq_a")
    b = _dq(r, op, r.value(ins[1]), _qparam(op, p.Input2QuantizedParam(), "input2"), "dq_b")
    y = _activation(r, op, _emit(r, "Add", [a, b], f"{op_name(op)}__add"), p.ActivationType())
    _q(r, op, y, _qparam(op, p.OutputQuantizedParam(), "output"), "quantize", outs[0])


@lifter("QuantizedConcat")
def _concat(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """y = Q(act(concat_i DQ(x_i, s_i, z_i)), s_y, z_y) on the axis as written (NHWC)."""
    p = param(op, M.QuantizedConcat)
    scales = [float(s) for s in p.InputScaleAsNumpy()] if p.InputScaleLength() else []
    zps = ints(p.InputZeroPointAsNumpy()) if p.InputZeroPointLength() else []
    if len(scales) != len(ins) or len(zps) != len(ins):
        raise MnnReadError(
            f"QuantizedConcat {op_name(op)!r}: {len(scales)} scales / {len(zps)} zero points "
            f"for {len(ins)} inputs"
        )
    xs: list[Value | None] = []
    for k, (i, s, z) in enumerate(zip(ins, scales, zps, strict=True)):
        if not s > 0.0:
            raise MnnReadError(f"QuantizedConcat {op_name(op)!r}: input {k} has scale {s}")
        xs.append(_dq(r, op, r.value(i), (s, z), f"dq_{k}"))
    y = _emit(r, "Concat", xs, f"{op_name(op)}__concat", {"axis": p.Axis()})
    y = _activation(r, op, y, p.ActivationType())
    _q(r, op, y, _qparam(op, p.OutputQuantizedParam(), "output"), "quantize", outs[0])


@lifter("QuantizedLogistic")
def _logistic(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """y = Q(sigmoid(DQ(x)), s_y, z_y) (TFLite fixes s_y = 1/256, z_y = 0)."""
    p = param(op, M.QuantizedLogistic)
    x = _dq(r, op, r.value(ins[0]), _qparam(op, p.InputQuantizedParam(), "input"), "dq_input")
    y = _emit(r, "Sigmoid", [x], f"{op_name(op)}__sigmoid")
    _q(r, op, y, _qparam(op, p.OutputQuantizedParam(), "output"), "quantize", outs[0])


@lifter("QuantizedSoftmax")
def _softmax(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """y = Q(softmax(beta * s_in * q, axis=-1), 1/256, 0)."""
    p = param(op, M.QuantizedSoftmax)
    s = float(p.InputScale())
    if not s > 0.0:
        raise MnnReadError(f"QuantizedSoftmax {op_name(op)!r}: inputScale {s} must be > 0")
    beta = float(p.Beta())
    if not beta > 0.0:
        raise MnnReadError(f"QuantizedSoftmax {op_name(op)!r}: beta {beta} must be > 0")
    xf = _dq(r, op, r.value(ins[0]), (s * beta, 0), "dq_input")
    y = _emit(r, "Softmax", [xf], f"{op_name(op)}__softmax", {"axis": -1})
    _q(r, op, y, (1.0 / 256.0, 0), "quantize", outs[0])


# ------------------------------------------------------------------------- pools
def _pool(r: Reader, op: Any, outs: list[int], x: Value, p: Any, kind: str) -> None:
    """Pool the stored integers (scale 1, zero point 0) and clamp to the activation range."""
    _, h, w, _ = _nhwc(op, x)
    k, st = (p.KernelY(), p.KernelX()), (p.StrideY() or 1, p.StrideX() or 1)
    attrs: dict[str, Any] = {"kernel_shape": k, "strides": st}
    pt = p.PadType()
    mode = {M.PoolPadType.SAME: M.PadMode.SAME, M.PoolPadType.VALID: M.PadMode.VALID}.get(pt, M.PadMode.CAFFE)
    attrs.update(_pad_attrs(mode, [], (p.PadY(), p.PadX()), (h, w), k, st, (1, 1)))
    if kind == "AveragePool":
        attrs["count_include_pad"] = 0
    xf = _dq(r, op, _transpose(r, op, x, _TO_NCHW, "to_nchw"), _UNIT, "dq_input")
    y = _emit(r, kind, [xf], f"{op_name(op)}__pool", attrs)
    lo, hi = p.OutputActivationMin(), p.OutputActivationMax()
    if (lo, hi) != (0, 0) and (lo, hi) != (0, 255):
        if not 0 <= lo <= hi <= 255:
            raise MnnReadError(f"op {op_name(op)!r}: activation range [{lo}, {hi}] is not within uint8")
        bounds = [_const(r, np.float32(v), f"{op_name(op)}__act_{k}") for k, v in (("min", lo), ("max", hi))]
        y = _emit(r, "Clip", [y, *bounds], f"{op_name(op)}__act")
    yq = _q(r, op, y, _UNIT, "quantize")
    r.node("Transpose", [yq], {"perm": _TO_NHWC}, op, outs[0])


@lifter("QuantizedAvgPool")
def _avg_pool(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """uint8 average pool (padding excluded from the count)."""
    _pool(r, op, outs, r.value(ins[0]), param(op, M.QuantizedAvgPool), "AveragePool")


@lifter("QuantizedMaxPool")
def _max_pool(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """uint8 max pool."""
    _pool(r, op, outs, r.value(ins[0]), param(op, M.QuantizedMaxPool), "MaxPool")


# ------------------------------------------------------------------ data movement
@lifter("QuantizedReshape")
def _reshape(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """Reshape of the uint8 tensor (dims from the param or a constant second input)."""
    if len(ins) >= 2:
        shape = np.asarray(r.const(ins[1]), np.int64).reshape(-1)
    else:
        p = param(op, M.QuantizedReshape)
        if not p.DimsLength():
            raise MnnReadError(f"QuantizedReshape {op_name(op)!r} has no dims")
        shape = np.asarray(ints(p.DimsAsNumpy()), np.int64)
    r.node("Reshape", [r.value(ins[0]), _const(r, shape, f"{op_name(op)}_shape")], None, op, outs[0])


def _range(r: Reader, op: Any, ins: list[int]) -> tuple[float, float]:
    if len(ins) < 3:
        raise MnnReadError(f"op {op_name(op)!r}: needs min and max range inputs")
    lo = float(np.asarray(r.const(ins[1]), np.float32).reshape(-1)[0])
    hi = float(np.asarray(r.const(ins[2]), np.float32).reshape(-1)[0])
    if not hi > lo:
        raise MnnReadError(f"op {op_name(op)!r}: empty range [{lo}, {hi}]")
    return lo, hi


def _extra_range_outputs(r: Reader, outs: list[int], lo: float, hi: float) -> None:
    for i, v in zip(outs[1:3], (lo, hi), strict=False):
        r.consts[i] = np.asarray(v, np.float32)


@lifter("QuantizeV2")
def _quantize_v2(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """float -> uint8 over [lo, hi], s = (hi - lo) / 255 (MIN_COMBINED / MIN_FIRST)."""
    p = param(op, M.QuantizeV2)
    if p.Type() not in (M.DataType.DT_UINT8, 0):
        raise MnnReadError(f"QuantizeV2 {op_name(op)!r}: only uint8 output is supported, got type {p.Type()}")
    lo, hi = _range(r, op, ins)
    s = (hi - lo) / 255.0
    x = r.value(ins[0])
    mode = p.Mode()
    if mode == M.QuantizeMode.MIN_COMBINED:
        x = _emit(r, "Sub", [x, _const(r, np.float32(lo), f"{op_name(op)}_min")], f"{op_name(op)}__shift")
        zp = 0
    elif mode == M.QuantizeMode.MIN_FIRST:
        zp = -int(np.round(lo / s))
    else:
        raise MnnReadError(f"QuantizeV2 {op_name(op)!r}: mode {mode} (SCALED) is not supported")
    _q(r, op, x, (s, zp), "quantize", outs[0])
    _extra_range_outputs(r, outs, lo, hi)


@lifter("Dequantize")
def _dequantize(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """uint8 -> float: s * (q - z) (TFLite), or lo + q * (hi - lo) / 255 with range inputs (TF)."""
    p = param(op, M.Dequantize)
    x = r.value(ins[0])
    qp = p.InputQuantizedParam()
    if qp is not None and qp.Scale() > 0.0:
        q = _qparam(op, qp, "input")
        s = _const(r, np.float32(q[0]), f"{op_name(op)}_scale")
        z = _const(r, _zero_point(op, q[1], x.type.dtype.numpy), f"{op_name(op)}_zero_point")
        r.node("DequantizeLinear", [x, s, z], None, op, outs[0])
        return
    if p.Mode() == M.QuantizeMode.SCALED:
        raise MnnReadError(f"Dequantize {op_name(op)!r}: mode SCALED is not supported")
    lo, hi = _range(r, op, ins)
    y = _dq(r, op, x, ((hi - lo) / 255.0, 0), "dq")
    r.node("Add", [y, _const(r, np.float32(lo), f"{op_name(op)}_min")], None, op, outs[0])
