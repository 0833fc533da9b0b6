"""MNN ops that only MNN's converter writes (not Kiln's writer), lifted into Kiln IR.

Pooling3D, Scale (x * s + b per channel), Shape/Rank/Size (static: constants), SliceTf, Raster
(a region copy: a Gather over the flattened inputs with a constant index map), InnerProduct
(Gemm), Deconvolution (ConvTranspose), PReLU, Caffe Slice (Split), Flatten, Squeeze/Unsqueeze,
GatherV2, Select (Where) and MatMul.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import Value
from frontends.mnn.lifters import _const_in, _conv_weights, _is_const, _node, _shape
from frontends.mnn.reader import MnnReadError, Reader, ints, lifter, op_name, param
from schemas.mnn.generated import MNN_generated as M

__all__ = ["raster_index"]


# ------------------------------------------------------------- converter-only ops
@lifter("Pooling3D")
def _pool3d(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """MNN Pool3D: 3-D max/average pooling (floor, symmetric pads); isGlobal = global pool of any rank."""
    p = param(op, M.Pool3D)
    x = r.value(ins[0])
    kind = {M.PoolType.MAXPOOL: "Max", M.PoolType.AVEPOOL: "Average"}.get(p.Type())
    if kind is None:
        raise MnnReadError(f"Pooling3D {op_name(op)!r}: unsupported pool type {p.Type()}")
    if p.IsGlobal():
        r.node(f"Global{kind}Pool", [x], None, op, outs[0])
        return
    k = ints(p.KernelsAsNumpy()) if p.KernelsLength() else []
    st = ints(p.StridesAsNumpy()) if p.StridesLength() else [1] * len(k)
    pads = ints(p.PadsAsNumpy()) if p.PadsLength() else [0] * len(k)
    if len(k) != 3 or len(st) != 3 or len(pads) not in (3, 6):
        raise MnnReadError(f"Pooling3D {op_name(op)!r}: expected 3-D kernels/strides/pads")
    attrs: dict[str, Any] = {"kernel_shape": tuple(k), "strides": tuple(st)}
    if p.PadType() == M.PoolPadType.SAME:
        attrs["auto_pad"] = "SAME_UPPER"
    else:
        full = pads * 2 if len(pads) == 3 else pads
        attrs["pads"] = (0,) * 6 if p.PadType() == M.PoolPadType.VALID else tuple(full)
    r.node(f"{kind}Pool", [x], attrs, op, outs[0])


def _channel_const(values: np.ndarray, rank: int) -> np.ndarray:
    """[C] -> [C, 1, ...] broadcasting over the axes after the channel axis (1) of a rank-``rank`` tensor."""
    return np.asarray(values, np.float32).reshape((-1,) + (1,) * max(rank - 2, 0))


@lifter("Scale")
def _scale(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """y = x * scale[c] + bias[c] (Mul then Add with per-channel constants)."""
    p = param(op, M.Scale)
    if p.ExternalLength():
        s, b = r.external(op, p.ExternalAsNumpy(), [np.float32, np.float32])
    else:
        s = np.asarray(p.ScaleDataAsNumpy(), np.float32) if p.ScaleDataLength() else np.zeros(0, np.float32)
        b = np.asarray(p.BiasDataAsNumpy(), np.float32) if p.BiasDataLength() else np.zeros(0, np.float32)
    x = r.value(ins[0])
    rank = len(_shape(r, ins[0], "Scale", op))
    c = p.Channels() or s.size
    if s.size != c or b.size not in (0, c):
        raise MnnReadError(f"Scale {op_name(op)!r}: {s.size} scales / {b.size} biases for {c} channels")
    sv = _const_in(r, op, _channel_const(s, rank), "scale")
    if b.size == 0:
        _node(r, "Mul", [x, sv], None, op, outs[0])
        return
    y = r.g.value(r.g.add_node("Mul", [x, sv], name=f"{op_name(op)}__mul"))
    _node(r, "Add", [y, _const_in(r, op, _channel_const(b, rank), "bias")], None, op, outs[0])


@lifter("Shape")
def _shape_op(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """The (static, logical NCHW) shape as an int32 constant, as MNN computes it."""
    r.consts[outs[0]] = np.asarray(_shape(r, ins[0], "Shape", op), np.int32)


@lifter("Rank")
def _rank(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    r.consts[outs[0]] = np.asarray(len(_shape(r, ins[0], "Rank", op)), np.int32)


@lifter("Size")
def _size(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    r.consts[outs[0]] = np.asarray(int(np.prod(_shape(r, ins[0], "Size", op))), np.int32)


@lifter("SliceTf")
def _slice_tf(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """TF Slice: y = x[begin : begin + size] per axis (size -1: to the end)."""
    if len(ins) != 3:
        raise MnnReadError(f"SliceTf {op_name(op)!r}: expected 3 inputs, got {len(ins)}")
    begin, size = (np.asarray(r.const(i), np.int64).reshape(-1) for i in ins[1:])
    dims = _shape(r, ins[0], "SliceTf", op)
    ends = [len_ if s < 0 else b + s for b, s, len_ in zip(begin, size, dims, strict=False)]
    if _is_const(r, ins[0]):
        x = r.const(ins[0])
        r.consts[outs[0]] = x[tuple(slice(int(b), int(e)) for b, e in zip(begin, ends, strict=True))].copy()
        return
    consts = [
        _const_in(r, op, np.asarray(v, np.int64), k)
        for k, v in (("starts", begin), ("ends", ends), ("axes", np.arange(begin.size)))
    ]
    _node(r, "Slice", [r.value(ins[0]), *consts], None, op, outs[0])


def _attrs(op: Any) -> dict[str, Any]:
    """An ``Extra`` param's attributes by key: the int list, else the scalar int."""
    e = param(op, M.Extra)
    out: dict[str, Any] = {}
    for k in range(e.AttrLength()):
        a = e.Attr(k)
        lst = a.List()
        key = (a.Key() or b"").decode()
        out[key] = ints(lst.IAsNumpy()) if lst is not None and lst.ILength() else int(a.I())
    return out


