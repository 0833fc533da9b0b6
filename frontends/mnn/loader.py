"""Read an MNN ``.mnn`` file into a Kiln Graph.

The file is one ``MNN.Net`` FlatBuffer (``backends/mnn/generated``). Layout ops
(``ConvertTensor``) are dropped: Kiln's graph is always in the logical NCHW order, which
is what MNN's op parameters (Concat/Softmax axes, Permute dims, Reshape with dimType
NCHW) describe. Convolutions come back as ``kiln::FusedConv`` (with the relu/relu6 flag)
with their weights decoded from whichever encoding the file uses (fp32, fp16, table-coded
int8/int4 symmetric or asymmetric, block-wise, fp16 scales, external ``.weight`` data).
A file that cannot be read, whatever the reason, is one ModelFileError naming it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from backends.mnn.external import check_side_file, side_file
from backends.mnn.generated import MNN_generated as M
from backends.mnn.idst import decode
from backends.mnn.weights import QuantizedWeights, dequantize_weights
from compiler.errors import InputShapeError, KilnError, ModelFileError, UnsupportedOpsError
from compiler.ir.graph import Graph, Value
from compiler.ir.types import DType, TensorType
from compiler.ir.verifier import verify

__all__ = ["load_mnn", "MnnReadError"]

logger = logging.getLogger(__name__)

_OP_NAMES = {v: k for k, v in vars(M.OpType).items() if not k.startswith("_") and isinstance(v, int)}


class MnnReadError(Exception):
    """The file's content is invalid (becomes a ModelFileError naming the file)."""


def _param(op: Any, cls: type) -> Any:
    tab = op.Main()
    if tab is None:
        raise MnnReadError(f"op {_name(op)!r} has no parameter")
    p = cls()
    p.Init(tab.Bytes, tab.Pos)
    return p


def _name(op: Any) -> str:
    n = op.Name()
    return n.decode() if n else ""


def _ints(arr: Any) -> list[int]:
    return [int(x) for x in np.asarray(arr).reshape(-1)] if not isinstance(arr, int) else []


