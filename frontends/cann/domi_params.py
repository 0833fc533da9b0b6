"""Turn the seed's typed parameters back into GE attributes and Const inputs.

``PARAMS[ge_type](decoder, opdef, attrs, name)`` adds the GE attributes a typed parameter
message carries to ``attrs`` and returns the constants it held, by input port. It is the
inverse of the handlers in ``backends/cann/domi_writer.py``; the byte formats of
``QuantizeFactor`` (little-endian float32 scales, one int8 byte per offset) are documented
in schemas/cann/README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from compiler.ir.types import DType
from frontends.cann.decode import Decoder
from schemas.cann.codes import DOMI_DTYPE, DOMI_FORMAT_CODES, dtype_from
from schemas.cann.generated import om_pb2 as domi
from schemas.cann.om_graph import Attr, OmOp, TensorDesc

__all__ = ["PARAMS", "DomiDecoder"]

_FORMAT_NAMES = {v: k for k, v in DOMI_FORMAT_CODES.items()}
_F32, _I64, _U64 = DType.FLOAT32, DType.INT64, DType.UINT64


class DomiDecoder(Decoder):
    """The shared decoder plus the domi encodings of descriptors and weights."""

    def tensor(self, d: domi.TensorDescriptor, where: str) -> TensorDesc:
        """A TensorDescriptor's description."""
        fmt = _FORMAT_NAMES.get(d.format)
        if fmt is None:
            raise self.fail(f"{where}: unknown domi format {d.format}")
        return self.desc(dtype_from(DOMI_DTYPE, d.data_type), d.data_type, d.dim, fmt, where)

    def weight(self, w: domi.WeightDef, name: str) -> OmOp:
        """A Const op for a WeightDef."""
        fmt = _FORMAT_NAMES.get(w.format)
        if fmt is None:
            raise self.fail(f"weight {name!r}: unknown domi format {w.format}")
        d = self.desc(dtype_from(DOMI_DTYPE, w.data_type), w.data_type, w.shape.dim, fmt, f"weight {name!r}")
        value = self.array(d, w.data, w.data_offset, None, f"weight {name!r}")
        return OmOp(name, "Const", [], [d], {}, value)


Params = Callable[[DomiDecoder, domi.OpDef, dict[str, Attr], str], dict[int, OmOp]]


def _weights(dec: DomiDecoder, fields: Mapping[int, tuple[object, str]], name: str) -> dict[int, OmOp]:
    out: dict[int, OmOp] = {}
    for port, (msg, field) in fields.items():
        if msg.HasField(field):  # type: ignore[attr-defined]
            out[port] = dec.weight(getattr(msg, field), f"{name}/{field}")
    return out


def _floats(dec: DomiDecoder, raw: bytes, where: str, count: int | None = None) -> tuple[float, ...]:
    if len(raw) % 4 or (count is not None and len(raw) != 4 * count) or not raw:
        raise dec.fail(f"{where}: scale_value holds {len(raw)} bytes, not float32 values")
    return tuple(float(x) for x in np.frombuffer(raw, "<f4"))


def _offset(dec: DomiDecoder, raw: bytes, where: str) -> int:
    if len(raw) not in (0, 1):
        raise dec.fail(f"{where}: offset_data_value holds {len(raw)} bytes, not one int8")
    return int(np.frombuffer(raw, np.int8)[0]) if raw else 0


def _weighted_quant(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], where: str) -> None:
    if not o.HasField("quantize_factor"):
        return
    qp = o.quantize_factor.quantize_param
    attrs["_kiln_weight_scale"] = Attr("lf", _floats(dec, qp.scale_value, f"{where} quantize_param"))
    attrs["offset_x"] = Attr.i(_offset(dec, qp.offset_data_value, f"{where} quantize_param"))


