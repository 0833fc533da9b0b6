"""Encode an :class:`OmGraph` as ``ge.proto.ModelDef`` (``--cann-schema ge``, the default).

Shaped like GE's own serializer (``ModelSerializeImp``; NOTES.md §2.1):

* ModelDef ``version = 2``, ``custom_version`` = the platform version, model attrs
  ``memory_size``, ``weight_size``, ``stream_num``, ``event_num``, ``label_num``, ``om_info_list``;
* one GraphDef whose ``input``/``output`` list ``"op:index"`` references;
* each OpDef with a sequential ``id``, its ``input`` references, an ``input_desc`` per input
  slot (equal to the producer's ``output_desc``; empty for an absent optional input), and
  its ``output_desc``; NetOutput's ``input_desc[i].name`` holds the public output name;
* each Const's ``value`` attr is a TensorDef whose ``desc.data_offset`` / ``desc.weight_size``
  point into WEIGHTS_DATA (512-byte aligned, :mod:`backends.cann.weights`); ``data`` is empty;
  an ``int4`` descriptor is ``DT_INT4`` with its values packed two a byte (:mod:`schemas.cann.int4`);
* descriptors carry the proto dtype, the format name and the attrs ATC writes
  (``origin_format``, ``format_for_int``, ``origin_shape``, ``origin_data_type``, ...).

Serialised with ``deterministic=True`` (map entries sorted), so the bytes repeat run to run.
"""

from __future__ import annotations

from backends.cann.weights import WeightsBlob
from schemas.cann.codes import FORMAT_CODES, PROTO_DTYPE
from schemas.cann.generated import ge_ir_pb2 as ge
from schemas.cann.int4 import PROTO_INT4, pack_int4
from schemas.cann.om_container import PLATFORM_VERSION
from schemas.cann.om_graph import Attr, OmGraph, TensorDesc

__all__ = ["write_ge", "set_ge_attr"]

_LIST_TYPES = {
    "li": ge.AttrDef.ListValue.VT_LIST_INT,
    "lf": ge.AttrDef.ListValue.VT_LIST_FLOAT,
    "ls": ge.AttrDef.ListValue.VT_LIST_STRING,
}


def set_ge_attr(target: ge.AttrDef, a: Attr) -> None:
    """Fill a ``ge.proto.AttrDef`` from a typed attribute."""
    v = a.value
    if a.kind == "i":
        target.i = int(v)  # type: ignore[arg-type]
    elif a.kind == "f":
        target.f = float(v)  # type: ignore[arg-type]
    elif a.kind == "b":
        target.b = bool(v)
    elif a.kind == "s":
        target.s = str(v).encode("utf-8")
    else:
        lst = target.list
        lst.val_type = _LIST_TYPES[a.kind]
        assert isinstance(v, tuple)
        if a.kind == "li":
            lst.i.extend(int(x) for x in v)
        elif a.kind == "lf":
            lst.f.extend(float(x) for x in v)
        else:
            lst.s.extend(str(x).encode("utf-8") for x in v)


def _desc(d: TensorDesc, name: str = "") -> ge.TensorDescriptor:
    code = PROTO_INT4 if d.int4 else PROTO_DTYPE[d.dtype]
    out = ge.TensorDescriptor(name=name, dtype=code, layout=d.format)  # type: ignore[arg-type]
    out.shape.SetInParent()
    out.shape.dim.extend(d.shape)
    out.size = d.nbytes
    out.real_dim_cnt = len(d.shape)
    out.device_type = "NPU"
    fmt = FORMAT_CODES[d.format]
    set_ge_attr(out.attr["origin_format"], Attr.s(d.format))
    set_ge_attr(out.attr["origin_format_for_int"], Attr.i(fmt))
    set_ge_attr(out.attr["format_for_int"], Attr.i(fmt))
    set_ge_attr(out.attr["origin_shape"], Attr.li(d.shape))
    set_ge_attr(out.attr["origin_shape_initialized"], Attr.b(True))
    set_ge_attr(out.attr["origin_data_type"], Attr.s(f"DT_{_dt_name(d)}"))
    return out


def _dt_name(d: TensorDesc) -> str:
    return ge.DataType.Name(PROTO_INT4 if d.int4 else PROTO_DTYPE[d.dtype]).removeprefix("DT_")


def write_ge(om: OmGraph) -> tuple[bytes, bytes]:
    """The MODEL_DEF bytes (a serialized ge.proto.ModelDef) and the WEIGHTS_DATA bytes."""
    blob = WeightsBlob()
    descs: dict[str, TensorDesc] = {}
    model = ge.ModelDef(name=om.name, version=2, custom_version=PLATFORM_VERSION)
    graph = model.graph.add(name=om.name)
    for op_id, op in enumerate(om.ops):
        o = graph.op.add(name=op.name, type=op.type, id=op_id)
        o.input.extend(op.inputs)
        for port, r in enumerate(op.inputs):
            if not r:
                o.input_desc.add()
                continue
            public = om.output_names[port] if op.type == "NetOutput" else ""
            o.input_desc.append(_desc(descs[r], public))
        if op.type == "Data":
            o.input_desc.append(_desc(op.outputs[0]))
            graph.input.append(f"{op.name}:0")
        for i, d in enumerate(op.outputs):
            o.output_desc.append(_desc(d))
            descs[f"{op.name}:{i}"] = d
        for key, a in op.attrs.items():
            set_ge_attr(o.attr[key], a)
        if op.type == "Const":
            assert op.value is not None
            raw = pack_int4(op.value) if op.outputs[0].int4 else op.value.tobytes()
            t = o.attr["value"].t
            t.desc.CopyFrom(_desc(op.outputs[0]))
            t.desc.weight_size = len(raw)
            t.desc.data_offset = blob.add(raw)
        if op.type == "NetOutput":
            graph.output.extend(op.inputs)
    weights = blob.data()
    for key, a in (
        ("memory_size", Attr.i(0)),
        ("weight_size", Attr.i(len(weights))),
        ("stream_num", Attr.i(1)),
        ("event_num", Attr.i(0)),
        ("label_num", Attr.i(0)),
        ("om_info_list", Attr.li((len(weights), 0, 0, 0, 0))),
    ):
        set_ge_attr(model.attr[key], a)
    return model.SerializeToString(deterministic=True), weights
