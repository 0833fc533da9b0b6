"""Access to the generated flatbuffers code of Kiln's MNN schema (``schemas/mnn/*.fbs``).

The generated module ``fb`` holds the enum classes (``fb.OpType``, ``fb.OpParameter``,
``fb.DataType``...) and, per table ``T``, the builder functions ``T{Start,Add<Field>,End}``
and the reader class ``fb.T``. Schema field names map to generated names by
:func:`camel` (``has_scaleInt`` -> ``HasScaleInt``).
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

import numpy as np

from schemas.mnn.generated import MNN_generated as fb

__all__ = ["fb", "camel", "op_type", "param_tag", "vector_dtype", "builder_fn", "enum_name"]

_FLAGS_DTYPE = {
    "Bool": np.bool_,
    "Int8": np.int8,
    "Uint8": np.uint8,
    "Int16": np.int16,
    "Uint16": np.uint16,
    "Int32": np.int32,
    "Uint32": np.uint32,
    "Int64": np.int64,
    "Uint64": np.uint64,
    "Float32": np.float32,
    "Float64": np.float64,
}


def camel(field: str) -> str:
    """The generated-code spelling of a schema field name."""
    return "".join(p[:1].upper() + p[1:] for p in field.split("_"))


def op_type(name: str) -> int:
    """The ``OpType`` value of an op type name (``"Convolution"`` -> 12)."""
    value = getattr(fb.OpType, name, None)
    if not isinstance(value, int):
        raise KeyError(f"unknown MNN OpType {name!r}")
    return value


def param_tag(table: str) -> int:
    """The ``OpParameter`` union tag of a parameter table (``"Convolution2D"`` -> 9)."""
    value = getattr(fb.OpParameter, table, None)
    if not isinstance(value, int):
        raise KeyError(f"{table!r} is not an OpParameter member in Kiln's MNN schema")
    return value


def enum_name(enum: type, value: int) -> str:
    """The name of an enum value (for messages), or the number as text."""
    for k, v in vars(enum).items():
        if v == value and not k.startswith("_"):
            return k
    return str(value)


@functools.cache
def builder_fn(table: str, action: str) -> Any:
    """The generated builder function ``<table><action>`` (e.g. ``PoolAddKernelX``)."""
    fn = getattr(fb, f"{table}{action}", None)
    if fn is None:  # flatc spells an upper-case run in a field name as one word (isBidirectionalRNN)
        want = f"{table}{action}".lower()
        fn = next((getattr(fb, k) for k in vars(fb) if k.lower() == want), None)
    if fn is None:
        raise KeyError(f"MNN table {table} has no builder function {table}{action}")
    return fn


@functools.cache
def vector_dtype(table: str, field: str) -> np.dtype:
    """Element type of a scalar vector field, read from the generated accessor."""
    reader = getattr(getattr(fb, table), f"{camel(field)}AsNumpy", None)
    if reader is None:
        raise KeyError(f"MNN table {table} has no scalar vector field {field!r}")
    m = re.search(r"GetVectorAsNumpy\(flatbuffers\.number_types\.(\w+?)Flags", inspect.getsource(reader))
    if m is None or m.group(1) not in _FLAGS_DTYPE:
        raise KeyError(f"cannot tell the element type of {table}.{field}")
    return np.dtype(_FLAGS_DTYPE[m.group(1)])
