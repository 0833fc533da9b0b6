"""Recognise a ``.mge`` file by its first bytes and locate its flatbuffer.

=================================  ===========================================
first bytes                        what it is
=================================  ===========================================
``u32 size, u32 root, "mgv2"``     FBS V2: one size-prefixed flatbuffer (root Model)
``"MGBC"``, 8 B features, 4 B pad  FBS V1: ``u64 offset`` to a size-prefixed
                                   flatbuffer (root Graph); tensor values before it
``"MGBS"``, 4 B pad                FBS V1 "compat 8.14": the same without feature bits
``"mgb0001"``                      the old proprietary MegBrain format (refused)
``0x80 <protocol 2..5>``           a pickle: an ``mge.save`` checkpoint (refused)
=================================  ===========================================

Every problem is a :class:`compiler.errors.ModelFileError` naming the file.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from compiler.errors import ModelFileError

__all__ = ["Kind", "Container", "sniff", "detect", "open_container"]

_V2_ID = b"mgv2"
_V1_ID = b"mgb1"
_MGB0001 = b"mgb0001"


class Kind(enum.Enum):
    """What a file's first bytes say it is."""

    FBS_V2 = "FBS_V2"
    FBS_V1_MGBC = "FBS_V1 (MGBC)"
    FBS_V1_MGBS = "FBS_V1 (MGBS)"
    MGB0001 = "mgb0001"
    PICKLE = "pickle"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Container:
    """Where the parts of a readable file are.

    ``flatbuffer`` holds exactly the flatbuffer (size prefix removed); for V1
    files ``blob`` holds the out-of-band tensor values that precede it.
    """

    kind: Kind
    flatbuffer: bytes
    blob: bytes = b""


def detect(head: bytes) -> Kind:
    """The kind of a file from its first (at least 12) bytes."""
    if len(head) >= 12 and head[8:12] == _V2_ID:
        return Kind.FBS_V2
    if head[:4] == b"MGBC":
        return Kind.FBS_V1_MGBC
    if head[:4] == b"MGBS":
        return Kind.FBS_V1_MGBS
    if head.startswith(_MGB0001):
        return Kind.MGB0001
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return Kind.PICKLE
    return Kind.UNKNOWN


def sniff(head: bytes) -> bool:
    """True if the bytes look like any MegEngine model file (including the refused kinds)."""
    return detect(head) in (Kind.FBS_V2, Kind.FBS_V1_MGBC, Kind.FBS_V1_MGBS, Kind.MGB0001)


def _sized(data: bytes, at: int, source: str, what: str) -> bytes:
    """The size-prefixed flatbuffer starting at ``at``."""
    if at < 0 or at + 8 > len(data):
        raise ModelFileError(f"{source}: truncated {what} (the flatbuffer at byte {at} is cut off)")
    (size,) = struct.unpack_from("<I", data, at)
    end = at + 4 + size
    if size < 8 or end > len(data):
        raise ModelFileError(
            f"{source}: truncated {what} (its flatbuffer declares {size} bytes, "
            f"{max(len(data) - at - 4, 0)} are present)"
        )
    return bytes(data[at + 4 : end])


def open_container(data: bytes, source: str) -> Container:
    """Split a file's bytes into its parts; refuse what Kiln cannot read."""
    kind = detect(data[:16])
    if kind is Kind.MGB0001:
        raise ModelFileError(
            f"{source}: this is the old proprietary MegBrain 'mgb0001' model format, which Kiln (and "
            "open-source MegEngine) cannot read; re-dump the model with MegEngine >= 1.x (FBS_V2)"
        )
    if kind is Kind.PICKLE:
        raise ModelFileError(
            f"{source}: this is a pickled MegEngine checkpoint (mge.save of a module or state dict), "
            "not a serialized graph; dump the model with megengine.jit.trace(...).dump(...) and "
            "import that file"
        )
    if kind is Kind.UNKNOWN:
        shown = data[:8].hex(" ") if data else "empty file"
        raise ModelFileError(
            f"{source}: not a MegEngine model (first bytes {shown}; expected an 'mgv2' flatbuffer or "
            "an 'MGBC'/'MGBS' header)"
        )
    if kind is Kind.FBS_V2:
        return Container(kind, _sized(data, 0, source, "FBS_V2 model"))
    header = 24 if kind is Kind.FBS_V1_MGBC else 16
    if len(data) < header:
        raise ModelFileError(f"{source}: truncated {kind.value} header ({len(data)} of {header} bytes)")
    (offset,) = struct.unpack_from("<Q", data, header - 8)
    if offset > len(data):
        raise ModelFileError(
            f"{source}: corrupt {kind.value} header (flatbuffer offset {offset} is past the end of "
            f"the {len(data)}-byte file)"
        )
    at = header + offset
    fb = _sized(data, at, source, f"{kind.value} model")
    if fb[4:8] != _V1_ID:
        raise ModelFileError(
            f"{source}: corrupt {kind.value} file (no 'mgb1' flatbuffer at byte {at}; found {fb[4:8]!r})"
        )
    return Container(kind, fb, bytes(data[header:at]))