def _conv(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    cp = o.convolution_param
    attrs["strides"] = Attr.li((1, 1, *cp.stride))
    attrs["pads"] = Attr.li(cp.pad)
    attrs["dilations"] = Attr.li((1, 1, *cp.dilation))
    attrs["groups"] = Attr.i(cp.group)
    _weighted_quant(dec, o, attrs, f"op {name!r}")
    return _weights(dec, {1: (cp, "filter"), 2: (cp, "bias")}, name)


def _fc(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    fp = o.full_connection_param
    attrs["num_output"] = Attr.i(fp.num_output)
    _weighted_quant(dec, o, attrs, f"op {name!r}")
    return _weights(dec, {1: (fp, "filter"), 2: (fp, "bias")}, name)


def _pool(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    pp = o.pooling_param
    attrs.update(
        mode=Attr.i(pp.mode),
        global_pooling=Attr.b(pp.global_pooling),
        window=Attr.li(pp.window),
        stride=Attr.li(pp.stride),
        pad=Attr.li(pp.pad),
        ceil_mode=Attr.i(0 if pp.ceil_mode else 1),
    )
    return {}


def _bn(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    bp = o.batchnorm_param
    attrs.update(
        epsilon=Attr.f(bp.epsilon), use_global_stats=Attr.b(bp.use_global_stats), mode=Attr.i(bp.mode)
    )
    fields = {1: (bp, "estimated_mean"), 2: (bp, "estimated_variance"), 4: (bp, "scale"), 5: (bp, "bias")}
    out = _weights(dec, fields, name)
    if len(o.src_name) > 3 and not o.src_name[3]:
        momentum = np.array(bp.moving_average_fraction, np.float32)
        out[3] = OmOp(f"{name}/momentum", "Const", [], [TensorDesc(_F32, ())], {}, momentum)
    return out


def _reshape(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    rp = o.reshape_param
    attrs.update(axis=Attr.i(rp.axis), num_axes=Attr.i(rp.num_axes))
    if not rp.HasField("shape"):
        return {}
    shape = np.array(list(rp.shape.dim), np.int64)
    dims = dec.shape([len(shape)], f"op {name!r} shape")
    return {1: OmOp(f"{name}/shape", "Const", [], [TensorDesc(_I64, dims)], {}, shape)}


def _activation(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    ap = o.activation_param
    if ap.mode == 5:
        attrs["negative_slope"] = Attr.f(ap.coef)
    if ap.mode == 3 and ap.coef != 6.0:
        raise dec.fail(f"op {name!r}: clipped ReLU with coef {ap.coef} (only ReLU6 is supported)")
    return {}


def _permute(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    if "order" in attrs:
        attrs["perm"] = attrs.pop("order")
    return {}


def _scale_mode(qf: domi.QuantizeFactor) -> Attr:
    return Attr.b(qf.scale_mode == domi.SQRT_MODE)


def _quant(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    qp = o.quantize_factor.quantize_param
    where = f"op {name!r} quantize_param"
    (step,) = _floats(dec, qp.scale_value, where, 1)
    if step == 0.0 or not np.isfinite(step):
        raise dec.fail(f"{where}: scale {step}")
    attrs.update(
        scale=Attr.f(float(np.float32(1.0) / np.float32(step))),
        _kiln_scale=Attr("f", step),
        offset=Attr.f(_offset(dec, qp.offset_data_value, where)),
        sqrt_mode=_scale_mode(qp),
    )
    return {}


def _antiquant(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    dp = o.quantize_factor.dequantize_param
    where = f"op {name!r} dequantize_param"
    (scale,) = _floats(dec, dp.scale_value, where, 1)
    attrs.update(
        scale=Attr("f", scale),
        offset=Attr.f(-_offset(dec, dp.offset_data_value, where)),
        sqrt_mode=_scale_mode(dp),
    )
    return {}


def _dequant(dec: DomiDecoder, o: domi.OpDef, attrs: dict[str, Attr], name: str) -> dict[int, OmOp]:
    dp = o.quantize_factor.dequantize_param
    attrs["sqrt_mode"] = _scale_mode(dp)
    if not dp.scale_value:
        return {}
    scales = np.array(_floats(dec, dp.scale_value, f"op {name!r} dequantize_param"), np.float32)
    bits = scales.view(np.uint32).astype(np.uint64)
    return {1: OmOp(f"{name}/deq_scale", "Const", [], [TensorDesc(_U64, (len(bits),))], {}, bits)}


PARAMS: dict[str, Params] = {
    "Conv2D": _conv,
    "FullyConnection": _fc,
    "Pooling": _pool,
    "BNInference": _bn,
    "Reshape": _reshape,
    "Relu6": _activation,
    "LeakyRelu": _activation,
    "TransposeD": _permute,
    "AscendQuant": _quant,
    "AscendAntiQuant": _antiquant,
    "AscendDequant": _dequant,
}
