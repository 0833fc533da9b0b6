"""Decode the seed's ``domi.ModelDef`` MODEL_DEF partition into an :class:`OmGraph`.

The inverse of ``backends/cann/domi_writer.py``: domi op types become GE types again
(``domi_table.py``), typed parameters become GE attributes, and constants held in typed
parameters (``ABSORBED``) become Const ops placed just before their consumer. The byte
formats of the quantization fields are those documented in schemas/cann/README.md.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from frontends.cann.domi_params import PARAMS, DomiDecoder
from schemas.cann.domi_table import GE_TYPE, MODE_ACTIVATION, MODE_ELTWISE
from schemas.cann.generated import om_pb2 as domi
from schemas.cann.om_graph import Attr, OmGraph, OmOp, ref

__all__ = ["parse_domi", "read_domi"]


def parse_domi(data: bytes) -> domi.ModelDef | None:
    """The ModelDef if ``data`` parses as a domi model with at least one op, else None."""
    try:
        model = domi.ModelDef.FromString(data)
    except (DecodeError, RecursionError, ValueError):
        return None
    return model if len(model.op) else None


def domi_attr(a: domi.AttrDef) -> Attr | None:
    """A typed attribute, or None for kinds Kiln does not use."""
    kind = a.WhichOneof("value")
    if kind in ("i", "u"):
        return Attr.i(getattr(a, kind))
    if kind == "f":
        return Attr("f", float(a.f))
    if kind == "b":
        return Attr.b(a.b)
    if kind == "s":
        return Attr.s(a.s)
    if kind != "list":
        return None
    lst = a.list
    if len(lst.f):
        return Attr("lf", tuple(float(x) for x in lst.f))
    if len(lst.s):
        return Attr.ls(lst.s)
    return Attr.li(list(lst.i) if len(lst.i) or not len(lst.b) else [int(b) for b in lst.b])


def _ge_type(o: domi.OpDef) -> str:
    if o.type == "Eltwise":
        return MODE_ELTWISE.get(o.eltwise_param.mode, "Eltwise")
    if o.WhichOneof("op_params") == "activation_param":
        return MODE_ACTIVATION.get(o.activation_param.mode, o.type)
    return GE_TYPE.get(o.type, o.type)


def read_domi(model: domi.ModelDef, weights: bytes | None, source: str) -> OmGraph:
    """The OmGraph of a domi model (checked; ModelFileError names ``source``)."""
    dec = DomiDecoder(source, weights)
    om = OmGraph(model.name or "main")
    for o in model.op:
        name = dec.name(o.name, o.type)
        kind = _ge_type(o)
        where = f"op {name!r} ({o.type or '?'})"
        if not o.type:
            raise dec.fail(f"{where}: no op type")
        if len(o.src_index) != len(o.src_name):
            raise dec.fail(f"{where}: {len(o.src_name)} src_name entries but {len(o.src_index)} src_index")
        attrs = {k: a for k in sorted(o.attr) if (a := domi_attr(o.attr[k])) is not None}
        absorbed: dict[int, OmOp] = {}
        params = PARAMS.get(kind)
        if params is not None:
            absorbed = params(dec, o, attrs, name)
        inputs: list[str] = []
        if any(p < len(o.src_name) and o.src_name[p] for p in absorbed):
            raise dec.fail(f"{where}: an input port is given both by src_name and by typed parameters")
        # Kiln writes one src entry per input port; older writers list only the data inputs,
        # with the weights in typed parameters after them.
        ports = max([len(o.src_name), *(p + 1 for p in absorbed)])
        for port in range(ports):
            src = o.src_name[port] if port < len(o.src_name) else ""
            if src:
                inputs.append(dec.input(f"{src}:{o.src_index[port]}", where))
            elif port in absorbed:
                const = absorbed[port]
                const.name = dec.name(
                    const.name if const.name not in dec.outputs else f"{name}/{port}", "Const"
                )
                om.ops.append(dec.add(const))
                inputs.append(ref(const.name))
            else:
                inputs.append("")
        outputs = [dec.tensor(d, f"{where} output {i}") for i, d in enumerate(o.output_desc)]
        op = OmOp(name, kind, inputs, outputs, attrs)
        if kind == "Const":
            if len(o.weights) != 1 or len(outputs) > 1:
                raise dec.fail(f"{where}: a Const holds exactly one WeightDef")
            const = dec.weight(o.weights[0], name)
            if outputs and (outputs[0].dtype, outputs[0].shape) != (
                const.outputs[0].dtype,
                const.outputs[0].shape,
            ):
                raise dec.fail(f"{where}: output descriptor differs from its weight")
            op.outputs, op.value = const.outputs, const.value
        if kind == "NetOutput":
            names = attrs.pop("output_names", None)
            om.output_names = list(names.value) if names is not None and names.kind == "ls" else []  # type: ignore[arg-type]
        om.ops.append(dec.add(op))
    return om
