"""XXH64, the 64-bit xxHash, in pure Python (MegEngine hashes operator class names with it).

Implements the published XXH64 algorithm: four 64-bit lanes consume 32-byte
stripes, the lanes are merged, the tail is mixed 8, 4 and 1 bytes at a time,
and a final avalanche spreads the bits. Only short strings are hashed here, so
speed does not matter.
"""

from __future__ import annotations

import struct

__all__ = ["xxh64"]

_MASK = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _MASK
    return (_rotl(acc, 31) * _P1) & _MASK


def _merge(acc: int, lane: int) -> int:
    acc ^= _round(0, lane)
    return (acc * _P1 + _P4) & _MASK


def xxh64(data: bytes, seed: int = 0) -> int:
    """The XXH64 digest of ``data`` as an unsigned 64-bit int."""
    n = len(data)
    pos = 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _MASK, (seed + _P2) & _MASK, seed & _MASK, (seed - _P1) & _MASK]
        while pos + 32 <= n:
            lanes = struct.unpack_from("<4Q", data, pos)
            v = [_round(a, b) for a, b in zip(v, lanes, strict=True)]
            pos += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _MASK
        for lane in v:
            h = _merge(h, lane)
    else:
        h = (seed + _P5) & _MASK
    h = (h + n) & _MASK
    while pos + 8 <= n:
        (k,) = struct.unpack_from("<Q", data, pos)
        h ^= _round(0, k)
        h = (_rotl(h, 27) * _P1 + _P4) & _MASK
        pos += 8
    if pos + 4 <= n:
        (k,) = struct.unpack_from("<I", data, pos)
        h ^= (k * _P1) & _MASK
        h = (_rotl(h, 23) * _P2 + _P3) & _MASK
        pos += 4
    while pos < n:
        h ^= (data[pos] * _P5) & _MASK
        h = (_rotl(h, 11) * _P1) & _MASK
        pos += 1
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    h ^= h >> 32
    return h
