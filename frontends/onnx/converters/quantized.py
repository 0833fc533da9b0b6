"""Converters of pre-quantized ONNX (QOperator form and integer ops) into Kiln's QDQ form.

With dq(q; s, z) = (q - z) s and q(y; s, z) = saturate(round_half_even(y / s) + z):

* QLinearConv(x, s_x, z_x, W, s_w, z_w, s_y, z_y, B) = q(conv(dq(x), dq(W; s_w, z_w, axis 0),
  dq(B; s_x s_w, axis 0)); s_y, z_y), and QLinearMatMul / com.microsoft QGemm likewise
  (per-column weight scales on B's output axis; QGemm's alpha scales the bias too:
  alpha ((A - z_a)(B - z_b) + C) s_a s_b, so Gemm gets beta = alpha; no y_scale: float out);
* com.microsoft QLinearAdd/Mul/Concat/Sigmoid/LeakyRelu/GlobalAveragePool/AveragePool/Softmax:
  q(op(dq(inputs)); s_y, z_y) (``channels_last`` pools run on NHWC through transposes; Softmax's
  ``opset`` below 13 is the 2-D-coerced softmax of those opsets);
* MatMulInteger(a, b, z_a, z_b) = (a - z_a) @ (b - z_b) in int32, expressed as
  cast_int32(dq(a; 1, z_a) @ dq(b; 1, z_b)): exact in float32 while every partial sum is an
  integer below 2^24, i.e. max|a - z_a| * max_n sum_k |b_kn - z_b| <= 2^24 (with a constant b;
  else K max|a - z_a| max|b - z_b|). When that bound fails, int32 arithmetic instead:
  (cast_int32(a) - z_a) @ (cast_int32(b) - z_b). ConvInteger is the same with conv, and is
  refused past the bound (onnxruntime has no int32 Conv);
* DynamicQuantizeLinear(x), as onnxruntime computes it: lo = min(0, min x), hi = max(0, max x),
  s = (hi - lo) / 255 (1 when hi = lo), z = cast_uint8(round_half_even(clip(-lo / s, 0, 255))),
  y = q(x; s, z);
* com.microsoft DynamicQuantizeLSTM(X, W_q, R_q, ...) = LSTM(dq(q(X; s_X, z_X)), W, R, ...) with
  W = transpose((W_q - z_W) s_W) (R likewise; s, z per direction or per gate column), computed at
  import from the constant weights, and (s_X, z_X) X's run-time parameters as above: onnxruntime
  quantizes X so before its input product. It also quantizes the hidden state at every step,
  which one LSTM op cannot express: there the float LSTM differs by h's rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from compiler.ops.shapes import normalize_axis
from frontends.onnx.converter import NodeContext, converter

__all__ = ["EXACT_F32_LIMIT"]

MS = "com.microsoft"
EXACT_F32_LIMIT = 2**24
"""Integers up to this magnitude are exact in float32."""

_QDQ = ("DequantizeLinear", "QuantizeLinear")


def _f32(v: float) -> np.ndarray:
    return np.array(v, np.float32)


def _dq(ctx: NodeContext, x: Value, s: Value | None, z: Value | None, axis: int | None = None) -> Value:
    """dq(x; s, z) (per axis when ``axis`` is given and s has more than one entry)."""
    if s is None:
        raise ctx.fail("a quantization scale is missing")
    shape = s.type.shape
    per_axis = axis is not None and shape is not None and len(shape) == 1 and shape != (1,)
    attrs = {"axis": axis} if per_axis else None
    return ctx.emit("DequantizeLinear", [x, s, z], attrs, final=False)[0]


def _q(ctx: NodeContext, y: Value, s: Value | None, z: Value | None) -> Value:
    """q(y; s, z), named as the ONNX node's output."""
    if s is None:
        raise ctx.fail("the output scale is missing")
    return ctx.emit("QuantizeLinear", [y, s, z], num_outputs=1)[0]


