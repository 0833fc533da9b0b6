"""Element types and tensor types of the Kiln IR.

The IR is independent of ONNX: ``DType`` carries its own codes, which happen to
equal ONNX ``TensorProto`` data types so that frontends and exporters map them
one to one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

__all__ = ["DType", "Dim", "Shape", "TensorType"]


class DType(enum.IntEnum):
    """Element type of a tensor; values equal ONNX ``TensorProto.DataType``."""

    FLOAT32 = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    FLOAT64 = 11
    UINT32 = 12
    UINT64 = 13
    BFLOAT16 = 16

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype of this element type."""
        return np.dtype(_TO_NUMPY[self])

    @property
    def short(self) -> str:
        """Short printable name, e.g. ``f32``."""
        return _SHORT[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return 2 if self is DType.BFLOAT16 else self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        """True for floating-point types."""
        return self in (DType.FLOAT32, DType.FLOAT16, DType.FLOAT64, DType.BFLOAT16)

    @property
    def is_integer(self) -> bool:
        """True for signed or unsigned integer types."""
        return self in _INTEGERS

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DType:
        """The DType of a numpy dtype; raises ``TypeError`` for unsupported ones."""
        key = np.dtype(dtype)
        for dt, name in _TO_NUMPY.items():
            if dt is not DType.BFLOAT16 and np.dtype(name) == key:
                return dt
        raise TypeError(f"unsupported numpy dtype {key}")

    @classmethod
    def from_short(cls, short: str) -> DType:
        """Inverse of :attr:`short`."""
        for dt, name in _SHORT.items():
            if name == short:
                return dt
        raise ValueError(f"unknown dtype {short!r}")


_TO_NUMPY: dict[DType, str] = {
    DType.FLOAT32: "float32",
    DType.UINT8: "uint8",
    DType.INT8: "int8",
    DType.UINT16: "uint16",
    DType.INT16: "int16",
    DType.INT32: "int32",
    DType.INT64: "int64",
    DType.STRING: "object",
    DType.BOOL: "bool",
    DType.FLOAT16: "float16",
    DType.FLOAT64: "float64",
    DType.UINT32: "uint32",
    DType.UINT64: "uint64",
    DType.BFLOAT16: "uint16",
}
_SHORT: dict[DType, str] = {
    DType.FLOAT32: "f32",
    DType.UINT8: "u8",
    DType.INT8: "i8",
    DType.UINT16: "u16",
    DType.INT16: "i16",
    DType.INT32: "i32",
    DType.INT64: "i64",
    DType.STRING: "str",
    DType.BOOL: "bool",
    DType.FLOAT16: "f16",
    DType.FLOAT64: "f64",
    DType.UINT32: "u32",
    DType.UINT64: "u64",
    DType.BFLOAT16: "bf16",
}
_INTEGERS = frozenset(
    {DType.UINT8, DType.INT8, DType.UINT16, DType.INT16, DType.INT32, DType.INT64, DType.UINT32, DType.UINT64}
)

Dim = int | str
"""A dimension: a non-negative int, or a symbol for a dynamic size."""

Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class TensorType:
    """The type of a value: element type plus shape (``None`` when the rank is unknown)."""

    dtype: DType
    shape: Shape | None

    @property
    def rank(self) -> int | None:
        """Number of dimensions, or None when unknown."""
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dimension is a known int."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def static_shape(self) -> tuple[int, ...]:
        """The shape as ints; raises ``ValueError`` if any dimension is dynamic."""
        if self.shape is None or not self.is_static:
            raise ValueError(f"shape {self} is not static")
        return tuple(int(d) for d in self.shape)

    @property
    def numel(self) -> int:
        """Number of elements of a static shape."""
        return int(np.prod(self.static_shape, dtype=np.int64))

    def with_shape(self, shape: Shape | None) -> TensorType:
        """The same element type with another shape."""
        return TensorType(self.dtype, shape)

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.dtype.short}[*]"
        return f"{self.dtype.short}[{','.join(str(d) for d in self.shape)}]"

    @classmethod
    def of(cls, array: np.ndarray) -> TensorType:
        """The type of a numpy array."""
        return cls(DType.from_numpy(array.dtype), tuple(int(d) for d in array.shape))
