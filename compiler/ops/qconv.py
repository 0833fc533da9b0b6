"""``kiln::QConv``: a convolution on integer data with a fused float epilogue (one QDQ region).

Inputs: x_q (uint8/int8, NCHW), w_q (int8 OIHW constant), bias_q (optional int32 [OC]) and
an optional residual r_q (uint8/int8, the output's shape). For output channel ``oc``::

    acc  = sum (x_q - x_zero) * w_q + bias_q                       (int32; zero-padded x - x_zero)
    m    = float32(float64(x_scale) * float64(w_scales[oc]))       (scales are float32 values)
    real = float32(acc) * m  [+ float32(r_q - r_zero) * float32(r_scale)]
    real = act(real)                                               (ACTIVATIONS, float32)
    y    = real                                                    (out_dtype float32)
    y    = clip(round_half_even(real / float32(y_scale)) + y_zero, qmin, qmax)   (uint8/int8)

except for the *linear requantize* form (:func:`linear_requant`: uint8/int8 output, activation none,
relu, relu6 or clip, no residual), which rounds once in float64 with one multiplier per channel
(every scale is a float32 value widened exactly; ``/`` and ``*`` are float64 operations)::

    M[oc] = (float64(x_scale) * float64(w_scales[oc])) / float64(y_scale)
    v     = float64(acc) * M[oc]
    v     = max(v, 0)                                        (relu)
    v     = min(max(v, 0), 6 / float64(y_scale))              (relu6)
    v     = min(max(v, float64(alpha) / float64(y_scale)), float64(beta) / float64(y_scale))   (clip)
    y     = clip(round_half_even(v) + y_zero, qmin, qmax)

(``alpha``/``beta`` as float32 values). The float32 form rounds the product and the division
separately and so lands on the wrong side of .5 more often than needed.

It is exactly DequantizeLinear -> kiln::FusedConv -> QuantizeLinear up to float rounding, and
expands back into those ops (bias scale = m per channel) so that ONNX can hold it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType, TensorType
from compiler.ops import blocked_layout as bl
from compiler.ops.conv import ConvAttrs, conv_nd
from compiler.ops.fused import ACTIVATIONS, KILN, FusedConvAttrs
from compiler.ops.registry import InferContext, Layout, OpDef, QuantPolicy, get_op, register
from compiler.ops.shapes import resolve_pads, window_params

__all__ = [
    "QConvAttrs",
    "QCONV_OUT_DTYPES",
    "LINEAR_ACTIVATIONS",
    "qconv_multiplier",
    "qconv_requant_multiplier",
    "qconv_requant_bounds",
    "linear_requant",
    "linear_requant_form",
    "linear_requantize",
    "qconv_accumulate",
    "add_dequantize",
    "add_output_quantize",
    "scale_array",
]

QCONV_OUT_DTYPES = {"uint8": DType.UINT8, "int8": DType.INT8, "float32": DType.FLOAT32}
_INT8_DTYPES = (DType.UINT8, DType.INT8)
_INT32 = np.iinfo(np.int32)
LINEAR_ACTIVATIONS = ("none", "relu", "relu6", "clip")


@dataclass(frozen=True)
class QConvAttrs(FusedConvAttrs):
    """FusedConv attributes plus the quantization parameters of every operand.

    ``w_scales`` holds one scale per output channel, or a single per-tensor scale.
    """

    x_scale: float = 1.0
    x_zero: int = 0
    w_scales: tuple[float, ...] = (1.0,)
    y_scale: float = 1.0
    y_zero: int = 0
    out_dtype: str = "float32"
    r_scale: float = 1.0
    r_zero: int = 0


def _conv_attrs(a: ConvAttrs) -> ConvAttrs:
    return ConvAttrs(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ConvAttrs)})


def _fused_attrs(a: QConvAttrs) -> FusedConvAttrs:
    return FusedConvAttrs(**{f.name: getattr(a, f.name) for f in dataclasses.fields(FusedConvAttrs)})


def qconv_multiplier(x_scale: float, w_scales: tuple[float, ...]) -> np.ndarray:
    """m[oc] = float32(float64(float32 x_scale) * float64(float32 w_scales[oc])), shape [len(w_scales)]."""
    xs = np.float64(np.float32(x_scale))
    ws = np.asarray(w_scales, dtype=np.float32).astype(np.float64)
    return (xs * ws).astype(np.float32)


def qconv_requant_multiplier(
    x_scale: float, w_scales: tuple[float, ...] | np.ndarray, y_scale: float
) -> np.ndarray:
    """M[oc] = (float64(f32 x_scale) * float64(f32 w_scales[oc])) / float64(f32 y_scale), float64."""
    xs = np.float64(np.float32(x_scale))
    ws = np.asarray(w_scales, dtype=np.float32).astype(np.float64).reshape(-1)
    return (xs * ws) / np.float64(np.float32(y_scale))


def qconv_requant_bounds(activation: str, alpha: float, beta: float, y_scale: float) -> tuple[float, float]:
    """The linear form's activation bounds on ``v = acc * M`` (float64; -inf/inf where unbounded)."""
    ys = np.float64(np.float32(y_scale))
    if activation == "none":
        return (-np.inf, np.inf)
    if activation == "relu":
        return (0.0, np.inf)
    if activation == "relu6":
        return (0.0, float(np.float64(6.0) / ys))
    if activation == "clip":
        lo = np.float64(np.float32(alpha)) / ys
        hi = np.float64(np.float32(beta)) / ys
        return (float(lo), float(hi))
    raise ValueError(f"activation {activation!r} has no linear requantize form")


