"""The WEIGHTS_DATA partition: one blob of constants at 512-byte aligned offsets.

As GE's model builder lays it out (NOTES.md §1.6): bytes 0..511 are zero, the first
constant starts at offset 512 (``kWeightsStartOffset``), every constant starts on a
512-byte boundary (``MEM_ALIGN_SIZE``) and the blob ends padded to 512 bytes. Identical
byte strings share one offset, as GE's ``ReuseWeightMem`` does for equal constants.
"""

from __future__ import annotations

import hashlib

__all__ = ["ALIGN", "START_OFFSET", "WeightsBlob"]

ALIGN = 512
START_OFFSET = 512


def _pad(n: int) -> int:
    return -n % ALIGN


class WeightsBlob:
    """Collects constants; :meth:`add` returns each one's offset, :meth:`data` the partition."""

    def __init__(self) -> None:
        self._buf = bytearray(START_OFFSET)
        self._seen: dict[str, int] = {}

    def add(self, raw: bytes) -> int:
        """Place ``raw`` (or find an identical earlier copy); returns its offset in the blob."""
        key = hashlib.sha256(raw).hexdigest()
        if key in self._seen:
            return self._seen[key]
        offset = len(self._buf)
        self._buf += raw
        self._buf += b"\0" * _pad(len(self._buf))
        self._seen[key] = offset
        return offset

    def data(self) -> bytes:
        """The partition bytes (a multiple of 512; at least the 512 leading zero bytes)."""
        return bytes(self._buf)

    def __len__(self) -> int:
        return len(self._buf)