def _per_tensor(ctx: NodeContext, *ports: int) -> None:
    for i in ports:
        v = ctx.input(i)
        if v is not None and (v.type.shape is None or v.type.numel != 1):
            raise ctx.fail(f"input {i} must be a per-tensor scale or zero point, got shape {v.type.shape}")


def _bias(ctx: NodeContext, b: Value | None, s_a: Value, s_w: Value, axis: int) -> Value | None:
    """dq(b; s_a s_w) for an int32 bias on the accumulator's grid (None stays None)."""
    if b is None:
        return None
    scale = ctx.emit("Mul", [s_a, s_w], final=False)[0]
    return _dq(ctx, b, scale, None, axis)


@converter("QLinearConv", since=10, needs=(*_QDQ, "Conv", "Mul"))
def qlinear_conv(ctx: NodeContext) -> list[Value]:
    """q(conv(dq(x), dq(W; axis 0), dq(B; s_x s_w)); s_y, z_y)."""
    _per_tensor(ctx, 1, 2, 6, 7)
    x = _dq(ctx, ctx.require(0), ctx.input(1), ctx.input(2))
    w = _dq(ctx, ctx.require(3), ctx.input(4), ctx.input(5), 0)
    b = _bias(ctx, ctx.input(8), ctx.require(1), ctx.require(4), 0)
    y = ctx.emit("Conv", [x, w, b], ctx.rest(), final=False)[0]
    return [_q(ctx, y, ctx.input(6), ctx.input(7))]


def _col_axis(ctx: NodeContext, port: int, trans: bool = False) -> int:
    """The output-column axis of a matrix-product weight at ``port`` (B is [.., K, N] or [N, K])."""
    rank = len(ctx.type(port).shape or (0, 0))
    return rank - 2 if trans else rank - 1


@converter("QLinearMatMul", since=10, needs=(*_QDQ, "MatMul"))
def qlinear_matmul(ctx: NodeContext) -> list[Value]:
    """q(dq(a) @ dq(b; per column); s_y, z_y)."""
    _per_tensor(ctx, 1, 2, 6, 7)
    a = _dq(ctx, ctx.require(0), ctx.input(1), ctx.input(2))
    b = _dq(ctx, ctx.require(3), ctx.input(4), ctx.input(5), _col_axis(ctx, 3))
    y = ctx.emit("MatMul", [a, b], final=False)[0]
    return [_q(ctx, y, ctx.input(6), ctx.input(7))]


@converter("QGemm", since=1, domain=MS, needs=(*_QDQ, "Gemm", "Mul"))
def qgemm(ctx: NodeContext) -> list[Value]:
    """q(Gemm(dq(A), dq(B), dq(C; s_a s_b), alpha, beta=alpha)); float out without y_scale."""
    _per_tensor(ctx, 1, 2, 7, 8)
    alpha = float(ctx.pop("alpha", 1.0))
    trans_a, trans_b = int(ctx.pop("transA", 0)), int(ctx.pop("transB", 0))
    a = _dq(ctx, ctx.require(0), ctx.input(1), ctx.input(2))
    b = _dq(ctx, ctx.require(3), ctx.input(4), ctx.input(5), 0 if trans_b else 1)
    c_in = ctx.input(6)
    c = _bias(ctx, c_in, ctx.require(1), ctx.require(4), len(c_in.type.shape or (0,)) - 1) if c_in else None
    attrs = {"alpha": alpha, "beta": alpha if c is not None else 1.0, "transA": trans_a, "transB": trans_b}
    if ctx.input(7) is None:
        return ctx.emit("Gemm", [a, b, c], attrs, num_outputs=1)
    y = ctx.emit("Gemm", [a, b, c], attrs, final=False)[0]
    return [_q(ctx, y, ctx.input(7), ctx.input(8))]