def linear_requant_form(activation: str, residual: bool, out_dtype: str) -> bool:
    """Whether a QConv with these properties requantizes in the linear float64 form."""
    return out_dtype in ("uint8", "int8") and activation in LINEAR_ACTIVATIONS and not residual


def linear_requant(attrs: QConvAttrs, residual: bool = False) -> bool:
    """Whether the QConv ``attrs`` (with a residual input or not) uses the linear float64 requantize."""
    return linear_requant_form(attrs.activation, residual, attrs.out_dtype)


def qconv_accumulate(
    x_q: np.ndarray, w_q: np.ndarray, bias_q: np.ndarray | None, a: ConvAttrs, x_zero: int
) -> np.ndarray:
    """acc = conv(x_q - x_zero, w_q) + bias_q as int64 (exact: integer sums in float64 stay below 2^53)."""
    kernel = w_q.shape[2:]
    s, d, p = window_params(x_q.ndim - 2, kernel, a.strides, a.dilations, a.pads)
    pads = resolve_pads(a.auto_pad, x_q.shape[2:], kernel, s, d, p)
    xc = x_q.astype(np.float64) - np.float64(x_zero)  # zero padding of x - x_zero = padding x_q with x_zero
    acc = np.rint(conv_nd(xc, w_q.astype(np.float64), None, a.group, s, d, pads))
    out = acc.astype(np.int64)
    if bias_q is not None:
        out = out + bias_q.astype(np.int64).reshape(-1, *(1,) * (x_q.ndim - 2))
    return out