def raster_index(shape: list[int], regions: list[list[int]], sizes: list[int]) -> np.ndarray:
    """Flat source index of each output element over the inputs laid end to end (``sum(sizes)`` = zero).

    Region = [srcOffset, srcStride x3, dstOffset, dstStride x3, size x3] (input k reads input k):
    ``out[dOff + i*d0 + j*d1 + l*d2] = in_k[sOff + i*s0 + j*s1 + l*s2]``.
    """
    total = int(np.prod(shape)) if shape else 1
    idx = np.full(total, sum(sizes), np.int64)
    base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    for k, reg in enumerate(regions):
        so, s0, s1, s2, do, d0, d1, d2, n0, n1, n2 = reg
        i, j, m = np.meshgrid(np.arange(n0), np.arange(n1), np.arange(n2), indexing="ij")
        src = so + i * s0 + j * s1 + m * s2
        dst = do + i * d0 + j * d1 + m * d2
        if src.size and (src.min() < 0 or src.max() >= sizes[k] or dst.min() < 0 or dst.max() >= total):
            raise ValueError(f"region {k} reads or writes outside its tensors")
        idx[dst.reshape(-1)] = src.reshape(-1) + base[k]
    return idx.reshape(shape)


@lifter("Raster")
def _raster(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """MNN's region copy as Gather(Concat(flattened inputs[, 0]), constant index map) over static shapes."""
    a = _attrs(op) if op.Main() is not None else {}
    shape, reg = a.get("shape"), a.get("region")
    if not isinstance(shape, list) or not isinstance(reg, list) or len(reg) != 11 * len(ins) or not ins:
        raise MnnReadError(f"Raster {op_name(op)!r}: needs a shape and one 11-int region per input")
    sizes = [int(np.prod(_shape(r, i, "Raster", op))) for i in ins]
    try:
        idx = raster_index(shape, [reg[11 * k : 11 * k + 11] for k in range(len(ins))], sizes)
    except ValueError as exc:
        raise MnnReadError(f"Raster {op_name(op)!r}: {exc}") from None
    dt = r.value(ins[0]).type.dtype.numpy
    pad = bool((idx == sum(sizes)).any())
    if all(_is_const(r, i) for i in ins):
        flat = np.concatenate(
            [np.asarray(r.const(i), dt).reshape(-1) for i in ins] + [np.zeros(int(pad), dt)]
        )
        r.consts[outs[0]] = flat[idx]
        return
    minus1 = _const_in(r, op, np.asarray([-1], np.int64), "flat")
    parts: list[Value | None] = [
        r.g.value(r.g.add_node("Reshape", [r.value(i), minus1], name=f"{op_name(op)}__flat{k}"))
        for k, i in enumerate(ins)
    ]
    if pad:
        parts.append(_const_in(r, op, np.zeros(1, dt), "zero"))
    flat_v = parts[0] if len(parts) == 1 else r.g.value(r.g.add_node("Concat", parts, {"axis": 0}))
    _node(r, "Gather", [flat_v, _const_in(r, op, idx, "index")], {"axis": 0}, op, outs[0])


@lifter("InnerProduct")
def _inner_product(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """y = flatten(x, axis) @ W^T + b as Gemm(transB=1); W is [outputCount, K] ([K, N] if transpose)."""
    p = param(op, M.InnerProduct)
    if p.QuanParameter() is not None:
        raise MnnReadError(f"InnerProduct {op_name(op)!r}: quantized weights are not supported")
    n = p.OutputCount()
    w = np.asarray(p.WeightAsNumpy(), np.float32) if p.WeightLength() else np.zeros(0, np.float32)
    if n <= 0 or w.size % n:
        raise MnnReadError(f"InnerProduct {op_name(op)!r}: {w.size} weights for {n} outputs")
    w = w.reshape(-1, n).T if p.Transpose() else w.reshape(n, -1)
    x = r.value(ins[0])
    dims = _shape(r, ins[0], "InnerProduct", op)
    axis = p.Axis() if p.Axis() > 0 else 1
    if len(dims) != 2 or axis != 1:
        x = r.g.value(r.g.add_node("Flatten", [x], {"axis": axis}, name=f"{op_name(op)}__flatten"))
    b = (
        np.asarray(p.BiasAsNumpy(), np.float32)
        if p.BiasTerm() and p.BiasLength()
        else np.zeros(n, np.float32)
    )
    wv, bv = _const_in(r, op, w, "weight"), _const_in(r, op, b, "bias")
    r.node("Gemm", [x, wv, bv], {"transB": 1}, op, outs[0])


@lifter("Deconvolution")
def _deconv(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """ConvTranspose with weight [ic, oc/group, kh, kw] (ONNX order), outPads = output_padding."""
    p = param(op, M.Convolution2D)
    c = p.Common()
    if c is None:
        raise MnnReadError(f"Deconvolution {op_name(op)!r} has no common parameters")
    x = r.value(ins[0])
    ic = _shape(r, ins[0], "Deconvolution", op)[1]
    oc, group, kh, kw = c.OutputCount(), c.Group() or 1, c.KernelY(), c.KernelX()
    w, b = _conv_weights(r, op, p, oc)
    if w.size != ic * (oc // group) * kh * kw:
        raise MnnReadError(
            f"Deconvolution {op_name(op)!r}: {w.size} weights for [{ic}, {oc // group}, {kh}, {kw}]"
        )
    if len(ins) > 1 or c.HasOutputShape():
        raise MnnReadError(f"Deconvolution {op_name(op)!r}: an output-shape input is not supported")
    attrs: dict[str, Any] = {
        "group": group,
        "kernel_shape": (kh, kw),
        "strides": (c.StrideY(), c.StrideX()),
        "dilations": (c.DilateY(), c.DilateX()),
    }
    if c.PadMode() == M.PadMode.SAME:
        attrs["auto_pad"] = "SAME_UPPER"
    elif c.PadMode() == M.PadMode.VALID:
        attrs["pads"] = (0, 0, 0, 0)
    elif c.PadsLength() == 4:
        attrs["pads"] = tuple(ints(c.PadsAsNumpy()))
    else:
        attrs["pads"] = (c.PadY(), c.PadX(), c.PadY(), c.PadX())
    if c.OutPadsLength() == 2:
        attrs["output_padding"] = tuple(ints(c.OutPadsAsNumpy()))
    wv = _const_in(r, op, w.reshape(ic, oc // group, kh, kw), "weight")
    bv = _const_in(r, op, b if b.size else np.zeros(oc, np.float32), "bias")
    if not (c.Relu() or c.Relu6()):
        r.node("ConvTranspose", [x, wv, bv], attrs, op, outs[0])
        return
    y = r.g.value(r.g.add_node("ConvTranspose", [x, wv, bv], attrs, name=f"{op_name(op)}__pre_act"))
    r.node("Relu6" if c.Relu6() else "Relu", [y], None, op, outs[0], domain="kiln" if c.Relu6() else "")


@lifter("PReLU")
def _prelu(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """PRelu with slope [C, 1, 1] (one shared slope: [1])."""
    p = param(op, M.PRelu)
    s = np.asarray(p.SlopeAsNumpy(), np.float32) if p.SlopeLength() else np.zeros(0, np.float32)
    rank = len(_shape(r, ins[0], "PReLU", op))
    slope = s.reshape(1) if s.size == 1 else _channel_const(s, rank)
    r.node("PRelu", [r.value(ins[0]), _const_in(r, op, slope, "slope")], None, op, outs[0])


@lifter("Slice")
def _slice_caffe(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """Caffe/ONNX Slice = Split at ``slicePoints`` (TensorFlow source: the points are sizes)."""
    p = param(op, M.Slice)
    dims = _shape(r, ins[0], "Slice", op)
    axis = p.Axis() + len(dims) if p.Axis() < 0 else p.Axis()
    pts = ints(p.SlicePointsAsNumpy()) if p.SlicePointsLength() else []
    if p.SourceType() == M.NetSource.TENSORFLOW:
        sizes = [dims[axis] - sum(s for s in pts if s >= 0) if s < 0 else s for s in pts]
    else:
        bounds = [0, *pts, dims[axis]] if pts else [dims[axis] * k // len(outs) for k in range(len(outs) + 1)]
        sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    if len(sizes) != len(outs):
        raise MnnReadError(f"Slice {op_name(op)!r}: {len(sizes)} parts for {len(outs)} outputs")
    sv = _const_in(r, op, np.asarray(sizes, np.int64), "split")
    n = r.g.add_node(
        "Split",
        [r.value(ins[0]), sv],
        {"axis": axis},
        name=op_name(op),
        output_names=[r.tname(o) for o in outs],
        num_outputs=len(outs),
    )
    for k, o in enumerate(outs):
        r.set(o, r.g.value(n, k))


@lifter("Flatten")
def _flatten(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """Reshape collapsing axes axis..endAxis (endAxis 0: ONNX Flatten to 2-D)."""
    p = param(op, M.Flatten)
    dims = _shape(r, ins[0], "Flatten", op)
    a = p.Axis() + len(dims) if p.Axis() < 0 else p.Axis()
    if p.EndAxis() == 0:
        new = [int(np.prod(dims[:a])), int(np.prod(dims[a:]))]
    else:
        e = p.EndAxis() + len(dims) if p.EndAxis() < 0 else p.EndAxis()
        new = [*dims[:a], int(np.prod(dims[a : e + 1])), *dims[e + 1 :]]
    sv = _const_in(r, op, np.asarray(new, np.int64), "shape")
    _node(r, "Reshape", [r.value(ins[0]), sv], None, op, outs[0])


@lifter("Squeeze", "Unsqueeze")
def _squeeze(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    kind = OP_KIND[op.Type()]
    if len(ins) > 1:
        axes = ints(r.const(ins[1]))
    else:
        p = param(op, M.SqueezeParam) if op.Main() is not None else None
        axes = ints(p.SqueezeDimsAsNumpy()) if p is not None and p.SqueezeDimsLength() else []
    if not axes:
        dims = _shape(r, ins[0], kind, op)
        axes = [k for k, d in enumerate(dims) if d == 1]
    av = _const_in(r, op, np.asarray(axes, np.int64), "axes")
    _node(r, kind, [r.value(ins[0]), av], None, op, outs[0])


OP_KIND = {M.OpType.Squeeze: "Squeeze", M.OpType.Unsqueeze: "Unsqueeze"}


@lifter("GatherV2")
def _gather(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """Gather(params, indices) along the axis given as a third (constant) input, else 0."""
    axis = int(np.asarray(r.const(ins[2])).reshape(-1)[0]) if len(ins) > 2 else 0
    _node(r, "Gather", [r.value(ins[0]), r.value(ins[1])], {"axis": axis}, op, outs[0])


@lifter("Select")
def _select(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """Where(cond, a, b)."""
    _node(r, "Where", [r.value(i) for i in ins], None, op, outs[0])


@lifter("MatMul")
def _matmul(r: Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    """MatMul of two tensors; transposeA/B swap the last two axes of that operand first."""
    p = param(op, M.MatMul) if op.Main() is not None else None
    vs: list[Value | None] = []
    for k, i in enumerate(ins[:2]):
        v = r.value(i)
        if p is not None and (p.TransposeA() if k == 0 else p.TransposeB()):
            rank = len(_shape(r, i, "MatMul", op))
            perm = (*range(rank - 2), rank - 1, rank - 2)
            v = r.g.value(r.g.add_node("Transpose", [v], {"perm": perm}, name=f"{op_name(op)}__t{k}"))
        vs.append(v)
    _node(r, "MatMul", vs, None, op, outs[0])
