"""The TVM backend (``--target cpu|x86-avx2|x86-avx512|arm|arm-dotprod|cuda[:sm_XX]``) as a Backend.

Its op table is :func:`backends.tvm.lowering.table.capabilities` (the ``@lowers`` rules
with their checks), its legalization :func:`compiler.pipelines.tvm_legalization` for the
target's :class:`TargetSpec` (blocked layouts ``lanes`` wide on CPU targets), and its
runtime TVM's VM (:func:`backends.tvm.runtime.run_tvm`). It has no options of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from backends.tvm.target import TARGET_NAMES, TargetSpec, resolve_target
from compiler.backend import Artifact, BackendBase, CapabilityTable

if TYPE_CHECKING:
    from backends.tvm.lowering.table import Rule
    from compiler.ir.graph import Graph
    from compiler.options import CompileOptions
    from compiler.pass_infra import PassContext
    from compiler.pass_manager import PipelineItem

__all__ = ["BACKEND", "TvmBackend", "legalization_for"]


def legalization_for(spec: TargetSpec) -> list[PipelineItem]:
    """The legalization pipeline of one target (choose-layout only on CPU targets)."""
    from compiler import pipelines

    return pipelines.tvm_legalization(spec.name, spec.lanes if spec.is_cpu else None)


@dataclass
class TvmBackend(BackendBase):
    """``--target``: one shared library per target."""

    def targets(self) -> list[str]:
        """The ``--target`` names, and the ``cuda:sm_XX`` form."""
        return [*TARGET_NAMES, "cuda:sm_XX"]

    def resolve(self, value: str) -> str:
        """The canonical target name; OptionError for an unknown one (or ``cpu`` without AVX2)."""
        return resolve_target(value).name

    def capabilities(self, target: str) -> CapabilityTable[Rule]:
        """The TVM op table (one for every target)."""
        from backends.tvm.lowering.table import capabilities

        return capabilities()

    def legalization(self, target: str, options: CompileOptions | None) -> list[PipelineItem]:
        """:func:`compiler.pipelines.tvm_legalization` for ``target``."""
        return legalization_for(resolve_target(target))

    def emit(self, graph: Graph, out_dir: Path, ctx: PassContext, target: str) -> list[Artifact]:
        """Compile the legalized ``graph`` and write ``<target>/model.so`` plus ``model.json``."""
        from backends.tvm.emit import write_tvm

        return write_tvm(graph, out_dir, ctx.options, target)


BACKEND = TvmBackend(name="tvm", flag="--target", runtime=(".so", "backends.tvm.runtime:run_tvm"))
