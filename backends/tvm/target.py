"""TVM targets Kiln compiles for, as data: ISA features decide the schedule rules.

``--target`` names: ``cpu`` (the host, detected), ``x86-avx2``, ``x86-avx512``, ``arm``,
``arm-dotprod``, ``cuda`` (sm_90), ``cuda:sm_XX``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compiler.errors import OptionError

if TYPE_CHECKING:
    import tvm

__all__ = ["TargetSpec", "resolve_target", "host_target", "TARGET_NAMES"]

TARGET_NAMES = ("cpu", "x86-avx2", "x86-avx512", "arm", "arm-dotprod", "cuda")


@dataclass(frozen=True)
class TargetSpec:
    """What Kiln needs to know about a target to pick layouts and schedules.

    ``lanes`` is the fp32 SIMD width; ``int8_dot`` names the int8 dot-product
    instruction family the int8 rules use ("vnni", "avx2", "dotprod", "neon", "dp4a").
    """

    name: str
    kind: str  # "llvm" | "cuda"
    lanes: int
    int8_dot: str
    mcpu: str | None = None
    mtriple: str | None = None
    mattr: tuple[str, ...] = ()
    arch: str | None = None  # cuda: "sm_90"
    num_cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))

    @property
    def is_cpu(self) -> bool:
        """True for LLVM CPU targets (x86 and ARM)."""
        return self.kind == "llvm"

    @property
    def is_arm(self) -> bool:
        """True for aarch64 targets (cross-compiled)."""
        return bool(self.mtriple and self.mtriple.startswith("aarch64"))

    def tvm_config(self) -> dict[str, Any]:
        """The JSON-dict form TVM 0.27 accepts (the CLI string form raises)."""
        cfg: dict[str, Any] = {"kind": self.kind}
        if self.kind == "llvm":
            cfg["num-cores"] = self.num_cores
        if self.mcpu:
            cfg["mcpu"] = self.mcpu
        if self.mtriple:
            cfg["mtriple"] = self.mtriple
        if self.mattr:
            cfg["mattr"] = list(self.mattr)
        if self.arch:
            cfg["arch"] = self.arch
        if self.kind == "cuda":  # sm_80 and sm_90 both: 48 KiB static shared memory per block
            cfg["max_shared_memory_per_block"] = 49152
            cfg["thread_warp_size"] = 32
        return cfg

    def tvm_target(self) -> tvm.target.Target:
        """The ``tvm.target.Target`` for this spec."""
        import tvm

        return tvm.target.Target(self.tvm_config())

    def manifest_view(self) -> dict[str, Any]:
        """As recorded in the manifest (no core count: artifacts must not depend on the machine)."""
        d = self.tvm_config()
        d.pop("num-cores", None)
        return {"name": self.name, "lanes": self.lanes, "int8_dot": self.int8_dot, "tvm": d}


# mcpu values LLVM 22 knows; never "native" (TVM 0.27 silently falls back to generic x86-64).
_X86_AVX2 = TargetSpec("x86-avx2", "llvm", 8, "avx2", mcpu="core-avx2")
_X86_AVX512 = TargetSpec("x86-avx512", "llvm", 16, "vnni", mcpu="icelake-server")
_ARM = TargetSpec("arm", "llvm", 4, "neon", mtriple="aarch64-linux-gnu", mattr=("+neon",))
_ARM_DOT = TargetSpec(
    "arm-dotprod", "llvm", 4, "dotprod", mtriple="aarch64-linux-gnu", mattr=("+neon", "+v8.2a", "+dotprod")
)


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def host_target(flags: set[str] | None = None) -> TargetSpec:
    """The host's x86 target from its CPU flags (AVX-512 with VNNI, else AVX2)."""
    f = _cpu_flags() if flags is None else flags
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= f:
        return replace(_X86_AVX512, name="cpu")
    if {"avx2", "fma"} <= f:
        return replace(_X86_AVX2, name="cpu")
    raise OptionError("--target cpu: this host has no AVX2+FMA; Kiln's x86 rules need at least AVX2")


def resolve_target(name: str) -> TargetSpec:
    """The spec for a ``--target`` name; raises OptionError naming the choices."""
    if name == "cpu":
        return host_target()
    fixed = {t.name: t for t in (_X86_AVX2, _X86_AVX512, _ARM, _ARM_DOT)}
    if name in fixed:
        return fixed[name]
    if name == "cuda" or name.startswith("cuda:"):
        arch = name.partition(":")[2] or "sm_90"
        if not (arch.startswith("sm_") and arch[3:].isdigit() and int(arch[3:]) >= 61):
            raise OptionError(f"--target {name!r}: CUDA arch must look like sm_80 or sm_90 (sm_61 or newer)")
        return TargetSpec(name if ":" in name else "cuda", "cuda", 32, "dp4a", arch=arch, num_cores=1)
    raise OptionError(f"--target {name!r}: unknown target (choose from {', '.join(TARGET_NAMES)}[:sm_XX])")


def why_not_runnable_here(spec: TargetSpec, flags: set[str] | None = None) -> str:
    """Why this machine cannot execute ``spec``'s artifacts ("" if it can)."""
    if spec.kind == "cuda":
        return "needs a CUDA GPU (scripts/gpu_check.sh runs it where one is lent)"
    if spec.is_arm:
        return "aarch64 library: run it on a board or the emulator over TVM RPC (kiln run --rpc)"
    f = _cpu_flags() if flags is None else flags
    need = {"avx512f", "avx512bw", "avx512vl"} if spec.lanes == 16 else {"avx2", "fma"}
    if spec.int8_dot == "vnni":
        need.add("avx512_vnni")
    missing = sorted(need - f)
    return f"this CPU lacks {', '.join(missing)}" if missing else ""
