"""MegEngine element types: their storage, their quantization and their Kiln form.

A MegEngine dtype is a ``DTypeEnum`` name plus, for quantized types, one
per-tensor scale (and a zero point for the asymmetric ones). Kiln keeps
quantized values *dequantized* (float32) and marks where MegEngine rounds them
with QuantizeLinear -> DequantizeLinear pairs:

* 8- and 16-bit types (QuantizedS8, Quantized8Asymm, QuantizedS16) have a
  QDQ form: real = scale * (q - zero_point), q saturated to the storage type.
* QuantizedS32 (accumulators and biases, scale = s_in * s_w) has no ONNX
  QuantizeLinear; int32 constants are dequantized, computed values stay float.
* Low-bit and exotic types (IntB*, UintB4, Quantized4Asymm, QuantizedS4/S1,
  Byte, Complex64) are not imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.types import DType

__all__ = ["MgeDType", "FLOAT32", "INT32", "dtype_name", "dtype_from_code"]

# DTypeEnum values in MegEngine's order (dtype.fbs).
_NAMES = (
    "Float32",
    "Uint8",
    "Int8",
    "Int16",
    "Int32",
    "IntB1",
    "IntB2",
    "IntB4",
    "Byte",
    "Float16",
    "UintB4",
    "Quantized8Asymm",
    "QuantizedS32",
    "QuantizedS8",
    "Quantized4Asymm",
    "QuantizedS4",
    "QuantizedS16",
    "BFloat16",
    "Bool",
    "Uint16",
    "QuantizedS1",
    "Complex64",
)

# name -> storage numpy dtype (types Kiln cannot hold are absent)
_STORAGE: dict[str, str] = {
    "Float32": "float32",
    "Float16": "float16",
    "Uint8": "uint8",
    "Int8": "int8",
    "Int16": "int16",
    "Uint16": "uint16",
    "Int32": "int32",
    "Bool": "bool",
    "Quantized8Asymm": "uint8",
    "QuantizedS8": "int8",
    "QuantizedS16": "int16",
    "QuantizedS32": "int32",
}
_QUANTIZED = frozenset({"Quantized8Asymm", "QuantizedS8", "QuantizedS16", "QuantizedS32"})
_QDQ = frozenset({"Quantized8Asymm", "QuantizedS8", "QuantizedS16"})


def dtype_name(code: int) -> str:
    """The DTypeEnum name of a code (``"DTypeEnum(<code>)"`` when unknown)."""
    return _NAMES[code] if 0 <= code < len(_NAMES) else f"DTypeEnum({code})"


@dataclass(frozen=True)
class MgeDType:
    """One MegEngine dtype: its DTypeEnum name and, if quantized, scale and zero point."""

    name: str
    scale: float | None = None
    zero_point: int = 0

    def __str__(self) -> str:
        if self.scale is None:
            return self.name
        zp = f",zp={self.zero_point}" if self.zero_point else ""
        return f"{self.name}(scale={self.scale:.6g}{zp})"

    @property
    def is_quantized(self) -> bool:
        """True for the linear-quantized types Kiln imports."""
        return self.name in _QUANTIZED

    @property
    def has_qdq(self) -> bool:
        """True if values of this type are rounded with a QuantizeLinear/DequantizeLinear pair."""
        return self.name in _QDQ

    @property
    def storage(self) -> np.dtype | None:
        """The numpy dtype of stored values, or None for types Kiln cannot read."""
        s = _STORAGE.get(self.name)
        return None if s is None else np.dtype(s)

    @property
    def kiln(self) -> DType | None:
        """The Kiln element type of the value in the graph (float32 for quantized types)."""
        if self.is_quantized:
            return DType.FLOAT32
        s = self.storage
        return None if s is None else DType.from_numpy(s)

    def check_quant_params(self) -> None:
        """Raise ValueError if a quantized type's scale or zero point is unusable."""
        if not self.is_quantized:
            return
        if self.scale is None or not np.isfinite(self.scale) or self.scale <= 0:
            raise ValueError(f"{self.name} needs a positive finite scale, got {self.scale}")
        if self.name != "Quantized8Asymm" and self.zero_point:
            raise ValueError(f"{self.name} is symmetric but has zero point {self.zero_point}")


FLOAT32 = MgeDType("Float32")
INT32 = MgeDType("Int32")


def dtype_from_code(code: int, scale: float | None = None, zero_point: int = 0) -> MgeDType:
    """A dtype from its DTypeEnum code and optional quantization parameters."""
    name = dtype_name(code)
    if name not in _QUANTIZED and name not in ("Quantized4Asymm", "QuantizedS4", "QuantizedS1"):
        return MgeDType(name)
    return MgeDType(name, scale, zero_point if name in ("Quantized8Asymm", "Quantized4Asymm") else 0)
