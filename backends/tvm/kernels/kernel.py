"""What every Kiln kernel rule returns: a scheduled PrimFunc plus its output type.

A kernel's PrimFunc takes its inputs in order, then its output buffer last
(destination-passing style, as ``relax.call_tir`` calls it). It carries the
function attribute ``kiln.scheduled`` (the rule) so the generic rule leaves it alone,
``kiln.op_class`` and ``kiln.isa`` (which op class it serves and which instruction path
its schedule uses: the "which kernel ran" report of :mod:`backends.tvm.kernel_report`), and
``op_pattern`` = opaque so Relax's FuseOps never merges it with neighbours.
"""

from __future__ import annotations

import hashlib
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["Kernel", "spec_key", "mark_scheduled", "OPAQUE_PATTERN", "simd_isa", "INT8_DOT_ISA", "ISA_PATHS"]

OPAQUE_PATTERN = 8  # relax OpPatternKind.kOpaque

# The instruction paths a schedule can use. "generic": no ISA-specific code (Kiln's generic
# schedule, vectorized for the target's width by LLVM).
ISA_PATHS = ("vnni", "avx512", "avx2", "sdot", "neon", "dp4a", "cuda", "generic")

# int8 dot kind (conv2d_int8.dot_kind) -> the instruction path it runs on
INT8_DOT_ISA = {"vnni": "vnni", "avx2": "avx2", "sdot": "sdot", "neon": "neon", "plain": "generic"}


def spec_key(spec: Any) -> str:
    """A short deterministic hash of every field of the dataclass ``spec`` (a kernel name's suffix)."""
    return hashlib.sha1(repr(astuple(spec)).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Kernel:
    """A scheduled kernel: ``name`` is deterministic and unique per spec (it becomes the symbol)."""

    name: str
    func: Any  # tvm.tirx.PrimFunc
    out_shape: tuple[int, ...]
    out_dtype: str


def simd_isa(target: TargetSpec) -> str:
    """The fp32 SIMD path of ``target``'s vector kernels: avx512, avx2, neon or cuda."""
    if target.kind == "cuda":
        return "cuda"
    if target.is_arm:
        return "neon"
    return "avx512" if target.lanes >= 16 else "avx2"


def mark_scheduled(func: Any, rule: str, op_class: str, isa: str) -> Any:
    """``func`` with the attributes that protect a hand-scheduled kernel from later passes and
    record what it is (``op_class``: conv, depthwise_conv, dense, pooling...; ``isa``: one of
    :data:`ISA_PATHS`)."""
    if isa not in ISA_PATHS:
        raise ValueError(f"unknown ISA path {isa!r} (choose from {', '.join(ISA_PATHS)})")
    return func.with_attrs(
        {
            "kiln.scheduled": rule,
            "kiln.op_class": op_class,
            "kiln.isa": isa,
            "op_pattern": OPAQUE_PATTERN,
            "tirx.noalias": True,
        }
    )
