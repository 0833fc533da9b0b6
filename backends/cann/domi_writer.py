"""Encode an :class:`OmGraph` as the seed's ``domi.ModelDef`` (``--cann-schema domi``).

One ``OpDef`` per op, in order, each input named by ``src_name``/``src_index`` (one entry
per GE input slot; empty name and index -1 for an absent input or one whose constant moved
into typed parameters). Types and typed parameters follow ``domi_table.py``; constants not
absorbed become ``Const`` ops holding one ``WeightDef``. A WeightDef is inline (``data``)
up to ``INLINE_LIMIT`` bytes, else a ``data_offset`` into WEIGHTS_DATA. Quantized ops fill
``QuantizeFactorParams`` and int8 descriptors ``AllOffsetQuantizeInfo`` as documented in
schemas/cann/README.md ("domi byte formats").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from backends.cann.weights import WeightsBlob
from compiler.errors import ConversionError
from schemas.cann.codes import DOMI_DTYPE, DOMI_FORMAT_CODES
from schemas.cann.domi_table import (
    ABSORBED,
    ACTIVATION_MODE,
    CONV_PARAM_ATTRS,
    DOMI_TYPE,
    ELTWISE_MODE,
    INLINE_LIMIT,
    POOL_PARAM_ATTRS,
)
from schemas.cann.generated import om_pb2 as domi
from schemas.cann.om_graph import Attr, OmGraph, OmOp, TensorDesc, split_ref

__all__ = ["write_domi", "set_domi_attr", "f32_bytes", "i8_byte"]


def set_domi_attr(target: domi.AttrDef, a: Attr) -> None:
    """Fill a ``domi.AttrDef`` from a typed attribute."""
    v = a.value
    if a.kind == "i":
        target.i = int(v)  # type: ignore[arg-type]
    elif a.kind == "f":
        target.f = float(v)  # type: ignore[arg-type]
    elif a.kind == "b":
        target.b = bool(v)
    elif a.kind == "s":
        target.s = str(v)
    else:
        assert isinstance(v, tuple)
        lst = target.list
        if a.kind == "li":
            lst.i.extend(int(x) for x in v)
        elif a.kind == "lf":
            lst.f.extend(float(x) for x in v)
        else:
            lst.s.extend(str(x) for x in v)


def f32_bytes(values: object) -> bytes:
    """Little-endian float32 bytes (the format of every domi ``scale_value``)."""
    return np.ascontiguousarray(values, dtype="<f4").reshape(-1).tobytes()


def i8_byte(value: float, where: str) -> bytes:
    """One int8 byte (the format of every domi ``offset_data_value``)."""
    v = int(round(float(value)))
    if v != float(value) or not -128 <= v <= 127:
        raise ConversionError(f"CANN backend (domi): {where}: offset {value} is not an int8 value")
    return np.int8(v).tobytes()


def _desc(d: TensorDesc, where: str) -> domi.TensorDescriptor:
    d = replace(d, int4=False)  # domi has no 4-bit type: such levels take a byte each
    if d.dtype not in DOMI_DTYPE:
        raise ConversionError(f"CANN backend (domi): {where}: dtype {d.dtype.name} has no domi code")
    size = d.nbytes if d.nbytes < 2**32 else 0
    return domi.TensorDescriptor(
        format=DOMI_FORMAT_CODES.get(d.format, 2),
        data_type=DOMI_DTYPE[d.dtype],
        dim=list(d.shape),
        size=size,
        real_dim_cnt=len(d.shape),
    )


class _DomiWriter:
    def __init__(self, om: OmGraph) -> None:
        self.om = om
        self.blob = WeightsBlob()
        self.ops = om.op_map()
        self.users = om.users()
        self.descs = {f"{op.name}:{i}": d for op in om.ops for i, d in enumerate(op.outputs)}

    def weight(self, op: OmOp) -> domi.WeightDef:
        assert op.value is not None
        d = op.outputs[0]
        if d.dtype not in DOMI_DTYPE:
            raise ConversionError(
                f"CANN backend (domi): Const {op.name!r}: dtype {d.dtype.name} has no domi code"
            )
        w = domi.WeightDef(format=DOMI_FORMAT_CODES.get(d.format, 2), data_type=DOMI_DTYPE[d.dtype])
        w.shape.SetInParent()
        w.shape.dim.extend(d.shape)
        raw = op.value.tobytes()
        if len(raw) <= INLINE_LIMIT:
            w.data = raw
        else:
            w.data_offset = self.blob.add(raw)
        return w

    def const_at(self, op: OmOp, port: int) -> OmOp | None:
        r = op.inputs[port] if port < len(op.inputs) else ""
        src = self.ops.get(split_ref(r)[0]) if r else None
        return src if src is not None and src.type == "Const" else None

    def absorbed(self, op: OmOp) -> dict[int, OmOp]:
        ports: Mapping[int, str] = ABSORBED.get(op.type, {})
        out = {p: c for p in ports if (c := self.const_at(op, p)) is not None}
        if op.type == "BNInference" and 3 in out:
            m = out[3]
            if m.value is None or m.value.size != 1 or m.value.dtype != np.float32:
                del out[3]
        if op.type == "AscendDequant" and 1 in out:
            v = out[1].value
            if v is None or v.dtype != np.uint64 or v.ndim != 1 or np.any(v >> np.uint64(32)):
                del out[1]
        return out

    def skipped_consts(self) -> set[str]:
        """Const ops that every consumer absorbs into its typed parameters."""
        absorbed_refs: dict[str, int] = {}
        for op in self.om.ops:
            for port in self.absorbed(op):
                r = op.inputs[port]
                absorbed_refs[r] = absorbed_refs.get(r, 0) + 1
        return {
            split_ref(r)[0]
            for r, n in absorbed_refs.items()
            if n == len(self.users.get(r, [])) and r not in self.ops_outputs()
        }

    def ops_outputs(self) -> set[str]:
        net = [op for op in self.om.ops if op.type == "NetOutput"]
        return set(net[0].inputs) if net else set()

    def write(self) -> tuple[bytes, bytes]:
        model = domi.ModelDef(name=self.om.name, version=1, stream_num=1, target_type=domi.MINI)
        skip = self.skipped_consts()
        for op in self.om.ops:
            if op.name in skip:
                continue
            self.op(model.op.add(name=op.name, id=len(model.op)), op)
        weights = self.blob.data()
        model.weight_size = len(weights)
        return model.SerializeToString(deterministic=True), weights

    def op(self, o: domi.OpDef, op: OmOp) -> None:
        attrs = dict(op.attrs)
        absorbed = self.absorbed(op)
        for port, r in enumerate(op.inputs):
            if r and port not in absorbed:
                src, idx = split_ref(r)
                o.src_name.append(src)
                o.src_index.append(idx)
                o.input_name.append(src)
                o.input_desc.append(_desc(self.descs[r], op.name))
            else:
                o.src_name.append("")
                o.src_index.append(-1)
                o.input_name.append("")
                o.input_desc.add()
        o.output_desc.extend(_desc(d, op.name) for d in op.outputs)
        o.type = DOMI_TYPE.get(op.type, op.type)
        if op.type == "Const":
            o.weights.append(self.weight(op))
        handler = _HANDLERS.get(op.type)
        if handler is not None:
            handler(self, o, op, attrs, absorbed)
        if op.type == "NetOutput":
            attrs["output_names"] = Attr.ls(self.om.output_names)
        for key in sorted(attrs):
            set_domi_attr(o.attr[key], attrs[key])


Handler = Callable[[_DomiWriter, domi.OpDef, OmOp, dict[str, Attr], dict[int, OmOp]], None]


def _pop(attrs: dict[str, Attr], key: str, default: object) -> object:
    a = attrs.pop(key, None)
    return default if a is None else a.value


def _int(attrs: dict[str, Attr], key: str, default: int) -> int:
    v = _pop(attrs, key, default)
    assert isinstance(v, int)
    return int(v)


def _float(attrs: dict[str, Attr], key: str, default: float) -> float:
    v = _pop(attrs, key, default)
    assert isinstance(v, int | float)
    return float(v)


def _ints(attrs: dict[str, Attr], key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    v = _pop(attrs, key, default)
    assert isinstance(v, tuple)
    return tuple(int(x) for x in v)


def _weighted_quant(o: domi.OpDef, attrs: dict[str, Attr]) -> None:
    if "_kiln_weight_scale" not in attrs:
        return
    scales = _pop(attrs, "_kiln_weight_scale", ())
    offset = _pop(attrs, "offset_x", 0)
    assert isinstance(scales, tuple) and isinstance(offset, int)
    qf = o.quantize_factor
    qf.quantize_algo = domi.HALF_OFFSET_ALGO if offset else domi.NON_OFFSET_ALGO
    qf.scale_type = domi.VECTOR_SCALE if len(scales) > 1 else domi.SCALAR_SCALE
    qf.quantize_param.scale_mode = domi.NORMAL_MODE
    qf.quantize_param.scale_value = f32_bytes(scales)
    qf.quantize_param.offset_data_value = i8_byte(offset, o.name)


def _conv(w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]) -> None:
    _weighted_quant(o, attrs)
    cp = o.convolution_param
    cp.mode = 1  # CROSS_CORRELATION
    cp.group = _int(attrs, "groups", 1)
    filt = w.descs.get(op.inputs[1]) if len(op.inputs) > 1 and op.inputs[1] else None
    if filt is not None:
        cp.num_output = filt.shape[0]
        cp.kernel.extend(filt.shape[2:])
    cp.pad.extend(_ints(attrs, "pads", (0, 0, 0, 0)))
    cp.stride.extend(_ints(attrs, "strides", (1, 1, 1, 1))[2:])
    cp.dilation.extend(_ints(attrs, "dilations", (1, 1, 1, 1))[2:])
    assert CONV_PARAM_ATTRS.isdisjoint(attrs)
    if 1 in absorbed:
        cp.filter.CopyFrom(w.weight(absorbed[1]))
    if 2 in absorbed:
        cp.bias.CopyFrom(w.weight(absorbed[2]))


def _fc(w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]) -> None:
    _weighted_quant(o, attrs)
    fp = o.full_connection_param
    fp.num_output = _int(attrs, "num_output", 0)
    if 1 in absorbed:
        fp.filter.CopyFrom(w.weight(absorbed[1]))
    if 2 in absorbed:
        fp.bias.CopyFrom(w.weight(absorbed[2]))


def _pool(w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]) -> None:
    pp = o.pooling_param
    pp.mode = _int(attrs, "mode", 0)
    pp.global_pooling = bool(_pop(attrs, "global_pooling", False))
    pp.window.extend(_ints(attrs, "window", (1, 1)))
    pp.stride.extend(_ints(attrs, "stride", (1, 1)))
    pp.pad.extend(_ints(attrs, "pad", (0, 0, 0, 0)))
    pp.ceil_mode = _pop(attrs, "ceil_mode", 0) == 0  # GE: 0 = ceil; domi: true = ceil
    assert POOL_PARAM_ATTRS.isdisjoint(attrs)


def _bn(w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]) -> None:
    bp = o.batchnorm_param
    bp.mode = _int(attrs, "mode", 1)
    bp.epsilon = _float(attrs, "epsilon", 1e-5)
    bp.use_global_stats = bool(_pop(attrs, "use_global_stats", True))
    for port, field in ((1, "estimated_mean"), (2, "estimated_variance"), (4, "scale"), (5, "bias")):
        if port in absorbed:
            getattr(bp, field).CopyFrom(w.weight(absorbed[port]))
    if 3 in absorbed:
        value = absorbed[3].value
        assert value is not None
        bp.moving_average_fraction = float(value.reshape(()))


def _reshape(
    w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]
) -> None:
    rp = o.reshape_param
    rp.axis = _int(attrs, "axis", 0)
    rp.num_axes = _int(attrs, "num_axes", -1)
    if 1 in absorbed and absorbed[1].value is not None and absorbed[1].value.ndim == 1:
        rp.shape.SetInParent()
        rp.shape.dim.extend(int(d) for d in absorbed[1].value)
    elif 1 in absorbed:
        raise ConversionError(f"CANN backend (domi): Reshape {op.name!r}: its shape is not a 1-D constant")


def _activation(
    w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]
) -> None:
    ap = o.activation_param
    ap.mode = ACTIVATION_MODE[op.type]
    if op.type == "Relu6":
        ap.coef = 6.0
    if op.type == "LeakyRelu":
        ap.coef = _float(attrs, "negative_slope", 0.0)


def _softmax(
    w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]
) -> None:
    o.softmax_param.algo = 1  # ACCURATE
    o.softmax_param.mode = 1  # CHANNEL; the exact axes stay in attr "axes"


def _eltwise(
    w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]
) -> None:
    refs = op.inputs
    if len(refs) != 2 or not all(refs) or any(w.const_at(op, p) is not None for p in (0, 1)):
        return
    if w.descs[refs[0]].shape != w.descs[refs[1]].shape:
        return
    o.type = "Eltwise"
    o.eltwise_param.mode = ELTWISE_MODE[op.type]


def _permute(
    w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]
) -> None:
    attrs["order"] = attrs.pop("perm", Attr.li(()))


def _quant(
    w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]
) -> None:
    inv = _float(attrs, "scale", 1.0)
    step = _float(attrs, "_kiln_scale", float(np.float32(1.0) / np.float32(inv)))
    offset = _float(attrs, "offset", 0.0)
    qf = o.quantize_factor
    qf.quantize_algo = domi.HALF_OFFSET_ALGO if offset else domi.NON_OFFSET_ALGO
    qf.scale_type = domi.SCALAR_SCALE
    qf.quantize_param.scale_mode = domi.SQRT_MODE if _pop(attrs, "sqrt_mode", False) else domi.NORMAL_MODE
    qf.quantize_param.scale_value = f32_bytes([step])
    qf.quantize_param.offset_data_value = i8_byte(offset, op.name)
    o.output_desc[0].alloffset_quantize_info.scale = step
    o.output_desc[0].alloffset_quantize_info.offset = int(offset)


def _antiquant(
    w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]
) -> None:
    scale = _float(attrs, "scale", 1.0)
    zero = -_float(attrs, "offset", 0.0)
    qf = o.quantize_factor
    qf.quantize_algo = domi.HALF_OFFSET_ALGO if zero else domi.NON_OFFSET_ALGO
    qf.scale_type = domi.SCALAR_SCALE
    qf.dequantize_param.scale_mode = domi.SQRT_MODE if _pop(attrs, "sqrt_mode", False) else domi.NORMAL_MODE
    qf.dequantize_param.scale_value = f32_bytes([scale])
    qf.dequantize_param.offset_data_value = i8_byte(zero, op.name)
    o.input_desc[0].alloffset_quantize_info.scale = scale
    o.input_desc[0].alloffset_quantize_info.offset = int(zero)


def _dequant(
    w: _DomiWriter, o: domi.OpDef, op: OmOp, attrs: dict[str, Attr], absorbed: dict[int, OmOp]
) -> None:
    qf = o.quantize_factor
    qf.dequantize_param.scale_mode = domi.SQRT_MODE if _pop(attrs, "sqrt_mode", False) else domi.NORMAL_MODE
    if 1 in absorbed:
        bits = absorbed[1].value
        assert bits is not None
        qf.scale_type = domi.VECTOR_SCALE if bits.size > 1 else domi.SCALAR_SCALE
        qf.dequantize_param.scale_value = bits.astype(np.uint32).view("<f4").tobytes()


_HANDLERS: dict[str, Handler] = {
    "Conv2D": _conv,
    "FullyConnection": _fc,
    "Pooling": _pool,
    "BNInference": _bn,
    "Reshape": _reshape,
    "SoftmaxV2": _softmax,
    "TransposeD": _permute,
    "AscendQuant": _quant,
    "AscendAntiQuant": _antiquant,
    "AscendDequant": _dequant,
    **{t: _activation for t in ACTIVATION_MODE},
    **{t: _eltwise for t in ELTWISE_MODE},
}


def write_domi(om: OmGraph) -> tuple[bytes, bytes]:
    """The MODEL_DEF bytes (a serialized domi.ModelDef) and the WEIGHTS_DATA bytes."""
    return _DomiWriter(om).write()
