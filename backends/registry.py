"""The table of emitters: one entry per ``--emit`` kind.

Each emitter writes its files into the output directory and returns the
artifacts it made. Emitters are imported lazily so that, for example, an
ONNX-only compile never imports TVM.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compiler.errors import OptionError

if TYPE_CHECKING:
    from compiler.ir.graph import Graph
    from compiler.options import CompileOptions

__all__ = ["Artifact", "Emitter", "get_emitter", "emit_kinds"]


@dataclass(frozen=True)
class Artifact:
    """One file written by an emitter (path relative to the output directory)."""

    kind: str
    target: str
    path: str
    precision: str = "fp32"


Emitter = Callable[["Graph", Path, "CompileOptions"], list[Artifact]]

# kind -> "module:function"
_EMITTERS: dict[str, str] = {
    "onnx": "backends.onnx.emit:emit_onnx",
}


def emit_kinds() -> list[str]:
    """Every known --emit kind."""
    return sorted(_EMITTERS)


def get_emitter(kind: str) -> Emitter:
    """The emitter for ``kind`` (imports its backend on first use)."""
    spec = _EMITTERS.get(kind)
    if spec is None:
        raise OptionError(f"--emit {kind!r}: unknown kind (choose from {', '.join(emit_kinds())})")
    module, func = spec.split(":")
    fn: Emitter = getattr(importlib.import_module(module), func)
    return fn
