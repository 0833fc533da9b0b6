"""Write small FBS V2 ``.mge`` models for tests (ops the shared fixtures do not hold).

Built with the generated flatbuffers builders; the layout is the one MegEngine
writes (a size-prefixed ``mgv2`` Model, operators over integer variable ids,
constants inline). Example::

    w = MgeWriter()
    x = w.input("data", (1, 3, 8, 8))
    y = w.op("Elemwise", [x], param=w.param("Elemwise", Mode=E.SIGMOID))
    path.write_bytes(w.finish([y]))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np

from frontends.megengine.type_ids import type_id
from schemas.megengine.generated import dtype_generated as fd
from schemas.megengine.generated import params_generated as P
from schemas.megengine.generated import schema_v2_generated as s2

__all__ = ["MgeWriter", "DTYPE_CODES"]

DTYPE_CODES = {"float32": 0, "uint8": 1, "int8": 2, "int16": 3, "int32": 4, "bool": 18}
_VERSION_2 = {"Host2DeviceCopy", "ImmutableTensor", "ConvBiasForward", "Convolution"}

ParamFn = Callable[[flatbuffers.Builder], tuple[int, int]]


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: tuple[int, float | None]  # (DTypeEnum code, scale)
    data: bytes | None


@dataclass
class _Op:
    type: str
    name: str
    inputs: list[int]
    outputs: list[int]
    param: ParamFn | None
    tensors: list[_Tensor] = field(default_factory=list)
    output_dtype: tuple[int, float | None] | None = None


class MgeWriter:
    """Collects operators, then serializes them with :meth:`finish`."""

    def __init__(self) -> None:
        self.ops: list[_Op] = []
        self.next_var = 0

    def _new(self, n: int) -> list[int]:
        out = list(range(self.next_var, self.next_var + n))
        self.next_var += n
        return out

    def op(
        self,
        type_name: str,
        inputs: Sequence[int],
        param: ParamFn | None = None,
        *,
        outputs: int = 1,
        name: str = "",
        output_dtype: tuple[int, float | None] | None = None,
    ) -> int:
        """Add an operator; returns its last output variable."""
        outs = self._new(outputs)
        self.ops.append(_Op(type_name, name or f"{type_name}{len(self.ops)}", list(inputs), outs, param))
        self.ops[-1].output_dtype = output_dtype
        return outs[-1]

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> int:
        """A graph input (float32 unless ``dtype`` names another key of DTYPE_CODES)."""
        v = self.op("Host2DeviceCopy", [], self.param("Host2DeviceCopy"), name=name)
        self.ops[-1].tensors.append(_Tensor(name, tuple(shape), (DTYPE_CODES[dtype], None), None))
        return v

    def const(self, array: Any, *, scale: float | None = None, code: int | None = None) -> int:
        """An ImmutableTensor; ``scale`` with ``code`` marks a quantized type (13 = QuantizedS8...)."""
        arr = np.ascontiguousarray(array)
        dt = (code if code is not None else DTYPE_CODES[arr.dtype.name], scale)
        v = self.op("ImmutableTensor", [])
        self.ops[-1].tensors.append(
            _Tensor("", arr.shape, dt, arr.astype(arr.dtype.newbyteorder("<")).tobytes())
        )
        return v

    @staticmethod
    def param(table: str, **fields: Any) -> ParamFn:
        """A param table of ``params.fbs`` with the given fields (generated ``Add<Field>`` names)."""
        member = getattr(s2.OperatorParam, f"param_{table}")

        def build(b: flatbuffers.Builder) -> tuple[int, int]:
            vectors = {}
            for k, v in fields.items():
                if isinstance(v, list):  # an int vector (Dimshuffle pattern)
                    vectors[k] = b.CreateNumpyVector(np.asarray(v, dtype=np.int32))
            getattr(P, f"{table}Start")(b)
            for k, v in fields.items():
                getattr(P, f"{table}Add{k}")(b, vectors.get(k, v))
            return member, getattr(P, f"{table}End")(b)

        return build

    @staticmethod
    def struct_param(table: str, field_name: str, create: str, items: Sequence[Sequence[Any]]) -> ParamFn:
        """A param table holding one vector of structs (IndexDescMaskDump items, AxisAddRemove desc)."""
        member = getattr(s2.OperatorParam, f"param_{table}")
        size = {"CreateIndexDescMaskItem": 5, "CreateAxisDesc": 8}[create]

        def build(b: flatbuffers.Builder) -> tuple[int, int]:
            b.StartVector(size, len(items), 4)
            for item in reversed(items):
                getattr(P, create)(b, *item)
            vec = b.EndVector()
            getattr(P, f"{table}Start")(b)
            getattr(P, f"{table}Add{field_name}")(b, vec)
            return member, getattr(P, f"{table}End")(b)

        return build

    @staticmethod
    def dtype_param(code: int, scale: float | None = None) -> ParamFn:
        """The dtype table a TypeCvt carries."""

        def build(b: flatbuffers.Builder) -> tuple[int, int]:
            return s2.OperatorParam.DType, _dtype(b, (code, scale))

        return build

    def finish(self, outputs: Sequence[int]) -> bytes:
        """The serialized model."""
        b = flatbuffers.Builder(1024)
        ops = [self._operator(b, op) for op in self.ops]
        oprs = _vector(b, s2.ModelStartOprsVector, ops)
        outs = []
        for v in outputs:
            s2.OutputVarStart(b)
            s2.OutputVarAddCompactId(b, v)
            s2.OutputVarAddOriginalId(b, v)
            outs.append(s2.OutputVarEnd(b))
        out_vec = _vector(b, s2.ModelStartOutputVarsIdxVector, outs)
        s2.ModelStart(b)
        s2.ModelAddMgeVersion(b, 101300)
        s2.ModelAddModelVersion(b, 2)
        s2.ModelAddOprs(b, oprs)
        s2.ModelAddOutputVarsIdx(b, out_vec)
        b.FinishSizePrefixed(s2.ModelEnd(b), file_identifier=b"mgv2")
        return bytes(b.Output())

    def _operator(self, b: flatbuffers.Builder, op: _Op) -> int:
        type_s, name_s = b.CreateString(op.type), b.CreateString(op.name)
        ins = b.CreateNumpyVector(np.asarray(op.inputs, dtype=np.uint32))
        outs = b.CreateNumpyVector(np.asarray(op.outputs, dtype=np.uint32))
        tensors = _vector(b, s2.OperatorStartTensorsVector, [_tensor(b, t) for t in op.tensors])
        param = op.param(b) if op.param is not None else None
        out_dt = _dtype(b, op.output_dtype) if op.output_dtype is not None else None
        version = 2 if op.type in _VERSION_2 else 1
        s2.OperatorStart(b)
        s2.OperatorAddType(b, type_s)
        s2.OperatorAddTypeId(b, type_id(op.type, with_nul=version == 2))
        s2.OperatorAddName(b, name_s)
        if param is not None:
            s2.OperatorAddParamType(b, param[0])
            s2.OperatorAddParam(b, param[1])
        s2.OperatorAddInputs(b, ins)
        s2.OperatorAddOutputs(b, outs)
        if out_dt is not None:
            s2.OperatorAddOutputDtype(b, out_dt)
        s2.OperatorAddTensors(b, tensors)
        s2.OperatorAddOprVersion(b, version)
        return int(s2.OperatorEnd(b))


def _vector(b: flatbuffers.Builder, start: Callable[[Any, int], Any], items: Sequence[int]) -> int:
    start(b, len(items))
    for it in reversed(items):
        b.PrependUOffsetTRelative(it)
    return int(b.EndVector())


def _dtype(b: flatbuffers.Builder, dt: tuple[int, float | None]) -> int:
    code, scale = dt
    q = None
    if scale is not None:
        fd.LinearQuantizationParamStart(b)
        fd.LinearQuantizationParamAddScale(b, scale)
        q = fd.LinearQuantizationParamEnd(b)
    fd.DTypeStart(b)
    fd.DTypeAddType(b, code)
    if q is not None:
        fd.DTypeAddParamType(b, fd.DTypeParam.LinearQuantizationParam)
        fd.DTypeAddParam(b, q)
    return int(fd.DTypeEnd(b))


def _tensor(b: flatbuffers.Builder, t: _Tensor) -> int:
    name = b.CreateString(t.name)
    shape = b.CreateNumpyVector(np.asarray(t.shape, dtype=np.uint32))
    data = b.CreateNumpyVector(np.frombuffer(t.data, dtype=np.uint8)) if t.data is not None else None
    dt = _dtype(b, t.dtype)
    s2.TensorStart(b)
    s2.TensorAddName(b, name)
    s2.TensorAddShape(b, shape)
    s2.TensorAddDtype(b, dt)
    if data is not None:
        s2.TensorAddData(b, data)
    return int(s2.TensorEnd(b))
