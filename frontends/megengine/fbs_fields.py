"""Bounded reads of flatbuffers fields shared by the V1 and V2 readers.

The generated accessors trust the buffer. A corrupt file can declare a vector
of four billion elements or a shape whose product does not fit in memory, so
every vector length, shape and tensor size is checked against the buffer
before anything is allocated or looped over. Violations raise ``ValueError``,
which the readers turn into one ModelFileError naming the file.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from frontends.megengine.dtypes import MgeDType, dtype_from_code
from frontends.megengine.model import MgeParam
from schemas.megengine.generated import dtype_generated as fb_dtype

__all__ = [
    "MAX_NDIM",
    "text",
    "vector_length",
    "int_vector",
    "read_dtype",
    "read_shape",
    "tensor_value",
    "param_of",
    "required",
]

T = TypeVar("T")

MAX_NDIM = 7
"""MegEngine's largest tensor rank."""

_MAX_DIM = 1 << 31


def required(value: T | None, what: str) -> T:
    """A vector element or sub-table the format requires; ValueError when it is missing."""
    if value is None:
        raise ValueError(f"{what} is missing")
    return value


def text(value: Any) -> str:
    """A flatbuffers string field as ``str`` (the runtime returns bytes or None)."""
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def vector_length(n: int, elem_bytes: int, buf: bytes, what: str) -> int:
    """``n`` if a vector of ``n`` elements of ``elem_bytes`` bytes fits in ``buf``."""
    if n < 0 or n * elem_bytes > len(buf):
        raise ValueError(f"{what} declares {n} elements, more than the file can hold")
    return n


def int_vector(obj: Any, field: str) -> list[int]:
    """An integer vector field as Python ints (empty when absent), read in one bounded numpy call."""
    if getattr(obj, f"{field}IsNone")():
        return []
    arr = getattr(obj, f"{field}AsNumpy")()
    if not isinstance(arr, np.ndarray):
        return []
    return [int(v) for v in arr]


def read_dtype(dt: Any) -> MgeDType | None:
    """A ``DType`` table as an MgeDType (None when absent)."""
    if dt is None:
        return None
    scale: float | None = None
    zp = 0
    if dt.ParamType() == fb_dtype.DTypeParam.LinearQuantizationParam:
        tab = dt.Param()
        if tab is not None:
            q = fb_dtype.LinearQuantizationParam()
            q.Init(tab.Bytes, tab.Pos)
            scale, zp = float(q.Scale()), int(q.ZeroPoint())
    return dtype_from_code(int(dt.Type()), scale, zp)


def read_shape(obj: Any, what: str) -> tuple[int, ...]:
    """A tensor's ``shape`` field, checked for rank and dimension sizes."""
    dims = int_vector(obj, "Shape")
    if len(dims) > MAX_NDIM:
        raise ValueError(f"{what} has rank {len(dims)} (MegEngine allows at most {MAX_NDIM})")
    if any(d >= _MAX_DIM for d in dims):
        raise ValueError(f"{what} has an impossible dimension in shape {dims}")
    return tuple(dims)


def tensor_value(
    raw: bytes | bytearray, shape: tuple[int, ...], dtype: MgeDType, what: str
) -> np.ndarray | None:
    """The stored values of a constant, checked against its shape and dtype.

    None for dtypes Kiln cannot hold (the converter reports those).
    """
    storage = dtype.storage
    if storage is None:
        return None
    numel = 1
    for d in shape:
        numel *= d
    if numel * storage.itemsize != len(raw):
        raise ValueError(
            f"{what} holds {len(raw)} bytes, but shape {list(shape)} of {dtype.name} needs "
            f"{numel * storage.itemsize}"
        )
    return np.frombuffer(bytes(raw), dtype=storage.newbyteorder("<")).astype(storage).reshape(shape)


def param_of(member: str, tab: Any, buf: bytes) -> MgeParam:
    """An OperatorParam union value as an MgeParam (``tab`` is a flatbuffers Table)."""
    pos = int(tab.Pos)
    if not 0 <= pos < len(buf):
        raise ValueError(f"param {member} points outside the file")
    return MgeParam(member, buf, pos)
