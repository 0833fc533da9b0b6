"""The format-neutral form of a parsed ``.mge`` file: operators over integer variable ids.

Both container readers (FBS V2 and V1) produce an :class:`MgeModel`; the
importer turns it into a Kiln graph. Parameters stay flatbuffers tables (read
with the generated classes), everything else is plain Python and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from frontends.megengine.dtypes import MgeDType

__all__ = ["MgeTensor", "MgeParam", "MgeOpr", "MgeModel"]

T = TypeVar("T")


@dataclass(frozen=True)
class MgeTensor:
    """A tensor stored with an operator: a graph input's declaration or a constant's value."""

    name: str
    shape: tuple[int, ...]
    dtype: MgeDType
    value: np.ndarray | None = None  # storage values (int8 for QuantizedS8, ...); None without data


@dataclass(frozen=True)
class MgeParam:
    """One operator parameter: its OperatorParam union member and flatbuffers table.

    ``member`` is the generated union member name: ``param_ConvBias`` for the
    operator-parameter tables, ``DType`` for the dtype table TypeCvt carries,
    ``OperatorParam(<n>)`` for members Kiln's schema does not declare.
    """

    member: str
    buf: bytes
    pos: int

    @property
    def table(self) -> str:
        """The table name without the ``param_`` namespace prefix."""
        return self.member.removeprefix("param_")

    def read(self, cls: type[T]) -> T:
        """The table as an instance of the generated class ``cls``."""
        obj = cls()
        obj.Init(self.buf, self.pos)  # type: ignore[attr-defined]
        return obj


@dataclass
class MgeOpr:
    """One operator of the graph, in load order."""

    index: int
    type: str  # the C++ class name, e.g. "ConvBiasForward" (or "type_id 0x..." when unknown)
    family: str | None  # the converter key, e.g. "ConvBias"; None when the type is unknown
    name: str
    inputs: list[int]
    outputs: list[int]
    params: list[MgeParam]  # params[0] is the main param, then the additional ones
    tensors: list[MgeTensor]
    output_dtype: MgeDType | None = None

    @property
    def label(self) -> str:
        """The operator's name in messages (its index when it has none)."""
        return self.name or f"#{self.index}"


@dataclass
class MgeModel:
    """A whole parsed file."""

    format: str  # "FBS_V2", "FBS_V1 (MGBC)" or "FBS_V1 (MGBS)"
    version: str  # MegEngine version that wrote the file, e.g. "1.13.0"
    oprs: list[MgeOpr]
    var_names: dict[int, str]
    outputs: list[tuple[int, str]]  # (variable id, public name or "")
    metadata: dict[str, str] = field(default_factory=dict)
