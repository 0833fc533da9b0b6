"""``DT_INT4`` tensors of the ge schema: signed 4-bit values packed two per byte.

``ge.proto.DataType`` has ``DT_INT4 = 28`` (``ge_ir.proto``; the 2021 schema stops at 26). GE
sizes such a tensor by bits, not bytes: its type size is ``kDataTypeSizeBitOffset + 4`` and a
tensor of n elements takes ceil(4 · n / 8) bytes (GE's ``CalcDataSize``), i.e. two values a byte.
Kiln packs the flattened (row-major) values low nibble first, in two's complement::

    byte[j] = (v[2j] & 15) | (v[2j + 1] & 15) << 4      (an odd n: the last high nibble is 0)
    v[i]    = ((byte[i // 2] >> 4 · (i mod 2)) & 15) - 16 · (nibble >= 8)

(the order onnxruntime's MatMulNBits and ONNX INT4 use; the reference material documents no
other order for GE). Values are int8 arrays in [-8, 7] on both sides, so the lifted Kiln graph
holds ordinary int8 constants.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PROTO_INT4", "INT4_RANGE", "int4_nbytes", "pack_int4", "unpack_int4"]

PROTO_INT4 = 28  # ge.proto.DataType.DT_INT4
INT4_RANGE = (-8, 7)


def int4_nbytes(count: int) -> int:
    """ceil(count / 2): the bytes of ``count`` packed 4-bit values."""
    return (int(count) + 1) // 2


def pack_int4(values: np.ndarray) -> bytes:
    """The packed bytes of ``values`` (integers in [-8, 7], any shape, row-major)."""
    v = np.asarray(values).reshape(-1).astype(np.int16)
    if v.size and (int(v.min()) < INT4_RANGE[0] or int(v.max()) > INT4_RANGE[1]):
        raise ValueError(f"int4 values must lie in [-8, 7], got [{int(v.min())}, {int(v.max())}]")
    u = (v & 15).astype(np.uint8)
    if u.size % 2:
        u = np.append(u, np.uint8(0))
    return (u[0::2] | (u[1::2] << 4)).astype(np.uint8).tobytes()


def unpack_int4(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """int8 values of ``shape`` from :func:`pack_int4`'s bytes (exactly int4_nbytes(count) of them)."""
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) != int4_nbytes(count):
        raise ValueError(f"{len(raw)} bytes for {count} int4 values (want {int4_nbytes(count)})")
    b = np.frombuffer(raw, dtype=np.uint8)
    u = np.empty(2 * b.size, np.int16)
    u[0::2], u[1::2] = b & 15, b >> 4
    return np.where(u >= 8, u - 16, u)[:count].astype(np.int8).reshape(shape)
