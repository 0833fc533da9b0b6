"""The CUDA half of the TVM build: the CUDA Relax pipeline, nvcc, the prebuilt fatbin, GPU rebinding.

Pipeline: the stock legalization and fusion (shared with the CPU pipeline), then TVM's dlight GPU rules
(Matmul, GEMV, Reduction, GeneralReduction, Fallback; a rule that raises counts as not applicable)
for every PrimFunc not marked ``tirx.is_scheduled`` (Kiln's CUDA kernels carry it; CPU-scheduled
Kiln kernels get their parallel loops bound to GPU blocks first), a check that every kernel is
thread-bound, then the stock CUDA dataflow lowering and finalization. nvcc builds the kernels' CUDA
C at compile time into a fatbin (SASS + PTX) exported beside the library and handed to TVM's loader
by :func:`register_prebuilt_cuda`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = [
    "cuda_pipeline",
    "SCHEDULED_ATTR",
    "compile_cuda_source",
    "cuda_source",
    "cuda_ptx",
    "build_cuda",
    "export_cuda",
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


_DECLINE = (AssertionError, ValueError, IndexError, KeyError, RuntimeError)


def _declining(rule: Any) -> Any:
    """``rule`` as a dlight rule that declines (returns None) where it raises: TVM 0.27's GEMV and
    Matmul rules assert on functions they do not match (a fused log-sum-exp, a multi-stage RNN step)
    instead of returning None, which stops ApplyDefaultSchedule before the rules after them."""
    from tvm.s_tir import dlight as dl

    def apply(func: Any, target: Any, tunable: bool) -> Any:
        try:
            return rule.apply(func, target, tunable)
        except _DECLINE:
            return None

    return dl.ScheduleRule.from_callable(type(rule).__name__)(apply)


def cuda_pipeline(target: TargetSpec) -> Any:
    """The Relax pipeline for CUDA targets: legalize, fuse, dlight GPU schedules, CUDA lowering."""
    from tvm.relax.backend.cuda import pipeline as cuda_generic
    from tvm.s_tir import dlight as dl

    from backends.tvm.build import staged_pipeline

    def schedule() -> list[Any]:
        rules = tuple(
            _declining(r)
            for r in (
                dl.gpu.Matmul(),
                dl.gpu.GEMV(),
                dl.gpu.Reduction(),
                dl.gpu.GeneralReduction(),
                dl.gpu.Fallback(),
            )
        )
        return [_protect_scheduled(), dl.ApplyDefaultSchedule(*rules), _check_bound()]

    return staged_pipeline(target, schedule, cuda_generic)


def build_cuda(executable: Any, arch: str) -> None:
    """nvcc-build ``executable``'s kernels for ``arch`` now (SASS + PTX, kept for :func:`export_cuda`)."""
    compile_cuda_source(cuda_source(executable), arch)


def export_cuda(executable: Any, path: Path, arch: str) -> None:
    """Write the library, ``<stem>.fatbin`` (nvcc's SASS and PTX), ``<stem>.ptx`` and ``<stem>.cuda.sha1``."""
    code = cuda_source(executable)
    fatbin, ptx = compile_cuda_source(code, arch)
    path.with_suffix(".fatbin").write_bytes(fatbin)
    path.with_suffix(".ptx").write_text(ptx)
    path.with_suffix(".cuda.sha1").write_text(source_key(code) + "\n")
    executable.export_library(str(path))
