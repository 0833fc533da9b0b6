"""The ONNX backend object (``--emit onnx``): ``model.onnx`` through :mod:`compiler.onnx_export`.

Its artifacts run in onnxruntime, the default runner of :mod:`compiler.runners` (``runtime``
None). It needs no legalization and no static shapes; it writes every default-domain op of the
op registry as itself, and a Kiln-domain op (``kiln::FusedConv``, ``kiln::QConv``...) only
through its ``OpDef.expand`` into standard ops: one without an expansion has no ONNX form.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from compiler.backend import Artifact, BackendBase, CapabilityTable, OpSupport
from compiler.ops.registry import OpDef, all_ops

if TYPE_CHECKING:
    from compiler.ir.graph import Graph
    from compiler.pass_infra import PassContext

__all__ = ["BACKEND", "OnnxBackend", "onnx_table"]


@cache
def onnx_table() -> CapabilityTable[OpDef]:
    """Every registered op the exporter can write (``lower`` is its OpDef; dynamic shapes allowed)."""
    entries = {d.qualified: OpSupport(d) for d in all_ops() if not d.domain or d.expand is not None}
    return CapabilityTable("onnx", entries, requires_static=False)


class OnnxBackend(BackendBase):
    """``model.onnx`` (IR 10, opset 21), run by onnxruntime."""

    def capabilities(self, target: str) -> CapabilityTable[OpDef]:
        """The ops the ONNX exporter writes (:func:`onnx_table`)."""
        return onnx_table()

    def emit(self, graph: Graph, out_dir: Path, ctx: PassContext, target: str) -> list[Artifact]:
        """Export the optimized graph to ``out_dir/model.onnx`` (see :mod:`backends.onnx.emit`)."""
        from backends.onnx.emit import emit_onnx

        return emit_onnx(graph, out_dir, ctx.options)


BACKEND = OnnxBackend(name="onnx", flag="--emit", runtime=None, legalization_pipeline="legalize-onnx")
