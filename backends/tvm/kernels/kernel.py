"""What every Kiln kernel rule returns: a scheduled PrimFunc plus its output type.

A kernel's PrimFunc takes its inputs in order, then its output buffer last
(destination-passing style, as ``relax.call_tir`` calls it). It carries the
function attribute ``kiln.scheduled`` so the generic rule leaves it alone, and
``op_pattern`` = opaque so Relax's FuseOps never merges it with neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Kernel", "mark_scheduled", "OPAQUE_PATTERN"]

OPAQUE_PATTERN = 8  # relax OpPatternKind.kOpaque


@dataclass(frozen=True)
class Kernel:
    """A scheduled kernel: ``name`` is deterministic and unique per spec (it becomes the symbol)."""

    name: str
    func: Any  # tvm.tirx.PrimFunc
    out_shape: tuple[int, ...]
    out_dtype: str


def mark_scheduled(func: Any, rule: str) -> Any:
    """``func`` with the attributes that protect a hand-scheduled kernel from later passes."""

    return func.with_attrs({"kiln.scheduled": rule, "op_pattern": OPAQUE_PATTERN, "tirx.noalias": True})