def _infer(ctx: InferContext) -> list[TensorType]:
    a: QConvAttrs = ctx.attrs
    if a.activation != "none" and a.activation not in ACTIVATIONS:
        raise ctx.fail(f"unknown activation {a.activation!r}")
    if a.out_dtype not in QCONV_OUT_DTYPES:
        raise ctx.fail(f"out_dtype must be one of {', '.join(QCONV_OUT_DTYPES)}, got {a.out_dtype!r}")
    tx, tw = ctx.type(0), ctx.type(1)
    if tx.dtype not in _INT8_DTYPES or tw.dtype != DType.INT8:
        raise ctx.fail(f"x must be uint8/int8 and w int8, got {tx.dtype.short} and {tw.dtype.short}")
    x_shape = tx.shape
    try:
        if a.is_blocked:
            ws = ctx.shape(1)
            if not isinstance(ws[1], int):
                raise ctx.fail(f"a blocked conv needs static weight dims, got {ws}")
            x_shape = bl.nchw_shape(ctx.shape(0), a.layout, int(ws[1]) * a.group)
        f32: list[TensorType | None] = [
            TensorType(DType.FLOAT32, x_shape),
            TensorType(DType.FLOAT32, tw.shape),
        ]
        sub = dataclasses.replace(ctx, attrs=_conv_attrs(a), types=f32, consts=[None, None])
        conv = get_op("Conv").infer(sub)[0]
        if a.is_blocked:
            assert conv.shape is not None
            conv = conv.with_shape(bl.layout_shape(conv.shape, a.output_layout))
    except bl.LayoutError as exc:
        raise ctx.fail(str(exc)) from None
    m = tw.shape[0] if tw.shape is not None else None
    if not a.w_scales or (len(a.w_scales) != 1 and isinstance(m, int) and len(a.w_scales) != m):
        raise ctx.fail(f"w_scales has {len(a.w_scales)} entries for {m} output channels")
    if ctx.has(2):
        tb = ctx.type(2)
        if tb.dtype != DType.INT32 or tb.shape is None or len(tb.shape) != 1 or tb.shape[0] != m:
            raise ctx.fail(f"bias must be int32 of shape ({m},), got {tb}")
    out = TensorType(QCONV_OUT_DTYPES[a.out_dtype], conv.shape)
    if ctx.has(3):
        tr = ctx.type(3)
        if tr.dtype not in _INT8_DTYPES or tr.shape != conv.shape:
            raise ctx.fail(f"residual {tr} must be uint8/int8 of the output shape {conv.shape}")
    return [out]


def _reference(ins: list[np.ndarray | None], a: QConvAttrs, n: int) -> list[np.ndarray]:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    b = ins[2] if len(ins) > 2 else None
    r = ins[3] if len(ins) > 3 else None
    ob = bl.block_of(a.output_layout)
    if bl.is_blocked(a.layout):
        x = bl.unpack(x, w.shape[1] * a.group)
    if r is not None and ob:
        r = bl.unpack(r, w.shape[0])
    acc = qconv_accumulate(x, w, b, a, a.x_zero)
    if acc.size and (acc.min() < _INT32.min or acc.max() > _INT32.max):
        raise ValueError("the int32 accumulator overflows")
    if linear_requant(a, r is not None):
        q = _linear_reference(acc, a, x.ndim - 2)
        return [bl.pack(q, ob) if ob else q]
    mult = qconv_multiplier(a.x_scale, a.w_scales).reshape(-1, *(1,) * (x.ndim - 2))
    real = acc.astype(np.float32) * mult
    if r is not None:
        rv = (r.astype(np.int64) - a.r_zero).astype(np.float32) * np.float32(a.r_scale)
        real = real + rv
    if a.activation != "none":
        real = ACTIVATIONS[a.activation].apply(real, a.alpha, a.beta)
    real = np.asarray(real, dtype=np.float32)
    if a.out_dtype == "float32":
        return [bl.pack(real, ob) if ob else real]
    dt = QCONV_OUT_DTYPES[a.out_dtype].numpy
    info = np.iinfo(dt)
    q = np.clip(np.rint(real / np.float32(a.y_scale)) + np.float32(a.y_zero), info.min, info.max).astype(dt)
    return [bl.pack(q, ob) if ob else q]


def linear_requantize(
    acc: np.ndarray, m: np.ndarray, bounds: tuple[float, float], y_zero: int, out_dtype: str
) -> np.ndarray:
    """The linear requantize form (module docstring) of the int64 ``acc``; ``m`` broadcasts to it."""
    v = np.minimum(np.maximum(acc.astype(np.float64) * m, bounds[0]), bounds[1])
    dt = QCONV_OUT_DTYPES[out_dtype].numpy
    info = np.iinfo(dt)
    return np.clip(np.rint(v) + np.float64(y_zero), info.min, info.max).astype(dt)


