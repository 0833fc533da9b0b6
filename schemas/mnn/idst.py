"""The IDST table coding of quantized weights (``IDSTQuan.buffer`` with ``type`` 1).

Layout, as MNN's ``IDSTDecoder::ReadQuanData_c`` reads it::

    u8 ndims | dims (u16 LE each, or u32 LE each with IDSTQuan.shapeInt32 when a dim > 65535)
    u8 table size T (2**bits; 256 is stored as 0) | int8 table[T] = -2**(b-1) .. 2**(b-1)-1
    packed indexes: ceil(bits * count / 8) bytes, each index ``bits`` wide, MSB first,
    index = q + 2**(b-1) (the position of q in the ascending table)

So for 8 bits the packed byte is q + 128, and for 4 bits the first weight is the high
nibble. Kiln writes ``dims = [oc, K]`` (weights flattened per output channel).
"""

from __future__ import annotations

import numpy as np

__all__ = ["encode", "decode"]


def encode(q: np.ndarray, bits: int) -> tuple[np.ndarray, bool]:
    """Table-code integer weights ``q`` ([oc, K], values in [-2**(b-1), 2**(b-1)-1]).

    Returns the buffer (int8, as ``IDSTQuan.buffer`` stores it) and the shapeInt32 flag.
    """
    if not 2 <= bits <= 8:
        raise ValueError(f"IDST coding supports 2..8 bits, got {bits}")
    q = np.asarray(q, dtype=np.int64)
    if q.ndim != 2:
        raise ValueError(f"expected [oc, K] weights, got shape {q.shape}")
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if q.size and (q.min() < lo or q.max() > hi):
        raise ValueError(f"weights outside [{lo}, {hi}] for {bits} bits")
    wide = max(q.shape) > 0xFFFF
    head = bytearray([2]) + np.asarray(q.shape, "<u4" if wide else "<u2").tobytes()
    table = np.arange(lo, hi + 1, dtype=np.int8)
    head += bytes([len(table) & 0xFF]) + table.tobytes()
    idx = (q.reshape(-1) - lo).astype(np.uint8)
    bitplanes = np.unpackbits(idx[:, None], axis=1)[:, 8 - bits :]
    packed = np.packbits(bitplanes.reshape(-1))
    return np.frombuffer(bytes(head) + packed.tobytes(), np.int8).copy(), wide


def decode(buffer: np.ndarray | bytes, shape_int32: bool = False) -> np.ndarray:
    """Inverse of :func:`encode`: the integer weights with the stored dims (int32)."""
    raw = np.frombuffer(bytes(buffer), np.uint8) if isinstance(buffer, bytes) else buffer.view(np.uint8)
    ndims = int(raw[0])
    width = 4 if shape_int32 else 2
    pos = 1 + ndims * width
    dims = np.frombuffer(raw[1:pos].tobytes(), "<u4" if shape_int32 else "<u2").astype(np.int64)
    size = int(raw[pos]) or 256
    table = raw[pos + 1 : pos + 1 + size].view(np.int8).astype(np.int32)
    bits = max(1, int(size - 1).bit_length())
    count = int(np.prod(dims))
    packed = raw[pos + 1 + size :]
    planes = np.unpackbits(packed)[: count * bits].reshape(count, bits)
    idx = np.packbits(np.pad(planes, ((0, 0), (8 - bits, 0))), axis=1).reshape(-1)
    return np.sort(table)[idx].reshape(tuple(int(d) for d in dims))
