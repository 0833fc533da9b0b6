"""Relax module -> compiled, exported shared library, through Kiln's own pipeline.

Pipeline: LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR (the
stock legalization; Kiln's kernels are opaque and stay whole), then Kiln's
generic schedule for every kernel not already hand-scheduled, then the stock
dataflow lowering and finalization.

CUDA targets: the same legalization and fusion, then TVM's dlight GPU rules
(Matmul, GEMV, Reduction, GeneralReduction, Fallback) for every PrimFunc not
marked ``tirx.is_scheduled`` (Kiln's CUDA kernels carry it), then the stock
CUDA dataflow lowering and finalization.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = [
    "kiln_pipeline",
    "compile_module",
    "export",
    "cuda_pipeline",
    "SCHEDULED_ATTR",
    "compile_cuda_source",
    "cuda_source",
    "cuda_ptx",
    "register_prebuilt_cuda",
    "source_key",
    "unbound_kernels",
]

SCHEDULED_ATTR = "tirx.is_scheduled"  # the function attribute dlight skips (TVM 0.27)


_BUILT: dict[str, tuple[bytes, str]] = {}  # arch:sha1 of CUDA source -> (fatbin, PTX) built in this process


def _nvcc(args: list[str], cwd: Path) -> None:
    import subprocess

    proc = subprocess.run(["nvcc", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc {' '.join(args)} failed:\n{proc.stderr[-4000:]}")


def source_key(code: str) -> str:
    """The sha1 naming one CUDA source (the prebuilt fatbin is matched to its source by it)."""
    import hashlib

    return hashlib.sha1(code.encode()).hexdigest()


def compile_cuda_source(code: str, arch: str) -> tuple[bytes, str]:
    """CUDA C source -> (fatbin holding ``arch`` SASS plus its PTX, the PTX text), via nvcc (no fast math)."""
    import tempfile

    key = f"{arch}:{source_key(code)}"
    if key in _BUILT:
        return _BUILT[key]
    num = arch.removeprefix("sm_")
    with tempfile.TemporaryDirectory(prefix="kiln_nvcc_") as tmp:
        d = Path(tmp)
        (d / "k.cu").write_text(code)
        _nvcc(["--ptx", "-O3", f"-arch=compute_{num}", "-o", "k.ptx", "k.cu"], d)
        ptx = (d / "k.ptx").read_text()
        gencode = f"arch=compute_{num},code=[sm_{num},compute_{num}]"
        _nvcc(["--fatbin", "-O3", "-gencode", gencode, "-o", "k.fatbin", "k.ptx"], d)
        fatbin = (d / "k.fatbin").read_bytes()
    _BUILT[key] = (fatbin, ptx)
    return fatbin, ptx


def cuda_source(executable: Any) -> str:
    """The CUDA C source of every kernel in a compiled CUDA executable ("" if none)."""
    todo = [executable.mod]
    while todo:
        m = todo.pop()
        if m.kind == "cuda":
            return str(m.inspect_source("cuda"))
        todo.extend(m.imports)
    return ""


def cuda_ptx(executable: Any, arch: str) -> str:
    """The PTX nvcc made for ``executable``'s kernels (built again if this process has not)."""
    return compile_cuda_source(cuda_source(executable), arch)[1]


def register_prebuilt_cuda(library: Path) -> None:
    """Make TVM's CUDA loader use the fatbin exported beside ``library`` (``<stem>.fatbin``).

    TVM 0.27 keeps CUDA kernels as source inside the library and compiles them when the
    library is loaded (``tvm_callback_cuda_compile``); Kiln builds them with nvcc at compile
    time, so the loader is given that fatbin (matched by the source's sha1) instead. A source
    with no prebuilt fatbin raises.
    """
    import tvm_ffi

    library = Path(library)
    fatbin = library.with_suffix(".fatbin").read_bytes()
    key = library.with_suffix(".cuda.sha1").read_text().strip()

    def _compile(code: Any, *_rest: Any) -> bytes:
        got = source_key(str(code))
        if got != key:
            raise RuntimeError(f"{library}: CUDA source {got} has no prebuilt fatbin (expected {key})")
        return fatbin

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", _compile, override=True)


# CPU rules whose outermost loop is a fused spatial loop even when not marked parallel
_SPATIAL_OUTER = frozenset({"dense"})


