"""The ONNX emitter: writes ``model.onnx`` into the output directory."""

from __future__ import annotations

from pathlib import Path

from compiler.backend import Artifact
from compiler.ir.graph import Graph
from compiler.onnx_export import save_onnx
from compiler.options import CompileOptions

__all__ = ["emit_onnx"]


def emit_onnx(graph: Graph, out_dir: Path, options: CompileOptions) -> list[Artifact]:
    """Export the optimized graph to ONNX."""
    save_onnx(graph, out_dir / "model.onnx")
    return [Artifact(kind="onnx", target="onnxruntime", path="model.onnx", precision=options.precision)]