def _linear_reference(acc: np.ndarray, a: QConvAttrs, spatial: int) -> np.ndarray:
    """The linear requantize form (module docstring) on the int64 accumulator."""
    m = qconv_requant_multiplier(a.x_scale, a.w_scales, a.y_scale).reshape(-1, *(1,) * spatial)
    bounds = qconv_requant_bounds(a.activation, a.alpha, a.beta, a.y_scale)
    return linear_requantize(acc, m, bounds, a.y_zero, a.out_dtype)


def add_dequantize(
    g: Graph, v: Value, scale: np.ndarray, zero: np.ndarray, name: str, axis: int = 0
) -> Value:
    """A new DequantizeLinear(v, scale, zero) named ``name`` (per ``axis`` when ``scale`` is 1-D)."""
    s = g.add_constant(scale, f"{name}_scale")
    z = g.add_constant(zero, f"{name}_zp")
    attrs = {"axis": axis} if scale.ndim == 1 else None
    return g.value(g.add_node("DequantizeLinear", [v, s, z], attrs, name=name))


def scale_array(values: np.ndarray) -> np.ndarray:
    """A per-tensor scale as a scalar, a per-channel one as a vector."""
    return values.reshape(()) if values.size == 1 else values


def _expand(g: Graph, node: Node) -> list[Value]:
    """DequantizeLinear(x, w, bias, residual) -> kiln::FusedConv -> QuantizeLinear (unless float32 out)."""
    a: QConvAttrs = node.attrs
    ins = g.inputs_of(node)
    base = node.name or node.output_names[0]
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    xdt = x.type.dtype.numpy
    dx = add_dequantize(g, x, np.array(a.x_scale, np.float32), np.array(a.x_zero, xdt), f"{base}_x_dq")
    ws = scale_array(np.asarray(a.w_scales, np.float32))
    dw = add_dequantize(g, w, ws, np.zeros(ws.shape, np.int8), f"{base}_w_dq")
    fused: list[Value | None] = [dx, dw]
    b = ins[2] if len(ins) > 2 else None
    if b is not None:
        bs = scale_array(qconv_multiplier(a.x_scale, a.w_scales))
        fused.append(add_dequantize(g, b, bs, np.zeros(bs.shape, np.int32), f"{base}_b_dq"))
    r = ins[3] if len(ins) > 3 else None
    if r is not None:
        rdt = r.type.dtype.numpy
        fused += [None] * (3 - len(fused))
        fused.append(
            add_dequantize(g, r, np.array(a.r_scale, np.float32), np.array(a.r_zero, rdt), f"{base}_r_dq")
        )
    y = g.value(g.add_node("FusedConv", fused, _fused_attrs(a), domain=KILN, name=f"{base}_float"))
    return [add_output_quantize(g, y, a.out_dtype, a.y_scale, a.y_zero, base)]


def add_output_quantize(g: Graph, y: Value, out_dtype: str, y_scale: float, y_zero: int, base: str) -> Value:
    """The float result of an expanded integer op on its output grid: QuantizeLinear(y; s_y, z_y),
    or ``y`` itself for ``out_dtype`` float32."""
    if out_dtype == "float32":
        return y
    s = g.add_constant(np.array(y_scale, np.float32), f"{base}_y_scale")
    z = g.add_constant(np.array(y_zero, QCONV_OUT_DTYPES[out_dtype].numpy), f"{base}_y_zp")
    return g.value(g.add_node("QuantizeLinear", [y, s, z], name=f"{base}_q"))


register(
    OpDef(
        "QConv",
        _infer,
        _reference,
        QConvAttrs,
        domain=KILN,
        inputs=(2, 4),
        layout=Layout.SPATIAL,
        quant=QuantPolicy.NONE,
        expand=_expand,
        doc="y = q(act(float32(conv(x_q - x_zero, w_q) + bias_q) * x_scale*w_scale[oc] + dq(r_q))); "
        "none/relu/relu6/clip to int: clip(rint(act(float64(acc) * x_scale*w_scale[oc]/y_scale)) + y_zero)",
    )
)