def _gpu_rebind(func: Any) -> Any:
    """A CPU-scheduled Kiln kernel made runnable on the GPU (rules with no CUDA variant).

    Its parallel loops (independent iterations by construction; for ``_SPATIAL_OUTER`` rules the
    outermost loop) become ``blockIdx.x`` loops, vectorize and unroll become serial (one thread per
    block: correct, not fast). Done on the
    TVMScript text: TVM 0.27 has no Python statement mutator, and ``sch.bind`` refuses the
    decomposed reductions these kernels hold. Without such a loop it raises NotImplementedError.
    """
    import re

    from tvm.script import from_source

    text = func.script()
    bound = re.subn(r"\bT\.parallel\((\w+)\)", r'T.thread_binding(\1, thread="blockIdx.x")', text)
    text, n = bound
    text = re.sub(r"\bT\.(vectorized|unroll)\(", "T.serial(", text)
    if n == 0 and str(func.attrs["kiln.scheduled"]) in _SPATIAL_OUTER:
        text, n = re.subn(
            r"for (\w+) in (?:range|T\.serial)\((\w+)\):",
            r'for \1 in T.thread_binding(\2, thread="blockIdx.x"):',
            text,
            count=1,
        )
    if n == 0:
        raise NotImplementedError(f"{func.attrs['global_symbol']}: no GPU variant and no parallel loop")
    return from_source(text).with_attrs(dict(func.attrs))


def _protect_scheduled() -> Any:
    """Kiln kernels for CUDA: GPU-scheduled ones keep ``tirx.is_scheduled`` (dlight skips them);
    CPU-scheduled ones (rules with no CUDA variant) get their parallel loops bound to GPU threads."""
    import tvm
    from tvm import tirx

    @tvm.transform.module_pass(opt_level=0, name="KilnProtectScheduled")
    def _protect(mod: Any, _ctx: Any) -> Any:
        updates = {}
        for gv, func in mod.functions_items():
            kiln = isinstance(func, tirx.PrimFunc) and "kiln.scheduled" in func.attrs
            if kiln and SCHEDULED_ATTR not in func.attrs:
                updates[gv] = _gpu_rebind(func).with_attr(SCHEDULED_ATTR, True)
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return _protect


def unbound_kernels(mod: Any) -> list[str]:
    """PrimFuncs in ``mod`` with stores but no blockIdx/threadIdx binding (they would run on one thread)."""
    from tvm import tirx

    bad = []
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        text = func.script()
        if "T.launch_thread" in text or "threadIdx" in text or "blockIdx" in text:
            continue
        if "] = " in text:  # writes memory without any GPU thread binding
            bad.append(gv.name_hint)
    return bad


def _check_bound() -> Any:
    """A pass failing when a PrimFunc reaches CUDA codegen without a GPU schedule."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="KilnCheckGpuBound")
    def _check(mod: Any, _ctx: Any) -> Any:
        bad = unbound_kernels(mod)
        if bad:
            raise RuntimeError(f"CUDA kernels without a thread-bound schedule: {', '.join(sorted(bad))}")
        return mod

    return _check


def cuda_pipeline(target: TargetSpec) -> Any:
    """The Relax pipeline for CUDA targets: legalize, fuse, dlight GPU schedules, CUDA lowering."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cuda import pipeline as cuda_generic
    from tvm.s_tir import dlight as dl

    tvm_target = target.tvm_target()

    @tvm.transform.module_pass(opt_level=0)
    def _pipeline(mod: Any, _ctx: Any) -> Any:
        passes = [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            _protect_scheduled(),
            dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(),
                dl.gpu.GEMV(),
                dl.gpu.Reduction(),
                dl.gpu.GeneralReduction(),
                dl.gpu.Fallback(),
            ),
            _check_bound(),
            *cuda_generic.dataflow_lower_passes(tvm_target),
            *cuda_generic.finalize_passes(tvm_target),
        ]
        with tvm_target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def kiln_pipeline(target: TargetSpec) -> Any:
    """The Relax pipeline Kiln compiles with (a ``tvm.transform.Pass``)."""
    if target.kind == "cuda":
        return cuda_pipeline(target)
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

    if target.kind == "cuda":
        assert target.arch is not None
        executable = tvm.compile(mod, target=target.tvm_target(), relax_pipeline=kiln_pipeline(target))
        compile_cuda_source(cuda_source(executable), target.arch)  # nvcc: sm_XX SASS + PTX
        return executable
    return tvm.compile(mod, target=target.tvm_target(), relax_pipeline=kiln_pipeline(target))


def export(executable: Any, path: Path, target: TargetSpec) -> None:
    """Write the shared library (cross-compiled with Debian's aarch64 toolchain for ARM).

    CUDA: the library plus ``<stem>.fatbin`` (nvcc's sm_XX SASS and PTX), ``<stem>.ptx`` and
    ``<stem>.cuda.sha1``; load with :func:`register_prebuilt_cuda` first.
    """
    if target.kind == "cuda":
        assert target.arch is not None
        code = cuda_source(executable)
        fatbin, ptx = compile_cuda_source(code, target.arch)
        path.with_suffix(".fatbin").write_bytes(fatbin)
        path.with_suffix(".ptx").write_text(ptx)
        path.with_suffix(".cuda.sha1").write_text(source_key(code) + "\n")
        executable.export_library(str(path))
    elif target.is_arm:
        from tvm.support import cc

        executable.export_library(str(path), fcompile=cc.cross_compiler("aarch64-linux-gnu-g++"))
    else:
        executable.export_library(str(path))