class _Reader:
    def __init__(self, path: Path, data: bytes, input_shapes: Mapping[str, Sequence[int]] | None) -> None:
        self.path = path
        self.data = data
        self.input_shapes = dict(input_shapes or {})
        self.net = M.Net.GetRootAs(data, 0)
        self.g = Graph(path.stem)
        self.names = [(self.net.TensorName(i) or b"").decode() for i in range(self.net.TensorNameLength())]
        self.values: dict[int, Value] = {}
        self.consts: dict[int, np.ndarray] = {}
        self._side: dict[Path, bytes] = {}

    # ----------------------------------------------------------------- helpers
    def side_bytes(self, op: Any) -> bytes:
        ext = op.ExternalPath()
        p = Path(ext.decode()) if ext else side_file(self.path)
        if ext and not p.is_absolute():
            p = self.path.parent / p
        if p not in self._side:
            try:
                self._side[p] = p.read_bytes()
            except OSError as exc:
                raise ModelFileError(
                    f"{self.path}: its weights live in {p.name}, which cannot be read ({exc})"
                ) from None
        return self._side[p]

    def external(self, op: Any, ext: np.ndarray, dtypes: Sequence[Any]) -> list[np.ndarray]:
        side = self.side_bytes(op)
        pos = int(ext[0])
        out = []
        for size, dt in zip(ext[1:], dtypes, strict=False):
            size = int(size)
            if pos + size > len(side):
                raise MnnReadError(f"external data of op {_name(op)!r} runs past the end of the side file")
            out.append(np.frombuffer(side[pos : pos + size], dt).copy())
            pos += size
        return out

    def value(self, idx: int) -> Value:
        v = self.values.get(idx)
        if v is not None:
            return v
        if idx in self.consts:
            v = self.g.add_constant(self.consts[idx], self.tname(idx))
            self.values[idx] = v
            return v
        raise MnnReadError(f"tensor {self.tname(idx)!r} is read before it is written")

    def tname(self, idx: int) -> str:
        if not 0 <= idx < len(self.names):
            raise MnnReadError(f"tensor index {idx} out of range (the file has {len(self.names)} tensors)")
        return self.names[idx] or f"t{idx}"

    def const(self, idx: int) -> np.ndarray:
        if idx not in self.consts:
            c = self.g.const_value(self.value(idx))
            if c is None:
                raise MnnReadError(f"tensor {self.tname(idx)!r} must be a constant")
            return c
        return self.consts[idx]

    def set(self, idx: int, v: Value) -> None:
        self.values[idx] = v

    def node(
        self, op_type: str, inputs: Sequence[Value | None], attrs: Any, op: Any, out: int, domain: str = ""
    ) -> None:
        n = self.g.add_node(
            op_type, inputs, attrs, domain=domain, name=_name(op), output_names=[self.tname(out)]
        )
        self.set(out, self.g.value(n))

    # -------------------------------------------------------------------- read
    def read(self) -> Graph:
        ops = [self.net.Oplists(i) for i in range(self.net.OplistsLength())]
        if not ops or not self.names:
            raise MnnReadError("the net has no ops or no tensor names")
        unknown: dict[str, list[str]] = {}
        for op in ops:
            t = _OP_NAMES.get(op.Type(), f"OpType {op.Type()}")
            if t not in _LIFTERS:
                unknown.setdefault(t, []).append(_name(op))
        if unknown:
            raise UnsupportedOpsError(str(self.path), unknown)
        produced: list[int] = []
        consumed: set[int] = set()
        for op in ops:
            ins = _ints(op.InputIndexesAsNumpy()) if op.InputIndexesLength() else []
            outs = _ints(op.OutputIndexesAsNumpy()) if op.OutputIndexesLength() else []
            if not outs:
                raise MnnReadError(f"op {_name(op)!r} has no outputs")
            for i in ins + outs:
                self.tname(i)
            _LIFTERS[_OP_NAMES[op.Type()]](self, op, ins, outs)
            consumed.update(ins)
            produced.extend(outs)
        if self.net.OutputNameLength():
            index = {n: i for i, n in enumerate(self.names)}
            out_idx = []
            for k in range(self.net.OutputNameLength()):
                n = (self.net.OutputName(k) or b"").decode()
                if n not in index:
                    raise MnnReadError(f"output {n!r} names no tensor")
                out_idx.append(index[n])
        else:
            out_idx = [i for i in produced if i not in consumed and i not in self.consts]
        outs_v = [self.value(i) for i in out_idx]
        self.g.set_outputs(outs_v, [self.tname(i) for i in out_idx])
        unused = set(self.input_shapes) - {v.name for v in self.g.inputs}
        if unused:
            raise InputShapeError(
                f"{self.path}: --input-shape names unknown inputs: {', '.join(sorted(unused))}"
            )
        verify(self.g)
        return self.g


# ------------------------------------------------------------------------ lifters
Lift = Callable[[_Reader, Any, list[int], list[int]], None]
_LIFTERS: dict[str, Lift] = {}


def _lifter(*names: str) -> Callable[[Lift], Lift]:
    def deco(fn: Lift) -> Lift:
        for n in names:
            _LIFTERS[n] = fn
        return fn

    return deco


_DTYPES = {
    M.DataType.DT_FLOAT: np.float32,
    M.DataType.DT_INT32: np.int32,
    M.DataType.DT_INT64: np.int64,
    M.DataType.DT_INT8: np.int8,
    M.DataType.DT_UINT8: np.uint8,
}


