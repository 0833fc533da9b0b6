"""The op table: every Kiln op the MNN writer supports, with its lowering (data, by family)."""

from __future__ import annotations

from backends.mnn.lower import activation, conv, elementwise, linear, pooling, quant, resize, shape, slicing
from backends.mnn.lower.registry import Lowering

__all__ = ["LOWERINGS", "supported_ops"]

LOWERINGS: dict[str, Lowering] = {}
for _family in (activation, conv, linear, elementwise, pooling, quant, resize, shape, slicing):
    for _op, _lowering in _family.LOWERINGS.items():
        if _op in LOWERINGS:
            raise ValueError(f"two MNN lowerings for {_op}")
        LOWERINGS[_op] = _lowering


def supported_ops() -> list[str]:
    """Qualified Kiln op names the writer accepts, sorted."""
    return sorted(LOWERINGS)
