"""Read an FBS V2 (``mgv2``) flatbuffer into an :class:`MgeModel`.

Operators list their input and output variable ids explicitly; constants carry
their values inline. Variable names come from ``middle_tensors`` (indexed by
variable id), public output names from ``output_alias`` when present.
"""

from __future__ import annotations

from typing import Any

from frontends.megengine.fbs_fields import (
    int_vector,
    param_of,
    read_dtype,
    read_shape,
    required,
    tensor_value,
    text,
    vector_length,
)
from frontends.megengine.model import MgeModel, MgeOpr, MgeParam, MgeTensor
from frontends.megengine.type_ids import class_of, family_of
from schemas.megengine.generated import schema_v2_generated as fb

__all__ = ["read_v2", "union_members", "version_text"]


def union_members(union_cls: type) -> dict[int, str]:
    """The member names of a generated union class by type number."""
    return {v: k for k, v in vars(union_cls).items() if not k.startswith("_") and isinstance(v, int) and v}


_MEMBERS = union_members(fb.OperatorParam)


def version_text(v: int) -> str:
    """MegEngine's encoded version (e.g. 101300) as ``1.13.0``."""
    return f"{v // 100000}.{v // 100 % 1000}.{v % 100}" if 0 < v < 1_000_000 else str(v)


def _member(n: int) -> str:
    return _MEMBERS.get(n, f"OperatorParam({n})")


def _params(op: Any, buf: bytes) -> list[MgeParam]:
    params: list[MgeParam] = []
    tab = op.Param() if op.ParamType() else None
    params.append(param_of(_member(op.ParamType()), tab, buf) if tab is not None else MgeParam("", buf, 0))
    n = vector_length(op.AdditionalParamsLength(), 4, buf, "additional_params")
    for j in range(n):
        extra = op.AdditionalParams(j)
        if extra is not None:
            params.append(param_of(_member(op.AdditionalParamsType(j)), extra._tab, buf))
    return params


def _tensors(op: Any, buf: bytes, label: str) -> list[MgeTensor]:
    out = []
    for k in range(vector_length(op.TensorsLength(), 4, buf, f"opr {label!r} tensors")):
        t = required(op.Tensors(k), f"opr {label!r} tensor {k}")
        what = f"opr {label!r} tensor {k}"
        shape = read_shape(t, what)
        dtype = read_dtype(t.Dtype())
        if dtype is None:
            raise ValueError(f"{what} has no dtype")
        value = None
        if not t.DataIsNone():
            value = tensor_value(t.DataAsNumpy().tobytes(), shape, dtype, what)
        out.append(MgeTensor(text(t.Name()), shape, dtype, value))
    return out


def _type(op: Any) -> tuple[str, str | None]:
    """(class name for messages, converter family or None)."""
    tid = int(op.TypeId())
    name = text(op.Type()) or (class_of(tid) or "")
    if not name:
        return f"type_id {tid:#018x}", None
    return name, family_of(name)


def read_v2(buf: bytes) -> MgeModel:
    """Parse a V2 flatbuffer (size prefix removed). Raises ValueError/struct.error/... on corrupt data."""
    m = fb.Model.GetRootAs(buf, 0)
    names: dict[int, str] = {}
    for i in range(vector_length(m.MiddleTensorsLength(), 4, buf, "middle_tensors")):
        mt = m.MiddleTensors(i)
        if mt is not None and mt.Name() is not None:
            names[i] = text(mt.Name())
    oprs = []
    for i in range(vector_length(m.OprsLength(), 4, buf, "oprs")):
        op = required(m.Oprs(i), f"opr {i}")
        name = text(op.Name())
        label = name or f"#{i}"
        type_name, family = _type(op)
        oprs.append(
            MgeOpr(
                index=i,
                type=type_name,
                family=family,
                name=name,
                inputs=int_vector(op, "Inputs"),
                outputs=int_vector(op, "Outputs"),
                params=_params(op, buf),
                tensors=_tensors(op, buf, label),
                output_dtype=read_dtype(op.OutputDtype()),
            )
        )
    alias = {}
    for i in range(vector_length(m.OutputAliasLength(), 4, buf, "output_alias")):
        a = required(m.OutputAlias(i), f"output alias {i}")
        alias[int(a.Id())] = text(a.Name())
    outputs = []
    for i in range(vector_length(m.OutputVarsIdxLength(), 4, buf, "output_vars_idx")):
        var = int(required(m.OutputVarsIdx(i), f"output {i}").CompactId())
        outputs.append((var, alias.get(var, "")))
    meta = {}
    md = m.Metadata()
    if md is not None:
        meta["optimize_options"] = hex(int(md.OptimizeOptions()))
    return MgeModel("FBS_V2", version_text(int(m.MgeVersion())), oprs, names, outputs, meta)