def _binary(op: str) -> None:
    def conv(ctx: NodeContext) -> list[Value]:
        a = _dq(ctx, ctx.require(0), ctx.input(1), ctx.input(2))
        b = _dq(ctx, ctx.require(3), ctx.input(4), ctx.input(5))
        y = ctx.emit(op, [a, b], final=False)[0]
        return [_q(ctx, y, ctx.input(6), ctx.input(7))]

    converter(f"QLinear{op}", since=1, domain=MS, needs=(*_QDQ, op))(conv)


_binary("Add")
_binary("Mul")


def _unary(name: str, op: str, attrs: Sequence[tuple[str, float]] = ()) -> None:
    def conv(ctx: NodeContext) -> list[Value]:
        x = _dq(ctx, ctx.require(0), ctx.input(1), ctx.input(2))
        y = ctx.emit(op, [x], {k: float(ctx.pop(k, d)) for k, d in attrs}, final=False)[0]
        return [_q(ctx, y, ctx.input(3), ctx.input(4))]

    converter(name, since=1, domain=MS, needs=(*_QDQ, op))(conv)


_unary("QLinearSigmoid", "Sigmoid")
_unary("QLinearLeakyRelu", "LeakyRelu", [("alpha", 0.01)])


@converter("QLinearGlobalAveragePool", since=1, domain=MS, needs=(*_QDQ, "GlobalAveragePool", "ReduceMean"))
def qlinear_global_average_pool(ctx: NodeContext) -> list[Value]:
    """q(mean over the spatial axes of dq(x)); ``channels_last`` means NHWC."""
    x = _dq(ctx, ctx.require(0), ctx.input(1), ctx.input(2))
    if int(ctx.pop("channels_last", 0)):
        rank = len(ctx.type(0).shape or ())
        if rank < 3:
            raise ctx.fail(f"channels_last input must have rank >= 3, got {ctx.type(0).shape}")
        y = ctx.emit("ReduceMean", [x, ctx.ints(range(1, rank - 1), "axes")], final=False)[0]
    else:
        y = ctx.emit("GlobalAveragePool", [x], final=False)[0]
    return [_q(ctx, y, ctx.input(3), ctx.input(4))]


def _nhwc_to_nchw(ctx: NodeContext, x: Value, inverse: bool) -> Value:
    rank = len(x.type.shape or ())
    if rank < 3:
        raise ctx.fail(f"channels_last input must have rank >= 3, got {x.type.shape}")
    perm = (0, rank - 1, *range(1, rank - 1)) if not inverse else (0, *range(2, rank), 1)
    return ctx.emit("Transpose", [x], {"perm": perm}, final=False)[0]


@converter("QLinearAveragePool", since=1, domain=MS, needs=(*_QDQ, "AveragePool", "Transpose"))
def qlinear_average_pool(ctx: NodeContext) -> list[Value]:
    """q(AveragePool(dq(x))); ``channels_last`` means NHWC in and out."""
    _per_tensor(ctx, 1, 2, 3, 4)
    nhwc = bool(int(ctx.pop("channels_last", 0)))
    x = _dq(ctx, ctx.require(0), ctx.input(1), ctx.input(2))
    if nhwc:
        x = _nhwc_to_nchw(ctx, x, inverse=False)
    y = ctx.emit("AveragePool", [x], ctx.rest(), final=False)[0]
    if nhwc:
        y = _nhwc_to_nchw(ctx, y, inverse=True)
    return [_q(ctx, y, ctx.input(3), ctx.input(4))]


