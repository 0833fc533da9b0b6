"""A small reader of FlatBuffers schema text: enums, unions and tables with their field slots.

Enough of the grammar for MNN's schema: ``enum N : type { A = 1, B, ... }``, ``union U { A, B = 5 }``,
``table T { name: type = default (attrs); ... }``, ``include``, comments. A union field
takes two vtable slots (``<name>_type`` then ``<name>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Schema", "Field", "parse_schema"]


@dataclass(frozen=True)
class Field:
    """A table field: its vtable slot, name and declared type."""

    slot: int
    name: str
    type: str


@dataclass
class Schema:
    """Enums (name -> {member: value}), unions (name -> {member: tag}), tables (name -> fields)."""

    enums: dict[str, dict[str, int]] = field(default_factory=dict)
    unions: dict[str, dict[str, int]] = field(default_factory=dict)
    tables: dict[str, list[Field]] = field(default_factory=dict)


_COMMENT = re.compile(r"//[^\n]*")
_BLOCK = re.compile(r"\b(enum|union|table|struct)\s+(\w+)\s*(?::\s*(\w+))?[^{]*\{(.*?)\}", re.S)


def _members(body: str, start: int) -> dict[str, int]:
    out: dict[str, int] = {}
    value = start - 1
    for item in body.split(","):
        item = item.strip()
        if not item:
            continue
        m = re.fullmatch(r"(\w+)(?:\s*:\s*\w+)?(?:\s*=\s*(-?\w+))?", item)
        if m is None:
            raise ValueError(f"cannot read enum member {item!r}")
        value = int(m.group(2), 0) if m.group(2) else value + 1
        out[m.group(1)] = value
    return out


def parse_schema(files: list[Path]) -> Schema:
    """Parse several .fbs files into one :class:`Schema`."""
    schema = Schema()
    for path in files:
        text = _COMMENT.sub("", path.read_text())
        for kind, name, _base, body in _BLOCK.findall(text):
            if kind == "enum":
                schema.enums[name] = _members(body, 0)
            elif kind == "union":
                schema.unions[name] = _members(body, 1)
            else:
                fields, slot = [], 0
                for decl in body.split(";"):
                    decl = decl.strip()
                    if not decl:
                        continue
                    m = re.match(r"(\w+)\s*:\s*([\[\]\w.]+)", decl)
                    if m is None:
                        raise ValueError(f"{path.name}: cannot read field {decl!r} of {name}")
                    fname, ftype = m.group(1), m.group(2)
                    fields.append(Field(slot, fname, ftype))
                    slot += 1
                schema.tables[name] = fields
    for fields in schema.tables.values():
        _union_slots(fields, schema)
    return schema


def _union_slots(fields: list[Field], schema: Schema) -> None:
    """Renumber slots: a union-typed field takes two slots (type tag, then value)."""
    slot = 0
    for i, f in enumerate(fields):
        if f.type in schema.unions:
            slot += 1
        fields[i] = Field(slot, f.name, f.type)
        slot += 1
