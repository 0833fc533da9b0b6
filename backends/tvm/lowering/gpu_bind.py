"""GPU thread binding for the TE functions a lowering rule builds itself (CUDA targets).

The CUDA pipeline gives every unscheduled PrimFunc dlight's rules, and refuses any function that
reaches codegen without a thread binding. A few of Kiln's own TE stages do not suit them: a
multi-stage function (an RNN step: a GEMV, then the gates) half-matches the matmul and GEMV rules
(which assert on it), and the fallback gives up on a block whose loops nest a data-dependent
reduction (RoiAlign's adaptive sampling grid). :func:`bind_gpu` schedules such a function before
it is added: dlight's fallback (spatial loops on blocks x threads, reductions serial in each
thread), else the outermost spatial loop nest of every root block fused and bound the same way.
The result is marked scheduled, so the pipeline's dlight pass leaves it alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec

__all__ = ["bind_gpu", "THREADS"]

THREADS = 256  # threads per block of the outer-nest binding


def _bind_outer(func: Any) -> Any:
    """Fuse the loops above each root block's first non-spatial statement and bind them."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    for block in sch.get_child_blocks(root):
        if any(int(iv.iter_type) != 0 for iv in sch.get(block).iter_vars):
            raise ValueError(f"{sch.get(block).name_hint}: not a spatial block")
        loops = sch.get_loops(block)
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        bx, tx = sch.split(fused, [None, THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return sch.mod["main"]


def bind_gpu(func: Any, target: TargetSpec) -> Any:
    """``func`` bound to GPU blocks and threads and marked scheduled (see the module docstring)."""
    from tvm.s_tir import dlight as dl

    from backends.tvm.cuda_build import SCHEDULED_ATTR

    sch = dl.gpu.Fallback().apply(func, target.tvm_target(), False)
    out = sch.mod["main"] if sch is not None else _bind_outer(func)
    return out.with_attr(SCHEDULED_ATTR, True)
