"""Named pass pipelines, all in one place, and the driver's ``optimize`` step."""

from __future__ import annotations

from pathlib import Path

from compiler.instruments import DumpIR, Instrument, PassTiming
from compiler.ir.graph import Graph
from compiler.options import CompileOptions
from compiler.pass_infra import PassContext
from compiler.pass_manager import FixedPoint, PassManager, PipelineItem

__all__ = ["PIPELINES", "pipeline", "optimize"]

_BATCHNORM = FixedPoint(
    ("fold-batchnorm", "fold-constants", "eliminate-dead-nodes"), max_steps=8, name="batchnorm"
)
_CLEANUP = FixedPoint(
    ("fold-constants", "deduplicate-constants", "eliminate-identities", "eliminate-dead-nodes"),
    max_steps=8,
    name="cleanup",
)

PIPELINES: dict[str, list[PipelineItem]] = {
    "none": [],
    "cleanup": [_CLEANUP],
    # The default pipeline without canonicalize, whose hard-swish/hard-sigmoid rewrites are exact in
    # math but not in float32 rounding (pan: 5e-5): for checks that need the source model's numerics.
    "exact": [
        _CLEANUP,
        _BATCHNORM,
        "fuse-conv-bias-act",
        _CLEANUP,
    ],
    "default": [
        _CLEANUP,
        "canonicalize",
        _BATCHNORM,
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


def describe_pipeline(name: str) -> str:
    """A pipeline as one line of text."""

    def item(i: PipelineItem) -> str:
        if isinstance(i, FixedPoint):
            return f"{i.name}(" + ",".join(item(p) for p in i.passes) + ")"
        return i if isinstance(i, str) else i.spec()

    return ", ".join(item(i) for i in pipeline(name)) or "(no passes)"


def run_passes(
    graph: Graph,
    passes: str | None,
    pipeline_name: str,
    dump_ir: Path | None,
    options: CompileOptions | None = None,
) -> PassTiming:
    """Run a pipeline string (or else the named pipeline) with timing and optional IR dumps."""
    items: list[PipelineItem] = [passes] if passes else pipeline(pipeline_name)
    timing = PassTiming()
    instruments: list[Instrument] = [timing]
    if dump_ir is not None:
        instruments.append(DumpIR(dump_ir))
    PassManager(items, PassContext(verify_each=True, options=options), instruments).run(graph)
    return timing


def optimize(graph: Graph, options: CompileOptions) -> PassTiming:
    """The driver's optimize step: the options' pipeline with its instruments."""
    return run_passes(graph, options.passes, options.pipeline, options.dump_ir, options)
