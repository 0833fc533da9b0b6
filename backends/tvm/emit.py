"""``--target``: compile the legalized graph with TVM into ``OUT/<target>/model.so``.

The graph arrives legalized (``BACKEND.legalization``, run by the driver on a clone:
int8 QDQ regions become kiln::QConv integer kernels, choose-layout picks blocked
layouts for the target's SIMD width); :func:`write_tvm` lowers it to Relax,
compiles it with Kiln's schedules and exports it. ``model.json`` beside the
library names the inputs and outputs for ``kiln run`` / ``kiln bench`` and, like the manifest,
holds the ``kernel_report`` (per op class, the schedules used and their ISA paths:
:mod:`backends.tvm.kernel_report`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.tvm.target import TargetSpec, resolve_target, why_not_runnable_here
from compiler.backend import Artifact

if TYPE_CHECKING:
    from compiler.ir.graph import Graph
    from compiler.options import CompileOptions

__all__ = ["write_tvm", "prepare_graph", "LIBRARY", "META"]

log = logging.getLogger(__name__)

LIBRARY = "model.so"
META = "model.json"


def _target_dir(name: str) -> str:
    return name.replace(":", "_")


def prepare_graph(graph: Graph, target: TargetSpec) -> tuple[Graph, list[dict[str, Any]]]:
    """The target's legalization (``BACKEND.legalization``) on a clone, and its layout decisions."""
    from backends.tvm.backend import legalization_for
    from compiler.pass_manager import PassManager
    from passes.choose_layout import layout_decisions

    g = graph.clone()
    PassManager(legalization_for(target)).run(g)
    return g, layout_decisions(g)


def write_tvm(graph: Graph, out_dir: Path, options: CompileOptions, target_name: str) -> list[Artifact]:
    """Compile the legalized ``graph`` for one ``--target``; write its library plus ``model.json``."""
    from backends.tvm.build import compile_module, export
    from backends.tvm.kernel_report import kernel_report
    from backends.tvm.lower import lower_graph
    from compiler.calibration.progress import Progress
    from compiler.ir.verifier import verify
    from passes.choose_layout import layout_decisions

    target = resolve_target(target_name)
    t0 = time.perf_counter()
    decisions = layout_decisions(graph)
    verify(graph)
    with Progress(len(graph.ops()), f"building kernels for {target.name}", enabled=options.progress) as bar:
        lowered = lower_graph(graph, target, options.model.name, on_node=bar.step)
    t1 = time.perf_counter()
    log.info(
        "%s: lowered to Relax with %d Kiln kernels in %.1f s", target.name, len(lowered.kernels), t1 - t0
    )
    generic: list[dict[str, str]] = []
    executable = compile_module(lowered.mod, target, generic)
    report = kernel_report([*lowered.kernels, *generic])
    t2 = time.perf_counter()
    log.info("%s: compiled in %.1f s", target.name, t2 - t1)
    sub = out_dir / _target_dir(target.name)
    sub.mkdir(parents=True, exist_ok=True)
    export(executable, sub / LIBRARY, target)
    meta = {
        "inputs": [
            {"name": v.name, "shape": list(v.type.shape or ()), "dtype": v.type.dtype.numpy.name}
            for v in graph.inputs
        ],
        "outputs": [
            {"name": n, "shape": list(v.type.shape or ()), "dtype": v.type.dtype.numpy.name}
            for n, v in zip(graph.output_names, graph.outputs, strict=True)
        ],
        "target": target.manifest_view(),
        "kernel_report": report,
    }
    (sub / META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    details = {
        "target": target.manifest_view(),
        "layouts": decisions,
        "kernels": lowered.kernels,
        "kernel_report": report,
        "metadata": f"{_target_dir(target.name)}/{META}",
    }
    rel = f"{_target_dir(target.name)}/{LIBRARY}"
    return [Artifact("tvm", target.name, rel, options.precision, details, why_not_runnable_here(target))]
