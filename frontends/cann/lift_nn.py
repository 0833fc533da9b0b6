"""Lifters that need code: Conv2D, FullyConnection, Pooling, AvgPoolV2, BNInference, Reshape.

The inverses of ``backends/cann/lower_nn.py`` (and of ``nn_attrs.py``): GE's 4-element
strides/dilations and [top, bottom, left, right] pads become ONNX's; Pooling's
``ceil_mode`` 0 means ceil, AvgPoolV2's is a bool and its ``exclusive`` is ONNX's
``count_include_pad = 0``; FullyConnection's ``transpose`` means a [K, N] weight
(Gemm transB = 0); BNInference's inputs (x, mean, variance, momentum, scale, offset) become
BatchNormalization's (x, scale, bias, mean, var), with momentum (the statistics' scale
factor) required to be 1. A Conv2D or FullyConnection with an int8 filter is one half of
the int8 pattern and is lifted by ``lift_quant.py``.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from frontends.cann.lift import Lifter, LiftError, lifter
from schemas.cann.om_graph import OmOp

__all__ = ["conv_attrs", "gemm_attrs"]


def conv_attrs(lf: Lifter, op: OmOp, kernel: tuple[int, ...]) -> dict[str, object]:
    """ONNX Conv attributes from a GE Conv2D."""
    fmt = lf.attr(op, "data_format", "s", "NCHW")
    if fmt != "NCHW":
        raise LiftError(f"data_format {fmt!r} (Kiln reads NCHW convolutions)")
    strides = lf.ints(op, "strides", 4)
    dilations = lf.ints(op, "dilations", 4, (1, 1, 1, 1))
    t, b, left, r = lf.ints(op, "pads", 4, (0, 0, 0, 0))
    if strides[:2] != (1, 1) or dilations[:2] != (1, 1):
        raise LiftError(f"strides {list(strides)} / dilations {list(dilations)} must be 1 on N and C")
    return {
        "strides": strides[2:],
        "dilations": dilations[2:],
        "pads": (t, left, b, r),
        "group": lf.attr(op, "groups", "i", 1),
        "kernel_shape": kernel[2:],
    }


def gemm_attrs(lf: Lifter, op: OmOp) -> dict[str, object]:
    """ONNX Gemm attributes from a GE FullyConnection."""
    if lf.attr(op, "axis", "i", 1) != 1:
        raise LiftError("only axis=1 FullyConnection is supported")
    return {"transB": 0 if lf.attr(op, "transpose", "b", False) else 1}


def _int8_filter(lf: Lifter, op: OmOp) -> bool:
    r = op.inputs[1] if len(op.inputs) > 1 else ""
    if not r:
        raise LiftError("the filter input is missing")
    w = lf.value(r)
    assert w is not None
    return w.type.dtype is DType.INT8


@lifter("Conv2D")
def _conv(lf: Lifter, op: OmOp) -> Value:
    if _int8_filter(lf, op):
        from frontends.cann.lift_quant import lift_weighted_int8

        return lift_weighted_int8(lf, op)
    if len(op.inputs) > 3 and op.inputs[3]:
        raise LiftError("offset_w (input 3) is not supported")
    ins = lf.inputs(op)
    w = ins[1]
    assert w is not None
    if w.type.rank != 4:
        raise LiftError(f"filter shape {w.type} is not 4-D")
    return lf.node("Conv", ins, conv_attrs(lf, op, w.type.static_shape), op.name)


@lifter("FullyConnection")
def _fc(lf: Lifter, op: OmOp) -> Value:
    if _int8_filter(lf, op):
        from frontends.cann.lift_quant import lift_weighted_int8

        return lift_weighted_int8(lf, op)
    if len(op.inputs) > 3 and op.inputs[3]:
        raise LiftError("offset_w (input 3) is not supported")
    return lf.node("Gemm", lf.inputs(op), gemm_attrs(lf, op), op.name)


@lifter("Pooling")
def _pool(lf: Lifter, op: OmOp) -> Value:
    mode = lf.attr(op, "mode", "i", 0)
    if mode not in (0, 1):
        raise LiftError(f"pooling mode {mode} (0 max, 1 avg)")
    if lf.ints(op, "dilation", 4, (1, 1, 1, 1)) != (1, 1, 1, 1):
        raise LiftError("dilated pooling is not supported")
    if lf.attr(op, "data_format", "s", "NCHW") != "NCHW":
        raise LiftError("only NCHW pooling is supported")
    ins = lf.inputs(op)
    if lf.attr(op, "global_pooling", "b", False):
        return lf.node("GlobalMaxPool" if mode == 0 else "GlobalAveragePool", ins, None, op.name)
    t, b, left, r = lf.ints(op, "pad", 4, (0, 0, 0, 0))
    attrs: dict[str, object] = {
        "kernel_shape": lf.ints(op, "window", 2),
        "strides": lf.ints(op, "stride", 2, (1, 1)),
        "pads": (t, left, b, r),
        "ceil_mode": 1 if lf.attr(op, "ceil_mode", "i", 0) == 0 else 0,
    }
    if mode == 1 and any((t, b, left, r)):
        attrs["count_include_pad"] = 1
    return lf.node("MaxPool" if mode == 0 else "AveragePool", ins, attrs, op.name)


@lifter("AvgPoolV2")
def _avg_pool_v2(lf: Lifter, op: OmOp) -> Value:
    if lf.attr(op, "data_format", "s", "NCHW") != "NCHW":
        raise LiftError("only NCHW pooling is supported")
    mode = lf.attr(op, "padding_mode", "s", "CALCULATED")
    if mode != "CALCULATED":
        raise LiftError(f"padding_mode {mode!r} (Kiln reads CALCULATED, explicit pads)")
    if lf.attr(op, "divisor_override", "i", 0) != 0:
        raise LiftError("divisor_override is not supported")
    ins = lf.inputs(op)
    if lf.attr(op, "global_pooling", "b", False):
        return lf.node("GlobalAveragePool", ins, None, op.name)
    ksize, strides = lf.ints(op, "ksize", 4), lf.ints(op, "strides", 4)
    if ksize[:2] != (1, 1) or strides[:2] != (1, 1):
        raise LiftError(f"ksize {list(ksize)} / strides {list(strides)} must be 1 on N and C")
    t, b, left, r = lf.ints(op, "pads", 4, (0, 0, 0, 0))
    attrs: dict[str, object] = {
        "kernel_shape": ksize[2:],
        "strides": strides[2:],
        "pads": (t, left, b, r),
        "ceil_mode": int(bool(lf.attr(op, "ceil_mode", "b", False))),
        "count_include_pad": 0 if lf.attr(op, "exclusive", "b", True) else 1,
    }
    return lf.node("AveragePool", ins, attrs, op.name)


@lifter("BNInference")
def _bn(lf: Lifter, op: OmOp) -> Value:
    refs = list(op.inputs) + [""] * 6
    x, mean, var = (lf.value(r) for r in refs[:3])
    momentum = lf.const(op, 3, "momentum")
    if momentum.size != 1 or float(momentum.reshape(-1)[0]) != 1.0:
        raise LiftError("BNInference with a momentum (statistics scale factor) other than 1 is not supported")
    if mean is None or var is None or x is None:
        raise LiftError("x, mean and variance are required")
    scale, offset = lf.value(refs[4]), lf.value(refs[5])
    n = mean.type.static_shape
    dt = mean.type.dtype.numpy
    if scale is None:
        scale = lf.g.add_constant(np.ones(n, dt), f"{op.name}/scale")
    if offset is None:
        offset = lf.g.add_constant(np.zeros(n, dt), f"{op.name}/offset")
    attrs = {"epsilon": lf.attr(op, "epsilon", "f", 1e-5)}
    if not lf.attr(op, "use_global_stats", "b", True):
        raise LiftError("use_global_stats=false (training mode) is not supported")
    return lf.node("BatchNormalization", [x, scale, offset, mean, var], attrs, op.name)


@lifter("Reshape")
def _reshape(lf: Lifter, op: OmOp) -> Value:
    if lf.attr(op, "axis", "i", 0) != 0 or lf.attr(op, "num_axes", "i", -1) != -1:
        raise LiftError("only axis=0, num_axes=-1 Reshape is supported")
    shape = lf.const(op, 1, "shape")
    if shape.dtype.kind not in "iu" or shape.ndim != 1:
        raise LiftError("the shape must be a 1-D integer constant")
    ins = lf.inputs(op)
    return lf.node("Reshape", ins[:2], None, op.name)


@lifter("LayerNorm", multi_output=True)
def _layer_norm(lf: Lifter, op: OmOp) -> list[Value | None]:
    """``LayerNorm(x, gamma, beta)`` -> ``LayerNormalization`` (axis = begin_norm_axis, which must
    equal begin_params_axis); GE's mean is ONNX's Mean, its variance has no ONNX output."""
    if len(op.inputs) != 3 or not all(op.inputs):
        raise LiftError(f"LayerNorm has 3 inputs (x, gamma, beta), not {len(op.inputs)}")
    x, gamma, beta = (lf.value(r) for r in op.inputs)
    assert x is not None and x.type.rank is not None
    rank = x.type.rank
    axis = lf.attr(op, "begin_norm_axis", "i", 0)
    params = lf.attr(op, "begin_params_axis", "i", 0)
    if not isinstance(axis, int) or not isinstance(params, int) or not -rank <= axis < rank:
        raise LiftError(f"begin_norm_axis {axis!r} does not fit an input of rank {rank}")
    if params % rank != axis % rank:
        raise LiftError(f"begin_params_axis {params} != begin_norm_axis {axis} has no ONNX form")
    attrs = {"axis": axis, "epsilon": lf.attr(op, "epsilon", "f", 1e-5)}
    n = min(len(op.outputs), 2)
    vals = lf.multi("LayerNormalization", [x, gamma, beta], attrs, [op.name, f"{op.name}_mean"][:n])
    lf.unavailable(op, 2, "GE LayerNorm's variance has no ONNX output (ONNX gives InvStdDev)")
    return [*vals, None]


@lifter("Gelu")
def _gelu(lf: Lifter, op: OmOp) -> Value:
    """GE's ``Gelu`` is the tanh approximation x / (1 + exp(-2·sqrt(2/π)(x + 0.044715 x³))) (GeluV2
    carries ONNX's ``approximate`` itself)."""
    if len(op.inputs) != 1:
        raise LiftError(f"Gelu has 1 input, not {len(op.inputs)}")
    return lf.node("Gelu", lf.inputs(op), {"approximate": "tanh"}, op.name)


