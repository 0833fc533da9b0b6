"""The .om container: a 256-byte header, a partition table, then the partitions.

Layout (little endian, natural alignment; NOTES.md §1)::

    0    u32 magic 0x444F4D49 ("IMOD" on disk)   4  u32 headsize = 256
    8    u32 version (0x20000000)                12 char checksum[64]  (zeros: unsigned)
    76   u32 length (legacy payload length)      80 u8 is_encrypt, is_checksum, modeltype, genmode
    84   char name[32]                           116 u32 ops; 120 char userdefineinfo[32]
    152  u32 om_ir_version (2)                   156 u32 model_num (1)
    160  char platform_version[20]               180 u8 platform_type; 3 pad bytes
    184  u64 model_length (payload = file - 256) 192 u8 need_check_os_cpu_info, is_unknow_model
    194  reserved[62]

The table follows at byte 256: wide (``model_length != 0``) as ``u32 num; u32 pad;
num x {u32 type; u32 pad; u64 offset; u64 size}``, legacy narrow as ``u32 num;
num x {u32 type; u32 offset; u32 size}``. Offsets count from the first byte after the
table and are cumulative: GE walks partitions back to back, Netron seeks by offset, so
writers keep both in agreement.

:func:`pack_om` writes the modern form (wide table). :func:`read_om` applies the GE
loader's checks (magic, header length = file size - 256, 1 to 8 partitions, partitions
inside the file and back to back) and raises one :class:`ModelFileError` naming the file
and the fault.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.errors import ModelFileError
from schemas.cann.codes import MODEL_DEF, PARTITION_NAMES

__all__ = ["MAGIC", "HEAD_LEN", "MODEL_VERSION", "OmHeader", "OmFile", "pack_om", "read_om"]

MAGIC = 0x444F4D49
HEAD_LEN = 256
MODEL_VERSION = 0x20000000
LEGACY_VERSION = 0x10000000
OM_IR_VERSION = 2
PLATFORM_VERSION = "1.11.z.0"
MAX_PARTITIONS = 8

_HEADER = struct.Struct("<III64sIBBBB32sI32sII20sB3sQBB62s")
assert _HEADER.size == HEAD_LEN
_WIDE_ENTRY = struct.Struct("<I4xQQ")
_NARROW_ENTRY = struct.Struct("<III")


@dataclass(frozen=True)
class OmHeader:
    """The header fields Kiln reads back."""

    version: int
    name: str
    length: int
    model_length: int
    is_encrypt: int
    model_num: int
    om_ir_version: int

    @property
    def wide(self) -> bool:
        """True when the partition table is the 64-bit (modern) one."""
        return self.model_length != 0


@dataclass(frozen=True)
class OmFile:
    """A checked container: the header and the partitions by type."""

    header: OmHeader
    partitions: dict[int, bytes]


def _cstr(text: str, size: int) -> bytes:
    raw = text.encode("utf-8")[: size - 1].decode("utf-8", errors="ignore").encode("utf-8")
    return raw + b"\0" * (size - len(raw))


def pack_om(partitions: Sequence[tuple[int, bytes]], name: str) -> bytes:
    """The .om bytes: header, wide partition table, then the partitions in the given order."""
    if not 1 <= len(partitions) <= MAX_PARTITIONS:
        raise ValueError(f"an .om file holds 1 to {MAX_PARTITIONS} partitions, not {len(partitions)}")
    table = bytearray(struct.pack("<I4x", len(partitions)))
    offset = 0
    for kind, data in partitions:
        table += _WIDE_ENTRY.pack(kind, offset, len(data))
        offset += len(data)
    payload = bytes(table) + b"".join(data for _, data in partitions)
    header = _HEADER.pack(
        MAGIC,
        HEAD_LEN,
        MODEL_VERSION,
        b"\0" * 64,  # checksum: an unsigned model
        0,  # legacy length: modern files use model_length
        0,  # is_encrypt
        0,  # is_checksum (CHECK, the default)
        0,  # modeltype: IR model
        0,  # genmode: offline
        _cstr(name, 32),
        0,  # ops
        b"\0" * 32,  # userdefineinfo
        OM_IR_VERSION,
        1,  # model_num
        _cstr(PLATFORM_VERSION, 20),
        0,  # platform_type
        b"\0" * 3,
        len(payload),  # model_length
        0,  # need_check_os_cpu_info
        0,  # is_unknow_model: static shapes
        b"\0" * 62,
    )
    return header + payload


def read_om(data: bytes, source: str) -> OmFile:
    """Parse and check the container; ModelFileError names ``source`` and the fault."""

    def bad(why: str) -> ModelFileError:
        return _error(source, why)

    size = len(data)
    if size < HEAD_LEN:
        raise bad(f"{size} bytes, shorter than the {HEAD_LEN}-byte header (truncated?)")
    f = _HEADER.unpack_from(data, 0)
    magic, headsize, version, length, is_encrypt, name = f[0], f[1], f[2], f[4], f[5], f[9]
    om_ir_version, model_num, model_length = f[12], f[13], f[17]
    if magic != MAGIC:
        raise bad(f"bad magic 0x{magic:08X} (expected 0x{MAGIC:08X}, 'IMOD')")
    if headsize != HEAD_LEN:
        raise bad(f"header size {headsize} (expected {HEAD_LEN})")
    if version not in (MODEL_VERSION, LEGACY_VERSION):
        raise bad(f"unsupported header version 0x{version:08X}")
    if version == LEGACY_VERSION:
        model_num = 1  # the 2020 layout has no model_num; its bytes belong to platform_version
    payload = model_length if model_length else length
    if payload != size - HEAD_LEN:
        which = "model_length" if model_length else "length"
        raise bad(f"header {which} {payload} != file size - {HEAD_LEN} = {size - HEAD_LEN} (truncated?)")
    if is_encrypt != 0:
        raise bad("the model is encrypted")
    if model_num != 1:
        raise bad(f"model_num {model_num}: only single-model files are supported")
    header = OmHeader(
        version=version,
        name=name.split(b"\0", 1)[0].decode("utf-8", errors="replace"),
        length=length,
        model_length=model_length,
        is_encrypt=is_encrypt,
        model_num=model_num,
        om_ir_version=om_ir_version,
    )
    return OmFile(header, _read_partitions(data, header.wide, source))


def _error(source: str, why: str) -> ModelFileError:
    return ModelFileError(f"{source}: not a valid .om file: {why}")


def _read_partitions(data: bytes, wide: bool, source: str) -> dict[int, bytes]:
    def fail(why: str) -> ModelFileError:
        return _error(source, why)

    size = len(data)
    entry = _WIDE_ENTRY if wide else _NARROW_ENTRY
    first = 8 if wide else 4
    if size < HEAD_LEN + first:
        raise fail("the partition table is missing (truncated?)")
    (num,) = struct.unpack_from("<I", data, HEAD_LEN)
    if not 1 <= num <= MAX_PARTITIONS:
        raise fail(f"{num} partitions in the table (GE accepts 1 to {MAX_PARTITIONS})")
    table_end = HEAD_LEN + first + num * entry.size
    if table_end > size:
        raise fail(f"the partition table ({num} entries) runs past the end of the file (truncated?)")
    parts: dict[int, bytes] = {}
    cursor = table_end
    for i in range(num):
        kind, offset, length = entry.unpack_from(data, HEAD_LEN + first + i * entry.size)
        label = PARTITION_NAMES.get(kind)
        if label is None:
            raise fail(f"partition {i} has unknown type {kind}")
        if kind in parts:
            raise fail(f"partition {label} appears twice")
        if table_end + offset != cursor:
            raise fail(
                f"partition {label} starts at offset {offset}, but the partitions before it end at "
                f"{cursor - table_end} (partitions must be back to back)"
            )
        if cursor + length > size:
            raise fail(f"partition {label} ({length} bytes at {cursor}) runs past the end of the file")
        parts[kind] = data[cursor : cursor + length]
        cursor += length
    if cursor != size:
        raise fail(f"{size - cursor} bytes after the last partition")
    if MODEL_DEF not in parts:
        raise fail("no MODEL_DEF partition")
    return parts
