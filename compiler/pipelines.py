"""Named pass pipelines, all in one place, and the driver's ``optimize`` step."""

from __future__ import annotations

from compiler.instruments import DumpIR, Instrument, PassTiming
from compiler.ir.graph import Graph
from compiler.options import CompileOptions
from compiler.pass_infra import PassContext
from compiler.pass_manager import FixedPoint, PassManager, PipelineItem

__all__ = ["PIPELINES", "pipeline", "optimize"]

_CLEANUP = FixedPoint(("fold-constants", "eliminate-identities", "eliminate-dead-nodes"), max_steps=8, name="cleanup")

PIPELINES: dict[str, list[PipelineItem]] = {
    "none": [],
    "cleanup": [_CLEANUP],
    "default": [
        _CLEANUP,
        "canonicalize",
        FixedPoint(("fold-batchnorm", "fold-constants", "eliminate-dead-nodes"), max_steps=8, name="batchnorm"),
        "fuse-conv-bias-act",
        _CLEANUP,
    ],
}


def pipeline(name: str) -> list[PipelineItem]:
    """The named pipeline."""
    from compiler.errors import OptionError

    if name not in PIPELINES:
        raise OptionError(f"unknown pipeline {name!r} (choose from {', '.join(sorted(PIPELINES))})")
    return list(PIPELINES[name])


def optimize(graph: Graph, options: CompileOptions) -> list[tuple[str, float]]:
    """Run ``options.passes`` (a pipeline string) or the named pipeline; returns per-pass timings."""
    items: list[PipelineItem] = [options.passes] if options.passes else pipeline(options.pipeline)
    timing = PassTiming()
    instruments: list[Instrument] = [timing]
    if options.dump_ir is not None:
        instruments.append(DumpIR(options.dump_ir))
    PassManager(items, PassContext(verify_each=True, options=options), instruments).run(graph)
    return timing.timings
