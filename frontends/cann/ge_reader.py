"""Decode a ``ge.proto.ModelDef`` MODEL_DEF partition into an :class:`OmGraph`.

Reads ``graph[0]`` (the main graph). Ops must come in topological order, as GE writes
them; control edges (``"op:-1"``) carry no data and are dropped. A Const's bytes come
from ``TensorDef.data`` when inline, else from WEIGHTS_DATA at ``merged_offset`` (an attr
of the descriptor, when present) or ``data_offset``, for ``weight_size`` bytes. ``DT_INT4``
descriptors read as int8 ones flagged ``int4`` (:mod:`schemas.cann.int4`).
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from compiler.ir.types import DType
from frontends.cann.decode import Decoder
from schemas.cann.codes import FORMAT_CODES, PROTO_DTYPE, dtype_from
from schemas.cann.generated import ge_ir_pb2 as ge
from schemas.cann.int4 import PROTO_INT4
from schemas.cann.om_graph import Attr, OmGraph, OmOp, TensorDesc

__all__ = ["parse_ge", "read_ge", "ge_attr"]

_LIST_KIND = {
    ge.AttrDef.ListValue.VT_LIST_INT: "li",
    ge.AttrDef.ListValue.VT_LIST_FLOAT: "lf",
    ge.AttrDef.ListValue.VT_LIST_STRING: "ls",
    ge.AttrDef.ListValue.VT_LIST_BOOL: "li",
}


def parse_ge(data: bytes) -> ge.ModelDef | None:
    """The ModelDef if ``data`` parses as one with at least one graph, else None."""
    try:
        model = ge.ModelDef.FromString(data)
    except (DecodeError, RecursionError, ValueError):
        return None
    return model if len(model.graph) else None


def ge_attr(a: ge.AttrDef) -> Attr | None:
    """A typed attribute, or None for kinds Kiln does not use (tensors, graphs, ...)."""
    kind = a.WhichOneof("value")
    if kind == "i":
        return Attr.i(a.i)
    if kind == "f":
        return Attr("f", float(a.f))
    if kind == "b":
        return Attr.b(a.b)
    if kind == "s":
        return Attr.s(a.s.decode("utf-8", errors="replace"))
    if kind != "list":
        return None
    lst = a.list
    k = _LIST_KIND.get(lst.val_type)
    if k is None:
        k = "lf" if len(lst.f) else "ls" if len(lst.s) else "li"
    if k == "lf":
        return Attr("lf", tuple(float(x) for x in lst.f))
    if k == "ls":
        return Attr.ls(s.decode("utf-8", errors="replace") for s in lst.s)
    return Attr.li(list(lst.i) if len(lst.i) or not len(lst.b) else [int(b) for b in lst.b])


def _desc(dec: Decoder, d: ge.TensorDescriptor, where: str) -> TensorDesc:
    fmt = d.layout or "ND"
    if fmt not in FORMAT_CODES:
        raise dec.fail(f"{where}: unknown tensor format {fmt!r}")
    if d.dtype == PROTO_INT4:  # no Kiln dtype: int8 values, stored two a byte
        return TensorDesc(DType.INT8, dec.shape(d.shape.dim, where), fmt, int4=True)
    return dec.desc(dtype_from(PROTO_DTYPE, d.dtype), d.dtype, d.shape.dim, fmt, where)


def _const(dec: Decoder, o: ge.OpDef, where: str) -> tuple[TensorDesc, object]:
    if "value" not in o.attr or o.attr["value"].WhichOneof("value") != "t":
        raise dec.fail(f"{where}: a Const without a tensor 'value' attribute")
    t = o.attr["value"].t
    d = _desc(dec, t.desc, f"{where} value")
    merged = t.desc.attr.get("merged_offset")
    offset = merged.i if merged is not None and merged.WhichOneof("value") == "i" else t.desc.data_offset
    size = t.desc.weight_size if t.desc.weight_size or not t.data else None
    return d, dec.array(d, t.data, offset, size, where)


def read_ge(model: ge.ModelDef, weights: bytes | None, source: str) -> OmGraph:
    """The OmGraph of ``model.graph[0]`` (checked; ModelFileError names ``source``)."""
    dec = Decoder(source, weights)
    g = model.graph[0]
    om = OmGraph(g.name or model.name or "main")
    for o in g.op:
        name = dec.name(o.name, o.type)
        where = f"op {name!r} ({o.type or '?'})"
        if not o.type:
            raise dec.fail(f"{where}: no op type")
        inputs = [dec.input(r, where) for r in o.input if not r.endswith(":-1")]
        outputs = [_desc(dec, d, f"{where} output {i}") for i, d in enumerate(o.output_desc)]
        attrs = {k: a for k in sorted(o.attr) if k != "value" and (a := ge_attr(o.attr[k])) is not None}
        op = OmOp(name, o.type, inputs, outputs, attrs)
        if o.type == "Const":
            d, value = _const(dec, o, where)
            if op.outputs and (op.outputs[0].dtype, op.outputs[0].shape) != (d.dtype, d.shape):
                raise dec.fail(f"{where}: output descriptor differs from its value's descriptor")
            op.outputs = [d]
            op.value = value  # type: ignore[assignment]
        if o.type == "NetOutput":
            om.output_names = [d.name for d in o.input_desc][: len(inputs)]
        om.ops.append(dec.add(op))
    return om