@converter("QLinearSoftmax", since=1, domain=MS, needs=(*_QDQ, "Softmax", "Flatten", "Reshape"))
def qlinear_softmax(ctx: NodeContext) -> list[Value]:
    """q(softmax(dq(x)) along ``axis``); ``opset`` < 13: softmax over the flattened [axis, rank)."""
    _per_tensor(ctx, 1, 2, 3, 4)
    opset = int(ctx.pop("opset", 13))
    x = _dq(ctx, ctx.require(0), ctx.input(1), ctx.input(2))
    shape = x.type.shape
    if shape is None:
        raise ctx.fail("the input rank must be known")
    try:
        axis = normalize_axis(int(ctx.pop("axis", -1 if opset >= 13 else 1)), max(len(shape), 1), ctx.where)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    if opset >= 13 or axis >= len(shape) - 1:
        y = ctx.emit("Softmax", [x], {"axis": axis}, final=False)[0]
    else:
        if not x.type.is_static:
            raise ctx.fail(
                f"opset {opset} softmax over axes [{axis}, rank) needs a static shape, got {shape}"
            )
        flat = ctx.emit("Flatten", [x], {"axis": axis}, final=False)[0]
        y = ctx.emit("Softmax", [flat], {"axis": -1}, final=False)[0]
        y = ctx.emit("Reshape", [y, ctx.ints(x.type.static_shape, "shape")], final=False)[0]
    return [_q(ctx, y, ctx.input(3), ctx.input(4))]


@converter("QLinearConcat", since=1, domain=MS, needs=(*_QDQ, "Concat"))
def qlinear_concat(ctx: NodeContext) -> list[Value]:
    """q(concat(dq(x_i; s_i, z_i)...); s_y, z_y); inputs are y_scale, y_zp, then triples."""
    rest = ctx.inputs[2:]
    if not rest or len(rest) % 3:
        raise ctx.fail(
            f"expects y_scale, y_zero_point and (x, scale, zero point) triples, got {len(ctx.inputs)}"
        )
    xs = []
    for i in range(0, len(rest), 3):
        x = rest[i]
        if x is None:
            raise ctx.fail(f"input {i + 2} is missing")
        xs.append(_dq(ctx, x, rest[i + 1], rest[i + 2]))
    y = ctx.emit("Concat", xs, {"axis": int(ctx.pop("axis"))}, final=False)[0]
    return [_q(ctx, y, ctx.input(0), ctx.input(1))]


# ------------------------------------------------------------------ integer ops
def _max_offset(ctx: NodeContext, x: Value, z: Value | None) -> int:
    """max |x - z| over x's integer range (z constant), 255 otherwise (8-bit x)."""
    if x.type.dtype not in (DType.UINT8, DType.INT8):
        raise ctx.fail(f"expects 8-bit integer inputs, got {x.type.dtype.short}")
    info = np.iinfo(x.type.dtype.numpy)
    zc = z.const if z is not None else np.zeros((), np.int64)
    if zc is None:
        return 255
    zc = zc.astype(np.int64)
    return int(max(np.max(zc - info.min), np.max(info.max - zc)))


def _weight_bound(w: Value, z: Value | None, out_axis: int) -> int | None:
    """max over output channels of sum |w - z| for a constant w (None when w is not constant)."""
    zconst = np.zeros((), np.int64) if z is None else z.const
    if w.const is None or zconst is None:
        return None
    wc = w.const.astype(np.int64)
    ax = out_axis % wc.ndim
    zc = zconst.astype(np.int64)
    if zc.size > 1:
        zc = zc.reshape((1,) * ax + (-1,) + (1,) * (wc.ndim - ax - 1))
    d = np.abs(wc - zc)
    return int(np.max(np.sum(d, axis=tuple(i for i in range(wc.ndim) if i != ax)))) if d.size else 0


def _ones_like_zp(ctx: NodeContext, z: Value | None, suffix: str) -> Value:
    n = 1 if z is None or z.type.shape is None else max(z.type.numel, 1)
    return ctx.constant(np.ones(n, np.float32) if n > 1 else _f32(1.0), suffix)


def _exact_bound(
    ctx: NodeContext, a: Value, za: Value | None, b: Value, zb: Value | None, axis: int, k: int | None
) -> tuple[int | None, str]:
    """The largest partial-sum magnitude of the integer product (None if unknown) and its derivation."""
    amax, bmax = _max_offset(ctx, a, za), _max_offset(ctx, b, zb)
    col = _weight_bound(b, zb, axis)
    if col is not None:
        return amax * col, f"max|a - z_a| = {amax} times the largest column sum of |b - z_b| = {col}"
    if k is None:
        return None, "the reduction length is not static"
    return k * amax * bmax, f"K = {k} times {amax} times {bmax}"


