"""Serialize an :class:`~backends.mnn.model.MnnNet` to ``.mnn`` bytes.

One generic routine writes any :class:`~backends.mnn.model.Table` through the
generated builder functions: children (strings, vectors, sub-tables) first, then
the table's fields in the order given. The same input always gives the same bytes:
nothing depends on time, randomness or dict order other than the caller's.
"""

from __future__ import annotations

import flatbuffers
import numpy as np

from backends.mnn.model import FieldValue, MnnNet, Table
from schemas.mnn.schema import builder_fn, camel, vector_dtype

__all__ = ["serialize", "build_table"]


def serialize(net: MnnNet) -> bytes:
    """The flatbuffer of ``net`` (root ``Net``, no file identifier, no size prefix)."""
    b = flatbuffers.Builder(1 << 16)
    root = build_table(b, net.as_table())
    b.Finish(root)
    return bytes(b.Output())


def _vector_of_offsets(b: flatbuffers.Builder, table: str, name: str, offsets: list[int]) -> int:
    builder_fn(table, f"Start{camel(name)}Vector")(b, len(offsets))
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return int(b.EndVector())


def _child(b: flatbuffers.Builder, table: str, name: str, value: FieldValue) -> int | None:
    """Create a non-scalar field value; None for scalars (added inline later)."""
    if isinstance(value, Table):
        return build_table(b, value)
    if isinstance(value, str):
        return int(b.CreateString(value))
    if isinstance(value, np.ndarray):
        want = vector_dtype(table, name)
        if value.dtype != want:
            raise TypeError(f"{table}.{name}: vector of {value.dtype}, the schema says {want}")
        return int(b.CreateNumpyVector(np.ascontiguousarray(value).reshape(-1)))
    if isinstance(value, list | tuple):
        items = list(value)
        if items and all(isinstance(v, Table) for v in items):
            return _vector_of_offsets(b, table, name, [build_table(b, v) for v in items])
        if items and all(isinstance(v, str) for v in items):
            return _vector_of_offsets(b, table, name, [int(b.CreateString(v)) for v in items])
        if not items:
            try:
                dtype = vector_dtype(table, name)
            except KeyError:
                return _vector_of_offsets(b, table, name, [])
            return int(b.CreateNumpyVector(np.zeros(0, dtype)))
        return int(b.CreateNumpyVector(np.asarray(items, vector_dtype(table, name))))
    return None


def build_table(b: flatbuffers.Builder, table: Table) -> int:
    """Write ``table`` (and everything it references); returns its offset."""
    children = {k: _child(b, table.name, k, v) for k, v in table.fields.items()}
    builder_fn(table.name, "Start")(b)
    for key, value in table.fields.items():
        add = builder_fn(table.name, f"Add{camel(key)}")
        arg = children[key] if children[key] is not None else value
        if key in table.force:
            b.ForceDefaults(True)
            add(b, arg)
            b.ForceDefaults(False)
        else:
            add(b, arg)
    return int(builder_fn(table.name, "End")(b))
