"""Relax module -> compiled, exported shared library, through Kiln's own pipeline.

Pipeline: LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR (the
stock legalization; Kiln's kernels are opaque and stay whole), then Kiln's
generic schedule for every kernel not already hand-scheduled, then the stock
dataflow lowering and finalization.

CUDA targets: the same legalization and fusion with GPU schedules and nvcc
(:mod:`backends.tvm.cuda_build`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["kiln_pipeline", "staged_pipeline", "compile_module", "export"]


def staged_pipeline(
    target: TargetSpec,
    schedule: Callable[[], list[Any]],
    lowering: Any,
    legalize: dict[str, Callable[[Any, Any], Any]] | None = None,
) -> Any:
    """Legalize, fuse, then ``schedule()``'s passes, then ``lowering``'s dataflow and finalize passes.

    ``lowering`` is a TVM backend pipeline module (``cpu_generic`` or the CUDA one); the passes
    are built when the pipeline runs, under ``target``. ``legalize`` overrides Relax's
    legalization of some ops (CPU: the vectorizable exp/erf/tanh/sigmoid/softmax of
    :mod:`backends.tvm.kernels.fast_math`).
    """
    import tvm
    from tvm import relax

    tvm_target = target.tvm_target()

    @tvm.transform.module_pass(opt_level=0)
    def _pipeline(mod: Any, _ctx: Any) -> Any:
        passes = [
            relax.transform.LegalizeOps(customize_legalize_map=legalize),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            *schedule(),
            *lowering.dataflow_lower_passes(tvm_target),
            *lowering.finalize_passes(tvm_target),
        ]
        with tvm_target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def kiln_pipeline(target: TargetSpec, log: list[dict[str, str]] | None = None) -> Any:
    """The Relax pipeline Kiln compiles with (a ``tvm.transform.Pass``); the generic schedule appends
    the record of every function it schedules to ``log`` (:func:`backends.tvm.kernel_report.kernel_entry`)."""
    if target.kind == "cuda":
        from backends.tvm.cuda_build import cuda_pipeline

        return cuda_pipeline(target)
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from backends.tvm.kernels.fast_math import fast_legalize_map
    from backends.tvm.schedule_generic import KilnGenericSchedule

    return staged_pipeline(
        target, lambda: [KilnGenericSchedule(target, log)], cpu_generic, fast_legalize_map(target.lanes)
    )


def compile_module(mod: Any, target: TargetSpec, log: list[dict[str, str]] | None = None) -> Any:
    """Compile the Relax module for ``target``; returns the TVM Executable (CUDA: kernels built by nvcc).

    ``log`` receives the records of the functions the generic schedule scheduled (CPU targets).
    """
    import tvm

    from backends.tvm.runtime import configure_threads

    # Constant folding runs kernels: size the pool first, so TVM does not create its
    # default pool (which pins this thread to one core for everything after).
    configure_threads(None)

    executable = tvm.compile(mod, target=target.tvm_target(), relax_pipeline=kiln_pipeline(target, log))
    if target.kind == "cuda":
        from backends.tvm.cuda_build import build_cuda

        assert target.arch is not None
        build_cuda(executable, target.arch)  # nvcc: sm_XX SASS + PTX
    return executable


def export(executable: Any, path: Path, target: TargetSpec) -> None:
    """Write the shared library (cross-compiled with Debian's aarch64 toolchain for ARM).

    CUDA: the library plus nvcc's fatbin, PTX and the source's sha1
    (:func:`backends.tvm.cuda_build.export_cuda`); load with ``register_prebuilt_cuda`` first.
    """
    if target.kind == "cuda":
        from backends.tvm.cuda_build import export_cuda

        assert target.arch is not None
        export_cuda(executable, path, target.arch)
    elif target.is_arm:
        from tvm.support import cc

        executable.export_library(str(path), fcompile=cc.cross_compiler("aarch64-linux-gnu-g++"))
    else:
        executable.export_library(str(path))