@converter("MatMulInteger", since=10, needs=("DequantizeLinear", "MatMul", "Cast", "Sub", "Unsqueeze"))
def matmul_integer(ctx: NodeContext) -> list[Value]:
    """(a - z_a) @ (b - z_b) in int32: float32 on dq(scale 1) while exact, else int32 arithmetic."""
    a, b = ctx.require(0), ctx.require(1)
    za, zb = ctx.input(2), ctx.input(3)
    a_shape = a.type.shape
    k = a_shape[-1] if a_shape and isinstance(a_shape[-1], int) else None
    bound, _ = _exact_bound(ctx, a, za, b, zb, -1, k)
    if za is not None and za.type.numel != 1 and (a_shape is None or len(a_shape) < 2):
        raise ctx.fail(f"a per-row a_zero_point needs A of rank >= 2, got {a_shape}")
    if bound is not None and bound <= EXACT_F32_LIMIT:
        af = _dq(ctx, a, _ones_like_zp(ctx, za, "a_one"), za, -2)
        bf = _dq(ctx, b, _ones_like_zp(ctx, zb, "b_one"), zb, -1)
        y = ctx.emit("MatMul", [af, bf], final=False)[0]
        return ctx.emit("Cast", [y], {"to": int(DType.INT32)}, num_outputs=1)
    ai = _int32_offset(ctx, a, za, row=True)
    bi = _int32_offset(ctx, b, zb, row=False)
    return ctx.emit("MatMul", [ai, bi], num_outputs=1)


def _int32_offset(ctx: NodeContext, x: Value, z: Value | None, *, row: bool) -> Value:
    xi = ctx.emit("Cast", [x], {"to": int(DType.INT32)}, final=False)[0]
    if z is None:
        return xi
    zi = ctx.emit("Cast", [z], {"to": int(DType.INT32)}, final=False)[0]
    if row and z.type.numel != 1:
        zi = ctx.emit("Unsqueeze", [zi, ctx.ints([-1], "row_axis")], final=False)[0]
    return ctx.emit("Sub", [xi, zi], final=False)[0]


@converter("ConvInteger", since=10, needs=("DequantizeLinear", "Conv", "Cast"))
def conv_integer(ctx: NodeContext) -> list[Value]:
    """conv(x - z_x, W - z_w) in int32, as cast_int32(conv(dq(x; 1, z_x), dq(W; 1, z_w))) while exact."""
    x, w = ctx.require(0), ctx.require(1)
    zx, zw = ctx.input(2), ctx.input(3)
    _per_tensor(ctx, 2)
    ws = w.type.shape
    dims = [d for d in (ws or ())[1:] if isinstance(d, int)]
    k = int(np.prod(dims)) if ws and len(dims) == len(ws) - 1 else None
    bound, why = _exact_bound(ctx, x, zx, w, zw, 0, k)
    if bound is None or bound > EXACT_F32_LIMIT:
        shown = "unknown" if bound is None else str(bound)
        raise ctx.fail(
            f"ConvInteger is expressed as a float32 Conv, exact only while its partial sums stay "
            f"<= 2^24; the bound here is {shown} ({why}), and no int32 Conv exists to fall back on"
        )
    xf = _dq(ctx, x, _ones_like_zp(ctx, zx, "x_one"), zx)
    wf = _dq(ctx, w, _ones_like_zp(ctx, zw, "w_one"), zw, 0)
    y = ctx.emit("Conv", [xf, wf], ctx.rest(), final=False)[0]
    return ctx.emit("Cast", [y], {"to": int(DType.INT32)}, num_outputs=1)


_DQL_NEEDS = (
    "ReduceMin",
    "ReduceMax",
    "Min",
    "Max",
    "Sub",
    "Div",
    "Equal",
    "Where",
    "Neg",
    "Clip",
    "Round",
    "Cast",
    "QuantizeLinear",
)


