"""The op-level graph an .om file holds, independent of the ge/domi encoding.

The CANN backend lowers a Kiln Graph to an :class:`OmGraph` (GE IR op types such as
Conv2D, Pooling, AscendQuant), then a schema writer encodes it as ``ge.proto.ModelDef``
or the seed's ``domi.ModelDef``. The CANN frontend decodes either schema back into an
OmGraph and lifts it into a Kiln Graph. Inputs are GE-style references ``"op:index"``
(``""`` for an absent optional input); ops are in topological order, starting with the
Data ops and ending with NetOutput.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from compiler.ir.types import DType

__all__ = ["Attr", "TensorDesc", "OmOp", "OmGraph", "ref", "split_ref", "NameAllocator"]

_KINDS = ("i", "f", "s", "b", "li", "lf", "ls")


@dataclass(frozen=True)
class Attr:
    """A typed attribute value.

    ``kind`` is one of ``i`` (int), ``f`` (float32), ``s`` (string), ``b`` (bool),
    ``li``/``lf``/``ls`` (lists of those), which is how both schemas tell them apart.
    """

    kind: str
    value: int | float | str | bool | tuple[int, ...] | tuple[float, ...] | tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown attribute kind {self.kind!r}")

    @staticmethod
    def i(v: int) -> Attr:
        """An int attribute."""
        return Attr("i", int(v))

    @staticmethod
    def f(v: float) -> Attr:
        """A float attribute (stored as float32)."""
        return Attr("f", float(np.float32(v)))

    @staticmethod
    def s(v: str) -> Attr:
        """A string attribute."""
        return Attr("s", str(v))

    @staticmethod
    def b(v: bool) -> Attr:
        """A bool attribute."""
        return Attr("b", bool(v))

    @staticmethod
    def li(v: Iterable[int]) -> Attr:
        """A list-of-ints attribute."""
        return Attr("li", tuple(int(x) for x in v))

    @staticmethod
    def lf(v: Iterable[float]) -> Attr:
        """A list-of-floats attribute (float32 values)."""
        return Attr("lf", tuple(float(np.float32(x)) for x in v))

    @staticmethod
    def ls(v: Iterable[str]) -> Attr:
        """A list-of-strings attribute."""
        return Attr("ls", tuple(str(x) for x in v))


@dataclass(frozen=True)
class TensorDesc:
    """A tensor's element type, static shape and format name (NCHW, ND, ...).

    ``int4``: an int8 tensor whose values lie in [-8, 7], stored as ge's ``DT_INT4`` (two values
    a byte, :mod:`schemas.cann.int4`); schemas without a 4-bit type store it as int8.
    """

    dtype: DType
    shape: tuple[int, ...]
    format: str = "ND"
    int4: bool = False

    def __post_init__(self) -> None:
        if self.int4 and self.dtype is not DType.INT8:
            raise ValueError(f"an int4 descriptor holds int8 values, got {self.dtype.name}")

    @property
    def nbytes(self) -> int:
        """Size in bytes of a dense tensor of this description (ceil(n / 2) when ``int4``)."""
        count = int(np.prod(self.shape, dtype=np.int64))
        return (count + 1) // 2 if self.int4 else count * self.dtype.itemsize


@dataclass
class OmOp:
    """One operator: GE type, inputs by reference, output descriptions, attributes.

    ``value`` holds the array of a Const op.
    """

    name: str
    type: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[TensorDesc] = field(default_factory=list)
    attrs: dict[str, Attr] = field(default_factory=dict)
    value: np.ndarray | None = None


@dataclass
class OmGraph:
    """The ops of one graph plus the public names of its outputs (NetOutput's inputs)."""

    name: str
    ops: list[OmOp] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)

    def op_map(self) -> dict[str, OmOp]:
        """Ops by name."""
        return {op.name: op for op in self.ops}

    def users(self) -> dict[str, list[tuple[OmOp, int]]]:
        """For each reference ``"op:index"``, its consumers as (op, input port)."""
        out: dict[str, list[tuple[OmOp, int]]] = {}
        for op in self.ops:
            for port, r in enumerate(op.inputs):
                if r:
                    out.setdefault(r, []).append((op, port))
        return out


def ref(op: str, index: int = 0) -> str:
    """The reference to output ``index`` of op ``op``."""
    return f"{op}:{index}"


def split_ref(r: str) -> tuple[str, int]:
    """``"op:index"`` -> (op, index); raises ValueError when malformed."""
    name, sep, idx = r.rpartition(":")
    if not sep or not name:
        raise ValueError(f"input reference {r!r} is not 'op:index'")
    return name, int(idx)


class NameAllocator:
    """Unique op names: taken names are reserved up front, derived ones get a suffix."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._used: set[str] = set(reserved)

    def reserve(self, name: str) -> None:
        """Mark ``name`` as used."""
        self._used.add(name)

    def fresh(self, base: str) -> str:
        """An unused name derived from ``base`` (``base`` itself when free)."""
        name = base
        i = 1
        while name in self._used:
            name = f"{base}_{i}"
            i += 1
        self._used.add(name)
        return name
