"""The table of emitters: one entry per ``--emit`` kind.

Each emitter writes its files into the output directory and returns the
artifacts it made. Emitters are imported lazily so that, for example, an
ONNX-only compile never imports TVM. Backends whose artifacts run in their own
runtime also register that runner here (``kiln run`` and verification use it).
:class:`Artifact` is :class:`compiler.backend.Artifact`, re-exported (one Artifact class).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from compiler.backend import Artifact
from compiler.errors import OptionError
from compiler.runners import Runner, register_runner

if TYPE_CHECKING:
    from compiler.ir.graph import Graph
    from compiler.options import CompileOptions

__all__ = ["Artifact", "Emitter", "get_emitter", "emit_kinds"]


Emitter = Callable[["Graph", Path, "CompileOptions"], list[Artifact]]

# kind -> "module:function"
_EMITTERS: dict[str, str] = {
    "onnx": "backends.onnx.emit:emit_onnx",
    "mnn": "backends.mnn.emit:emit_mnn",
    "cann": "backends.cann.emit:emit_cann",
}

# kind -> (file suffix, "module:function") of the runtime that runs the kind's artifacts.
# Registered with compiler.runners on import; the runtime module is imported on first use.
_RUNNERS: dict[str, tuple[str, str]] = {
    "mnn": (".mnn", "backends.mnn.runtime:run_mnn"),
    # No Ascend runtime here: Kiln reads the .om back and runs its ONNX export in onnxruntime.
    "cann": (".om", "backends.cann.runtime:run_om"),
    "tvm": (".so", "backends.tvm.runtime:run_tvm"),
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


def _lazy_runner(spec: str) -> Runner:
    def run(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        module, func = spec.split(":")
        fn: Runner = getattr(importlib.import_module(module), func)
        return fn(path, feeds)

    return run


for _kind, (_suffix, _spec) in _RUNNERS.items():
    register_runner(_kind, _suffix, _lazy_runner(_spec))