def _dynamic_qparams(ctx: NodeContext, x: Value) -> tuple[Value, Value]:
    """onnxruntime's run-time uint8 scale and zero point of x (see the module docstring)."""
    if x.type.dtype != DType.FLOAT32:
        raise ctx.fail(f"x must be float32, got {x.type.dtype.short}")

    def op(name: str, ins: Sequence[Value], attrs: dict[str, int] | None = None) -> Value:
        return ctx.emit(name, ins, attrs, final=False)[0]

    zero, one = ctx.constant(_f32(0), "zero"), ctx.constant(_f32(1), "one")
    lo = op("Min", [op("ReduceMin", [x], {"keepdims": 0}), zero])
    hi = op("Max", [op("ReduceMax", [x], {"keepdims": 0}), zero])
    span = op("Div", [op("Sub", [hi, lo]), ctx.constant(_f32(255), "qrange")])
    scale = op("Where", [op("Equal", [hi, lo]), one, span])
    zf = op("Clip", [op("Neg", [op("Div", [lo, scale])]), zero, ctx.constant(_f32(255), "qmax")])
    return scale, op("Cast", [op("Round", [zf])], {"to": int(DType.UINT8)})


@converter("DynamicQuantizeLinear", since=11, needs=_DQL_NEEDS)
def dynamic_quantize_linear(ctx: NodeContext) -> list[Value]:
    """y, s, z of onnxruntime's DynamicQuantizeLinear (uint8)."""
    scale, zp = _dynamic_qparams(ctx, ctx.require(0))
    y = ctx.emit("QuantizeLinear", [ctx.require(0), scale, zp], num_outputs=1)[0]
    outs = list(ctx.proto.output)
    for v, i in ((scale, 1), (zp, 2)):
        if i < len(outs) and outs[i]:
            ctx.graph.rename(v, outs[i])
    return [y, scale, zp]


def _dequantized_weight(ctx: NodeContext, port: int, s_port: int, what: str) -> Value:
    """transpose((W_q - z) s, (0, 2, 1)) from constant [dirs, in, gates] int8 weights and parameters."""
    wq, s, z = ctx.const(port), ctx.const(s_port), ctx.const(s_port + 1)
    if wq is None or s is None or z is None:
        raise ctx.fail(f"{what}, its scale and its zero point must be constants")
    if wq.ndim != 3:
        raise ctx.fail(f"{what} must be [num_directions, in, 4*hidden], got shape {wq.shape}")
    shape = (wq.shape[0], 1, -1 if s.size > wq.shape[0] else 1)
    w = (wq.astype(np.int32) - z.astype(np.int32).reshape(shape)).astype(np.float32)
    w = w * s.astype(np.float32).reshape(shape)
    return ctx.constant(np.ascontiguousarray(w.transpose(0, 2, 1)), f"{what}_dequantized")


@converter("DynamicQuantizeLSTM", since=1, domain=MS, needs=(*_DQL_NEEDS, "DequantizeLinear", "LSTM"))
def dynamic_quantize_lstm(ctx: NodeContext) -> list[Value]:
    """LSTM(X, dq(W)ᵀ, dq(R)ᵀ, B, sequence_lens, initial_h, initial_c, P) with the node's attributes."""
    w = _dequantized_weight(ctx, 1, 8, "W")
    r = _dequantized_weight(ctx, 2, 10, "R")
    x = ctx.require(0)
    s, z = _dynamic_qparams(ctx, x)
    x = ctx.emit(
        "DequantizeLinear", [ctx.emit("QuantizeLinear", [x, s, z], final=False)[0], s, z], final=False
    )[0]
    ins = [x, w, r, *[ctx.input(i) for i in range(3, 8)]]
    ctx.attrs["hidden_size"] = int(ctx.attrs.get("hidden_size", r.type.static_shape[2]))
    n = max(ctx.num_outputs, 1)
    return list(ctx.emit("LSTM", ins, ctx.rest(), num_outputs=n))[: ctx.num_outputs]
