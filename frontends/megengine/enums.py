"""Names of enum values in the generated param classes (``ConvolutionFormat`` 7 -> ``"NCHW44"``)."""

from __future__ import annotations

from functools import cache

__all__ = ["enum_name", "enum_names"]


@cache
def enum_names(cls: type) -> dict[int, str]:
    """Value -> name of a generated enum class."""
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


def enum_name(cls: type, value: int) -> str:
    """The name of ``value`` in enum ``cls``; ValueError for values the schema does not know."""
    try:
        return enum_names(cls)[int(value)]
    except KeyError:
        raise ValueError(f"unknown {cls.__name__} value {value}") from None
