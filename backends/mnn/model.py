"""An ``.mnn`` network as plain data: ops over indexed tensors, parameters as tables.

This is the format-level model that sits between Kiln's IR and the flatbuffer
bytes. Lowering (``backends.mnn.lower``) builds it from a Graph, the serializer
(``backends.mnn.serializer``) turns it into bytes, and a reader can produce the
same structure from a file. A parameter is a :class:`Table`: the name of a schema
table and its fields by schema name, so every op family is described as data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.mnn.schema import fb, op_type, param_tag

__all__ = ["Table", "FieldValue", "MnnOp", "MnnNet", "TensorQuant"]

FieldValue = Any
"""bool | int | float | str | np.ndarray (scalar vector) | list[int] | list[float] | list[str]
| Table | list[Table]."""


@dataclass(frozen=True, eq=False)
class Table:
    """A flatbuffers table: schema table name and field values by schema field name.

    ``force`` names fields written even when they equal the schema default (for
    example ``Input.dformat``, whose default NC4HW4 is not what Kiln means).
    """

    name: str
    fields: Mapping[str, FieldValue] = field(default_factory=dict)
    force: frozenset[str] = frozenset()

    def get(self, key: str, default: FieldValue = None) -> FieldValue:
        """A field value, or ``default`` when unset."""
        return self.fields.get(key, default)


@dataclass
class MnnOp:
    """One ``Op``: type name, op name, tensor indexes in and out, and its parameter table."""

    type: str
    name: str
    inputs: list[int]
    outputs: list[int]
    param: Table | None = None

    @property
    def type_value(self) -> int:
        """The ``OpType`` number."""
        return op_type(self.type)

    def as_table(self) -> Table:
        """The ``Op`` table of this op."""
        fields: dict[str, FieldValue] = {}
        if self.inputs:
            fields["inputIndexes"] = np.asarray(self.inputs, np.int32)
        if self.param is not None:
            fields["main_type"] = param_tag(self.param.name)
            fields["main"] = self.param
        fields["name"] = self.name
        fields["outputIndexes"] = np.asarray(self.outputs, np.int32)
        fields["type"] = self.type_value
        return Table("Op", fields)


@dataclass(frozen=True)
class TensorQuant:
    """Per-tensor int8 quantisation (``TensorQuantInfo``): real = scale * (q - zero)."""

    scale: float
    zero: float = 0.0
    min: float = -128.0
    max: float = 127.0
    dtype: int = fb.DataType.DT_INT8

    def as_table(self) -> Table:
        """The ``TensorQuantInfo`` table."""
        return Table(
            "TensorQuantInfo",
            {"scale": self.scale, "zero": self.zero, "min": self.min, "max": self.max, "type": self.dtype},
            force=frozenset({"min", "max"}),
        )


@dataclass
class MnnNet:
    """A whole ``Net``: ops in execution order over ``tensor_names`` (unique)."""

    ops: list[MnnOp] = field(default_factory=list)
    tensor_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    biz_code: str = ""
    source_type: int = fb.NetSource.ONNX
    tensor_quant: dict[int, TensorQuant] = field(default_factory=dict)

    def as_table(self) -> Table:
        """The root ``Net`` table."""
        fields: dict[str, FieldValue] = {}
        if self.biz_code:
            fields["bizCode"] = self.biz_code
        if self.tensor_quant:
            fields["extraTensorDescribe"] = [
                Table("TensorDescribe", {"index": i, "quantInfo": q.as_table()}, force=frozenset({"index"}))
                for i, q in sorted(self.tensor_quant.items())
            ]
        fields["oplists"] = [op.as_table() for op in self.ops]
        fields["outputName"] = list(self.output_names)
        fields["sourceType"] = self.source_type
        fields["tensorName"] = list(self.tensor_names)
        return Table("Net", fields)
