"""The Python API: load, optimize and save models.

Example::

    from compiler.api import PassManager, load_model, save_model
    g = load_model("m.onnx")
    PassManager(["fold-constants", "fold-batchnorm"]).run(g)
    save_model(g, "out.onnx")
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from compiler.instruments import DumpIR, NumericsCheck, PassTiming
from compiler.ir import Graph, print_graph, run_graph, verify
from compiler.pass_infra import Pass, PassContext, all_passes, register_pass
from compiler.pass_manager import FixedPoint, PassManager
from compiler.pattern import Any_, Const, Match, Op, Rule, apply_rules
from compiler.pipelines import PIPELINES
from compiler.rewriter import PassResult, Rewriter

__all__ = [
    "load_model",
    "save_model",
    "Graph",
    "print_graph",
    "run_graph",
    "verify",
    "Pass",
    "PassContext",
    "PassResult",
    "Rewriter",
    "register_pass",
    "all_passes",
    "PassManager",
    "FixedPoint",
    "PIPELINES",
    "Rule",
    "Op",
    "Any_",
    "Const",
    "Match",
    "apply_rules",
    "PassTiming",
    "DumpIR",
    "NumericsCheck",
]


def load_model(
    path: str | os.PathLike[str], *, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Import a model file (format picked by suffix or magic bytes)."""
    from compiler.plugins import load_model as _load

    return _load(Path(path), input_shapes=input_shapes)


def save_model(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write a graph to a file; the format follows the suffix (``.onnx``)."""
    p = Path(path)
    if p.suffix.lower() != ".onnx":
        from compiler.errors import OptionError

        raise OptionError(f"{p}: save_model writes .onnx files (use `kiln compile --emit` for other formats)")
    from compiler.onnx_export import save_onnx
    from compiler.output_dir import atomic_output_file

    with atomic_output_file(p) as tmp:
        save_onnx(graph, tmp)
