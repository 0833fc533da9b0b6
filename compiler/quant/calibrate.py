"""Calibration: run the float graph on sample inputs and observe activation ranges.

The graph runs in onnxruntime (every observed value exported as an extra
output) or in Kiln's interpreter; each observed value feeds its own observer,
whose range (rmin, rmax) becomes that activation's quantization range.

Histogram methods (percentile, entropy, mse) take two passes over the same
samples (the first fixes each histogram's grid from the global extremes, as
onnxruntime's ``quantize_static`` does). The first pass keeps the observed
arrays of as many samples as fit in ``CACHE_BYTES``; the second pass replays
those and runs the model again only for the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from compiler.calibration.methods import CalibMethod
from compiler.calibration.observers import Observer, make_observer
from compiler.calibration.progress import Progress
from compiler.ir.graph import Graph, Value

__all__ = ["calibrate", "graph_runner", "GraphRunner", "CACHE_BYTES"]

log = logging.getLogger(__name__)

GraphRunner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]

CACHE_BYTES = 1 << 30  # observed arrays kept between passes; past this the model runs again


def graph_runner(graph: Graph, names: Sequence[str], runtime: str = "onnxruntime") -> GraphRunner:
    """A function feeds -> {name: array} for the named values of ``graph``."""
    by_name: dict[str, Value] = {}
    for node in graph.nodes():
        for v in graph.outputs_of(node):
            by_name[v.name] = v
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"no values named {missing[:5]} in the graph")
    if runtime == "interpreter":
        from compiler.ir.interpreter import run_graph

        wanted = set(names)

        def run_interp(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            out = run_graph(graph, feeds, keep_all=True)
            return {k: v for k, v in out.items() if k in wanted}

        return run_interp
    import onnxruntime as ort

    from compiler.onnx_export import export_onnx, model_bytes

    graph_inputs = {v.name for v in graph.inputs}
    computed = [n for n in names if n not in graph_inputs]
    probe = graph.clone()
    probe.set_outputs([Value(by_name[n].node, by_name[n].port, probe) for n in computed], names=computed)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(model_bytes(export_onnx(probe)), so, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in sess.get_inputs()}

    def run_ort(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = dict(
            zip(computed, sess.run(computed, {k: v for k, v in feeds.items() if k in inputs}), strict=True)
        )
        outs.update({k: np.asarray(feeds[k]) for k in names if k in graph_inputs})
        return outs

    return run_ort


def calibrate(
    graph: Graph,
    names: Sequence[str],
    samples: Sequence[Mapping[str, np.ndarray]],
    method: CalibMethod,
    *,
    symmetric: bool,
    runtime: str = "onnxruntime",
    progress: bool = True,
    cache_bytes: int = CACHE_BYTES,
) -> dict[str, tuple[float, float]]:
    """Observe ``names`` over ``samples``; returns the calibrated (rmin, rmax) per value.

    Args:
        graph: The float graph to run.
        names: The values to observe.
        samples: Feed dicts, one per calibration sample.
        method: The calibration method (its ``passes`` decide how often the samples are seen).
        symmetric: The quantizer is symmetric (int8 activations).
        runtime: ``onnxruntime`` or ``interpreter``.
        progress: Draw a progress bar on stderr.
        cache_bytes: Memory for the observed arrays between passes (0: run the model every pass).
    """
    if not samples:
        raise ValueError("calibration needs at least one sample")
    run = graph_runner(graph, names, runtime)
    observers = {n: make_observer(method) for n in names}
    passes = method.passes
    cache: list[dict[str, np.ndarray] | None] = []  # pass 1's arrays per sample, while they fit
    used = 0
    label = f"calibrating ({method.name})"
    with Progress(len(samples) * passes, label, enabled=progress) as bar:
        for p in range(passes):
            if p:
                for obs in observers.values():
                    obs.next_pass()
            for i, feeds in enumerate(samples):
                outs = cache[i] if p else None
                if not outs:
                    outs = {
                        n: np.asarray(v, dtype=np.float32) for n, v in run(feeds).items() if n in observers
                    }
                _observe(observers, outs)
                if p == 0 and passes > 1:
                    used += sum(a.nbytes for a in outs.values())
                    cache.append(outs if used <= cache_bytes else None)
                elif p and cache[i] is not None:
                    cache[i] = {}  # release the arrays; {} still records that they were cached
                bar.step()
    rerun = sum(c is None for c in cache)
    if rerun:
        log.info("calibration: %d of %d samples ran twice (cache %d bytes)", rerun, len(samples), cache_bytes)
    return {n: observers[n].range(symmetric=symmetric) for n in names}


def _observe(observers: Mapping[str, Observer], outs: Mapping[str, np.ndarray]) -> None:
    for n, obs in observers.items():
        obs.update(outs[n])
