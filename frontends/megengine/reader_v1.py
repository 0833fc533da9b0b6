"""Read an FBS V1 (``MGBC``/``MGBS``) flatbuffer into an :class:`MgeModel`.

Differences from V2: tensor values live out of band, before the flatbuffer, in
dump order (each after ``offset`` padding bytes); operators carry only a hashed
type id; and they list no output ids: the outputs of each operator take the
next variable ids in load order. An operator's output count is the length of
its ``output_name`` list when the file keeps names, else the count its class
is known to have (:data:`OUTPUT_COUNTS`, default 1).
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
from frontends.megengine.reader_v2 import union_members, version_text
from frontends.megengine.type_ids import class_of, family_of
from schemas.megengine.generated import schema_v1_generated as fb

__all__ = ["read_v1", "OUTPUT_COUNTS"]

OUTPUT_COUNTS: dict[str, int] = {"BatchNorm": 4}
"""Non-volatile outputs of multi-output families (holders of several tensors have one per tensor)."""

_HOLDERS = ("MultipleDeviceTensorHolder", "MultipleDeviceTensorWithFormatHolder")
_MEMBERS = union_members(fb.OperatorParam)


def _member(n: int) -> str:
    return _MEMBERS.get(n, f"OperatorParam({n})")


def _params(op: Any, buf: bytes) -> list[MgeParam]:
    params: list[MgeParam] = []
    tab = op.Param() if op.ParamType() else None
    params.append(param_of(_member(op.ParamType()), tab, buf) if tab is not None else MgeParam("", buf, 0))
    for j in range(vector_length(op.AdditionalParamsLength(), 4, buf, "additional_params")):
        extra = op.AdditionalParams(j)
        if extra is not None:
            params.append(param_of(_member(op.AdditionalParamsType(j)), extra._tab, buf))
    return params


class _Blob:
    """The out-of-band tensor values, consumed in dump order."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.cursor = 0

    def take(self, offset: int, size: int, what: str) -> bytes:
        start = self.cursor + offset
        end = start + size
        if end > len(self.data):
            raise ValueError(f"{what}: its {size} value bytes run past the tensor data section")
        self.cursor = end
        return self.data[start:end]


def _tensors(op: Any, buf: bytes, blob: _Blob, label: str) -> list[MgeTensor]:
    out = []
    for k in range(vector_length(op.TensorsLength(), 4, buf, f"opr {label!r} tensors")):
        t = required(op.Tensors(k), f"opr {label!r} tensor {k}")
        what = f"opr {label!r} tensor {k}"
        shape = read_shape(t, what)
        dtype = read_dtype(t.Dtype())
        if dtype is None:
            raise ValueError(f"{what} has no dtype")
        raw = blob.take(int(t.Offset()), int(t.DataSize()), what)
        value = tensor_value(raw, shape, dtype, what) if raw else None
        out.append(MgeTensor(text(t.Name()), shape, dtype, value))
    return out


def read_v1(buf: bytes, blob: bytes, kind: str) -> MgeModel:
    """Parse a V1 flatbuffer (size prefix removed) with its tensor data section."""
    g = fb.Graph.GetRootAs(buf, 0)
    values = _Blob(blob)
    oprs: list[MgeOpr] = []
    names: dict[int, str] = {}
    next_var = 0
    for i in range(vector_length(g.OprsLength(), 4, buf, "oprs")):
        op = required(g.Oprs(i), f"opr {i}")
        name = text(op.Name())
        label = name or f"#{i}"
        tid = int(op.TypeId())
        cls = class_of(tid)
        family = family_of(cls) if cls else None
        tensors = _tensors(op, buf, values, label)
        out_names = [
            text(op.OutputName(k))
            for k in range(vector_length(op.OutputNameLength(), 4, buf, f"opr {label!r} output names"))
        ]
        count = len(out_names) or (len(tensors) if cls in _HOLDERS else OUTPUT_COUNTS.get(family or "", 1))
        outputs = list(range(next_var, next_var + count))
        next_var += count
        for var, nm in zip(outputs, out_names, strict=False):
            if nm:
                names[var] = nm
        oprs.append(
            MgeOpr(
                index=i,
                type=cls or f"type_id {tid:#018x}",
                family=family,
                name=name,
                inputs=int_vector(op, "Inputs"),
                outputs=outputs,
                params=_params(op, buf),
                tensors=tensors,
                output_dtype=read_dtype(op.OutputDtype()),
            )
        )
    outputs_idx = []
    for i in range(vector_length(g.OutputVarsIdxLength(), 8, buf, "output_vars_idx")):
        outputs_idx.append((int(required(g.OutputVarsIdx(i), f"output {i}").CompactId()), ""))
    return MgeModel(f"FBS_V1 ({kind})", version_text(int(g.MgbVersion())), oprs, names, outputs_idx)
