"""The op table: every Kiln op the MNN writer supports, with its lowering (data, by family).

:data:`TABLE` is the :class:`~compiler.backend.CapabilityTable` the writer's support check,
its lowering lookup and ``BACKEND.capabilities`` share; :data:`WEIGHT_VIEWS` holds the weight
views of the layers whose weights MNN stores compressed (the mixed-precision planner's view).
"""

from __future__ import annotations

from backends.mnn.lower import (
    activation,
    compare,
    conv,
    elementwise,
    gelu,
    gru,
    indexing,
    linear,
    nms,
    normalization,
    pooling,
    quant,
    recurrent,
    resize,
    shape,
    slicing,
    weight_only,
)
from backends.mnn.lower.registry import LowerFn, Lowering, WeightFn
from compiler.backend import CapabilityTable

__all__ = ["TABLE", "WEIGHT_VIEWS", "supported_ops"]

_LOWERINGS: dict[str, Lowering] = {}
_FAMILIES = (
    activation,
    compare,
    conv,
    linear,
    nms,
    elementwise,
    gelu,
    gru,
    indexing,
    normalization,
    pooling,
    quant,
    recurrent,
    resize,
    shape,
    slicing,
    weight_only,
)
for _family in _FAMILIES:
    for _op, _lowering in _family.LOWERINGS.items():
        if _op in _LOWERINGS:
            raise ValueError(f"two MNN lowerings for {_op}")
        _LOWERINGS[_op] = _lowering

TABLE: CapabilityTable[LowerFn] = CapabilityTable("mnn", _LOWERINGS, requires_static=True)
WEIGHT_VIEWS: dict[str, WeightFn] = {op: e.weight for op, e in _LOWERINGS.items() if e.weight is not None}


def supported_ops() -> list[str]:
    """Qualified Kiln op names the writer accepts, sorted."""
    return TABLE.ops()
