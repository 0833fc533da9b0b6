"""Relax module -> compiled, exported shared library, through Kiln's own pipeline.

Pipeline: LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR (the
stock legalization; Kiln's kernels are opaque and stay whole), then Kiln's
generic schedule for every kernel not already hand-scheduled, then the stock
dataflow lowering and finalization.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["kiln_pipeline", "compile_module", "export"]


def kiln_pipeline(target: TargetSpec) -> Any:
    """The Relax pipeline Kiln compiles with (a ``tvm.transform.Pass``)."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from backends.tvm.schedule_generic import KilnGenericSchedule

    tvm_target = target.tvm_target()

    @tvm.transform.module_pass(opt_level=0)
    def _pipeline(mod: Any, _ctx: Any) -> Any:
        passes = [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            KilnGenericSchedule(target),
            *cpu_generic.dataflow_lower_passes(tvm_target),
            *cpu_generic.finalize_passes(tvm_target),
        ]
        with tvm_target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def compile_module(mod: Any, target: TargetSpec) -> Any:
    """Compile the Relax module for ``target``; returns the TVM Executable."""
    import tvm

    from backends.tvm.runtime import configure_threads

    # Constant folding runs kernels: size the pool first, so TVM does not create its
    # default pool (which pins this thread to one core for everything after).
    configure_threads(None)

    return tvm.compile(mod, target=target.tvm_target(), relax_pipeline=kiln_pipeline(target))


def export(executable: Any, path: Path, target: TargetSpec) -> None:
    """Write the shared library (cross-compiled with Debian's aarch64 toolchain for ARM)."""
    if target.is_arm:
        from tvm.support import cc

        executable.export_library(str(path), fcompile=cc.cross_compiler("aarch64-linux-gnu-g++"))
    else:
        executable.export_library(str(path))