@lifter("Conv2DTranspose")
def _conv_transpose(lf: Lifter, op: OmOp) -> Value:
    """``Conv2DTranspose(input_size, x, filter[, bias])`` -> ``ConvTranspose``; the output shape must
    be the one ``input_size`` states (checked against the op's output descriptor)."""
    if len(op.inputs) not in (3, 4) or not all(op.inputs[:3]) or (len(op.inputs) == 4 and not op.inputs[3]):
        raise LiftError(
            f"Conv2DTranspose has 3 or 4 inputs (input_size, x, filter, bias), not {len(op.inputs)}"
        )
    size = lf.const(op, 0, "input_size")
    x, w, *bias = (lf.value(r) for r in op.inputs[1:])
    assert x is not None and w is not None
    if w.type.rank != 4:
        raise LiftError(f"filter shape {w.type} is not 4-D")
    attrs = conv_attrs(lf, op, w.type.static_shape)
    pad = lf.ints(op, "output_padding", 4, (0, 0, 0, 0))
    if pad[:2] != (0, 0):
        raise LiftError(f"output_padding {list(pad)} must be 0 on N and C")
    attrs["output_padding"] = pad[2:]
    v = lf.node("ConvTranspose", [x, w, *bias], attrs, op.name)
    if tuple(int(s) for s in size.reshape(-1)) != v.type.static_shape:
        raise LiftError(f"input_size {size.reshape(-1).tolist()} differs from the computed shape {v.type}")
    return v
