"""``--target``: compile the optimized graph with TVM into ``OUT/<target>/model.so``.

The backend works on a clone of the graph: int8 QDQ regions become kiln::QConv
integer kernels (fuse-quantized-conv), choose-layout picks blocked layouts for
the target's SIMD width, then the graph is lowered to Relax, compiled with
Kiln's schedules and exported. ``model.json`` beside the library names the
inputs and outputs for ``kiln run`` / ``kiln bench``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.registry import Artifact
from backends.tvm.target import TargetSpec, resolve_target, why_not_runnable_here

if TYPE_CHECKING:
    from compiler.ir.graph import Graph
    from compiler.options import CompileOptions

__all__ = ["emit_tvm", "prepare_graph", "LIBRARY", "META"]

log = logging.getLogger(__name__)

LIBRARY = "model.so"
META = "model.json"


def _target_dir(name: str) -> str:
    return name.replace(":", "_")


def prepare_graph(graph: Graph, target: TargetSpec) -> tuple[Graph, list[dict[str, Any]]]:
    """The target's legalization on a clone: integer convs, layouts, cleanup; returns layout decisions."""
    from compiler.pass_infra import all_passes, make_pass
    from compiler.pass_manager import PassManager

    g = graph.clone()
    names = set(all_passes())
    passes = []
    # a reloaded QDQ model (Conv -> Relu -> Q) fuses exactly as a compile does (no-op otherwise)
    passes.append(make_pass("fuse-conv-bias-act"))
    if "fuse-quantized-conv" in names:
        # integer convs; then DequantizeLinear of constant weights elsewhere (Gemm) folds to float
        passes += [make_pass("fuse-quantized-conv"), make_pass("fold-constants")]
    passes.append(make_pass("eliminate-dead-nodes"))
    decisions: list[dict[str, Any]] = []
    if target.is_cpu and "choose-layout" in names:
        passes.append(make_pass("choose-layout", {"lanes": target.lanes}))
        passes.append(make_pass("eliminate-dead-nodes"))
    PassManager(passes).run(g)
    try:
        from passes.choose_layout import layout_decisions

        decisions = layout_decisions(g)
    except ImportError:
        pass
    return g, decisions


def emit_tvm(graph: Graph, out_dir: Path, options: CompileOptions, target_name: str) -> list[Artifact]:
    """Compile for one ``--target`` and write its library plus ``model.json``."""
    from backends.tvm.build import compile_module, export
    from backends.tvm.lower import lower_graph
    from compiler.calibration.progress import Progress
    from compiler.ir.verifier import verify

    target = resolve_target(target_name)
    t0 = time.perf_counter()
    g, decisions = prepare_graph(graph, target)
    verify(g)
    with Progress(len(g.ops()), f"building kernels for {target.name}", enabled=options.progress) as bar:
        lowered = lower_graph(g, target, options.model.name, on_node=bar.step)
    t1 = time.perf_counter()
    log.info(
        "%s: lowered to Relax with %d Kiln kernels in %.1f s", target.name, len(lowered.kernels), t1 - t0
    )
    executable = compile_module(lowered.mod, target)
    t2 = time.perf_counter()
    log.info("%s: compiled in %.1f s", target.name, t2 - t1)
    sub = out_dir / _target_dir(target.name)
    sub.mkdir(parents=True, exist_ok=True)
    export(executable, sub / LIBRARY, target)
    meta = {
        "inputs": [
            {"name": v.name, "shape": list(v.type.shape or ()), "dtype": v.type.dtype.numpy.name}
            for v in g.inputs
        ],
        "outputs": [
            {"name": n, "shape": list(v.type.shape or ()), "dtype": v.type.dtype.numpy.name}
            for n, v in zip(g.output_names, g.outputs, strict=True)
        ],
        "target": target.manifest_view(),
    }
    (sub / META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    details = {
        "target": target.manifest_view(),
        "layouts": decisions,
        "kernels": lowered.kernels,
        "metadata": f"{_target_dir(target.name)}/{META}",
    }
    rel = f"{_target_dir(target.name)}/{LIBRARY}"
    return [Artifact("tvm", target.name, rel, options.precision, details, why_not_runnable_here(target))]