@_lifter("Input")
def _input(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = _param(op, M.Input)
    dims = [1 if d < 0 else d for d in _ints(p.DimsAsNumpy())] if p.DimsLength() else []
    name = r.tname(outs[0])
    if name in r.input_shapes:
        dims = [int(d) for d in r.input_shapes[name]]
    dt = _DTYPES.get(p.Dtype(), np.float32)
    r.set(outs[0], r.g.add_input(name, TensorType(DType.from_numpy(np.dtype(dt)), tuple(dims))))


@_lifter("Const")
def _const(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    b = _param(op, M.Blob)
    dims = _ints(b.DimsAsNumpy()) if b.DimsLength() else []
    dt = b.DataType()
    np_dt = _DTYPES.get(dt)
    if np_dt is None:
        raise MnnReadError(f"Const {_name(op)!r} has unsupported data type {dt}")
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
        raise MnnReadError(f"Const {_name(op)!r}: {arr.size} values for dims {dims}")
    r.consts[outs[0]] = arr.reshape(dims)


@_lifter("ConvertTensor")
def _convert(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    r.set(outs[0], r.value(ins[0]))


def _conv_weights(r: _Reader, op: Any, p: Any, oc: int) -> tuple[np.ndarray, np.ndarray]:
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
        raise MnnReadError(f"op {_name(op)!r}: IDSTQuan type {t} is not supported")
    asym = q.ReadType() != 0
    bits = int(q.AMaxOrBits()) or 8
    groups = alpha.size // (2 if asym else 1)
    if groups == 0 or qi.size % groups or groups % oc:
        raise MnnReadError(f"op {_name(op)!r}: {alpha.size} scales for {oc} output channels")
    if q.QuantScale() not in (0.0, 1.0):
        alpha = alpha * np.float32(q.QuantScale())
    qw = QuantizedWeights(qi.astype(np.int32), alpha.astype(np.float32), bits, asym, groups)
    return dequantize_weights(qw).reshape(-1), b


@_lifter("Convolution", "ConvolutionDepthwise")
def _conv(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = _param(op, M.Convolution2D)
    c = p.Common()
    if c is None:
        raise MnnReadError(f"conv {_name(op)!r} has no common parameters")
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
        raise MnnReadError(f"conv {_name(op)!r}: {w.size} weights for [{oc}, {ic // group}, {kh}, {kw}]")
    if b.size == 0:
        b = np.zeros(oc, np.float32)
    if b.size != oc:
        raise MnnReadError(f"conv {_name(op)!r}: {b.size} biases for {oc} output channels")
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
        t, left, bottom, right = _ints(c.PadsAsNumpy())
        attrs["pads"] = (t, left, bottom, right)
    else:
        attrs["pads"] = (c.PadY(), c.PadX(), c.PadY(), c.PadX())
    attrs["activation"] = "relu6" if c.Relu6() else ("relu" if c.Relu() else "none")
    wv = r.g.add_constant(w.reshape(oc, ic // group, kh, kw), f"{_name(op)}_weight")
    bv = r.g.add_constant(b, f"{_name(op)}_bias")
    r.node("FusedConv", [x, wv, bv], attrs, op, outs[0], domain="kiln")


@_lifter("ReLU")
def _relu(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    tab = op.Main()
    slope = _param(op, M.Relu).Slope() if tab is not None else 0.0
    if slope:
        r.node("LeakyRelu", [r.value(ins[0])], {"alpha": float(slope)}, op, outs[0])
    else:
        r.node("Relu", [r.value(ins[0])], None, op, outs[0])


@_lifter("ReLU6")
def _relu6(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    lo, hi = 0.0, 6.0
    if op.Main() is not None:
        p = _param(op, M.Relu6)
        lo, hi = float(p.MinValue()), float(p.MaxValue())
    if (lo, hi) == (0.0, 6.0):
        r.node("Relu6", [r.value(ins[0])], None, op, outs[0], domain="kiln")
        return
    x = r.value(ins[0])
    bounds = [
        r.g.add_constant(np.array(v, np.float32), f"{_name(op)}_{k}") for k, v in (("min", lo), ("max", hi))
    ]
    r.node("Clip", [x, *bounds], None, op, outs[0])


_ELTWISE = {
    M.EltwiseType.SUM: "Add",
    M.EltwiseType.PROD: "Mul",
    M.EltwiseType.MAXIMUM: "Max",
    M.EltwiseType.SUB: "Sub",
}


@_lifter("Eltwise")
def _eltwise(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = _param(op, M.Eltwise)
    kind = _ELTWISE.get(p.Type())
    if kind is None or len(ins) < 2:
        raise MnnReadError(f"Eltwise {_name(op)!r}: unsupported type {p.Type()} or arity {len(ins)}")
    if p.CoeffLength() and any(float(c) != 1.0 for c in p.CoeffAsNumpy()):
        raise MnnReadError(f"Eltwise {_name(op)!r}: coefficients are not supported")
    acc = r.value(ins[0])
    for k, i in enumerate(ins[1:], 1):
        if k == len(ins) - 1:
            r.node(kind, [acc, r.value(i)], None, op, outs[0])
        else:
            acc = r.g.value(r.g.add_node(kind, [acc, r.value(i)], name=f"{_name(op)}_{k}"))


@_lifter("Concat")
def _concat(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    axis = _param(op, M.Axis).Axis() if op.Main() is not None else 0
    r.node("Concat", [r.value(i) for i in ins], {"axis": axis}, op, outs[0])


@_lifter("Softmax")
def _softmax(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    axis = _param(op, M.Axis).Axis() if op.Main() is not None else 1
    r.node("Softmax", [r.value(ins[0])], {"axis": axis}, op, outs[0])


@_lifter("Permute")
def _permute(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = _param(op, M.Permute)
    r.node("Transpose", [r.value(ins[0])], {"perm": tuple(_ints(p.DimsAsNumpy()))}, op, outs[0])


@_lifter("Reshape")
def _reshape(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    if len(ins) >= 2:
        shape = np.asarray(r.const(ins[1]), np.int64).reshape(-1)
    else:
        p = _param(op, M.Reshape)
        shape = np.asarray(_ints(p.DimsAsNumpy()) if p.DimsLength() else [], np.int64)
    sv = r.g.add_constant(shape, f"{_name(op)}_shape")
    r.node("Reshape", [r.value(ins[0]), sv], None, op, outs[0])


_BINARY = {
    M.BinaryOpOperation.ADD: "Add",
    M.BinaryOpOperation.SUB: "Sub",
    M.BinaryOpOperation.MUL: "Mul",
    M.BinaryOpOperation.DIV: "Div",
    M.BinaryOpOperation.REALDIV: "Div",
    M.BinaryOpOperation.POW: "Pow",
    M.BinaryOpOperation.MAXIMUM: "Max",
    M.BinaryOpOperation.MINIMUM: "Min",
}


@_lifter("BinaryOp")
def _binary(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = _param(op, M.BinaryOp)
    kind = _BINARY.get(p.OpType())
    if kind is None or len(ins) != 2:
        raise MnnReadError(f"BinaryOp {_name(op)!r}: unsupported operation {p.OpType()} or arity {len(ins)}")
    a, b = r.value(ins[0]), r.value(ins[1])
    if p.ActivationType() == 1:
        y = r.g.value(r.g.add_node(kind, [a, b], name=f"{_name(op)}__pre_relu"))
        r.node("Relu", [y], None, op, outs[0])
    elif p.ActivationType() == 0:
        r.node(kind, [a, b], None, op, outs[0])
    else:
        raise MnnReadError(f"BinaryOp {_name(op)!r}: unsupported activationType {p.ActivationType()}")


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


@_lifter("UnaryOp")
def _unary(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = _param(op, M.UnaryOp)
    kind = _UNARY.get(p.OpType())
    if kind is None:
        raise MnnReadError(f"UnaryOp {_name(op)!r}: unsupported operation {p.OpType()}")
    r.node(kind, [r.value(ins[0])], None, op, outs[0])


@_lifter("Sigmoid")
def _sigmoid(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    r.node("Sigmoid", [r.value(ins[0])], None, op, outs[0])


@_lifter("Pooling")
def _pool(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = _param(op, M.Pool)
    x = r.value(ins[0])
    kind = {M.PoolType.MAXPOOL: "Max", M.PoolType.AVEPOOL: "Average"}.get(p.Type())
    if kind is None:
        raise MnnReadError(f"Pooling {_name(op)!r}: unsupported pool type {p.Type()}")
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
        attrs["pads"] = tuple(_ints(p.PadsAsNumpy()))
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


@_lifter("Interp")
def _interp(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = _param(op, M.Interp)
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
        raise MnnReadError(f"Interp {_name(op)!r}: unsupported resizeType {rt}")
    ctm = _CTM.get(p.Ctm())
    if ctm is None:
        ctm = (
            "align_corners" if p.AlignCorners() else ("half_pixel" if p.HalfPixelCenters() else "asymmetric")
        )
    attrs["coordinate_transformation_mode"] = ctm
    shape = x.type.shape
    if shape is None or len(shape) != 4:
        raise MnnReadError(f"Interp {_name(op)!r}: the input must be 4-D")
    if len(ins) >= 2:
        scales = np.asarray(r.const(ins[1]), np.float32).reshape(-1)
        if scales.size != 4:
            raise MnnReadError(f"Interp {_name(op)!r}: expected 4 scales")
        sv = r.g.add_constant(scales, f"{_name(op)}_scales")
        r.node("Resize", [x, None, sv], attrs, op, outs[0])
        return
    if p.OutputHeight() > 0 and p.OutputWidth() > 0:
        sizes = np.asarray([shape[0], shape[1], p.OutputHeight(), p.OutputWidth()], np.int64)
        zv = r.g.add_constant(sizes, f"{_name(op)}_sizes")
        r.node("Resize", [x, None, None, zv], attrs, op, outs[0])
        return
    if p.HeightScale() <= 0 or p.WidthScale() <= 0:
        raise MnnReadError(f"Interp {_name(op)!r}: no output size and no scale")
    scales = np.asarray([1.0, 1.0, 1.0 / p.HeightScale(), 1.0 / p.WidthScale()], np.float32)
    sv = r.g.add_constant(scales, f"{_name(op)}_scales")
    r.node("Resize", [x, None, sv], attrs, op, outs[0])


@_lifter("StridedSlice")
def _strided_slice(r: _Reader, op: Any, ins: list[int], outs: list[int]) -> None:
    p = _param(op, M.StridedSliceParam)
    if len(ins) != 4:
        raise MnnReadError(f"StridedSlice {_name(op)!r}: expected 4 inputs, got {len(ins)}")
    if p.EllipsisMask() or p.NewAxisMask() or p.ShrinkAxisMask():
        raise MnnReadError(f"StridedSlice {_name(op)!r}: ellipsis/new-axis/shrink masks are not supported")
    x = r.value(ins[0])
    begin, end, stride = (_ints(r.const(i)) for i in ins[1:])
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
        r.g.add_constant(np.asarray(v, np.int64), f"{_name(op)}_{k}")
        for k, v in (("starts", starts), ("ends", ends), ("axes", list(range(len(begin)))), ("steps", stride))
    ]
    r.node("Slice", [x, *consts], None, op, outs[0])


# ------------------------------------------------------------------------- entry


def load_mnn(
    source: str | os.PathLike[str], *, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Import an MNN ``.mnn`` model (and its ``.weight`` side file) into a Kiln Graph.

    Raises:
        ModelFileError: missing, truncated or corrupt file; missing or short side file.
        UnsupportedOpsError: some op types have no Kiln mapping (all are listed).
        InputShapeError: ``input_shapes`` names an unknown input.
    """
    p = Path(source)
    if not p.is_file():
        raise ModelFileError(f"{p}: model file not found")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ModelFileError(f"{p}: cannot read the model file ({exc})") from None
    if len(data) < 8 or int.from_bytes(data[:4], "little") + 4 > len(data):
        raise ModelFileError(
            f"{p}: corrupt or truncated .mnn file ({len(data)} bytes; the root table lies outside)"
        )
    try:
        check_side_file(p, data)
        return _Reader(p, data, input_shapes).read()
    except KilnError:
        raise
    except RecursionError:
        raise ModelFileError(f"{p}: corrupt .mnn file (nesting too deep)") from None
    except Exception as exc:  # flatbuffers, numpy and the verifier fail in many ways on bad bytes
        raise ModelFileError(f"{p}: corrupt or invalid .mnn file ({type(exc).__name__}: {exc})") from None
