"""Calibration: run the float graph on sample inputs and observe activation ranges.

The graph runs in onnxruntime (every observed value exported as an extra
output) or in Kiln's interpreter; each observed value feeds its own observer,
whose range (rmin, rmax) becomes that activation's quantization range.

Histogram methods (percentile, entropy, entropy-ort, mse) take two passes over
the same samples (the first fixes each histogram's grid from the global extremes,
as onnxruntime's ``quantize_static`` does), ``auto`` three.

**Memory.** Calibration streams: each pass takes one sample at a time from
``samples`` (a lazy :class:`~compiler.calibration.dataset.CalibrationSet` reads it
from disk then), runs the model, feeds every observer and drops the arrays. What
stays is per tensor and fixed in size (extremes, a histogram of ``num_bins``), so
the peak memory does not grow with the number of samples. ``cache_bytes > 0``
keeps the first pass's observed arrays up to that many bytes, to replay them
instead of running the model again (faster; memory then grows with the samples
up to the cap). The peak of the passes (sample reading, model outputs, observers
and the range searches; not building the session) is measured with
:mod:`tracemalloc` (numpy buffers and Python objects, not onnxruntime's own
arena) and reported as :attr:`CalibrationResult.peak_bytes`.
"""

from __future__ import annotations

import logging
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from compiler.calibration.methods import CalibMethod
from compiler.calibration.observers import Observer, make_observer
from compiler.calibration.progress import Progress
from compiler.ir.graph import Graph, Value

__all__ = [
    "calibrate",
    "calibrate_stream",
    "CalibrationResult",
    "SampleSource",
    "graph_runner",
    "GraphRunner",
    "CACHE_BYTES",
]

log = logging.getLogger(__name__)

GraphRunner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]

CACHE_BYTES = 0  # observed arrays kept between passes (0: stream; the model runs every pass)


class SampleSource(Protocol):
    """Re-iterable calibration feeds with a length (a list, or a lazy ``CalibrationSet``)."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Mapping[str, np.ndarray]]: ...


@dataclass
class CalibrationResult:
    """What calibration measured: ranges, the peak traced memory, and auto's choices.

    Attributes:
        ranges: ``(rmin, rmax)`` per observed value.
        peak_bytes: Peak :mod:`tracemalloc` memory of the calibration step above what was
            allocated when it started (0 when not measured).
        samples: Samples seen per pass.
        choices: For ``auto``: the method chosen per value.
        full_ranges: For ``entropy``: the quantizer range of each value's extremes (minmax's),
            against which :mod:`compiler.quant.clip_check` validates the KL-clipped ``ranges``.
    """

    ranges: dict[str, tuple[float, float]]
    peak_bytes: int = 0
    samples: int = 0
    choices: dict[str, str] = field(default_factory=dict)
    full_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)

    def choice_counts(self) -> dict[str, int]:
        """How many values each method won (``auto``), in name order."""
        return dict(sorted(Counter(self.choices.values()).items()))


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
    if not computed:  # only graph inputs observed (an LSTM reading x): nothing to run

        def run_feeds(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {k: np.asarray(feeds[k]) for k in names}

        return run_feeds
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
    samples: SampleSource,
    method: CalibMethod,
    *,
    symmetric: bool,
    runtime: str = "onnxruntime",
    progress: bool = True,
    cache_bytes: int = CACHE_BYTES,
) -> dict[str, tuple[float, float]]:
    """Observe ``names`` over ``samples``; returns the calibrated (rmin, rmax) per value.

    The ranges of :func:`calibrate_stream` (without measuring memory).
    """
    return calibrate_stream(
        graph,
        names,
        samples,
        method,
        symmetric=symmetric,
        runtime=runtime,
        progress=progress,
        cache_bytes=cache_bytes,
        measure_memory=False,
    ).ranges


def calibrate_stream(
    graph: Graph,
    names: Sequence[str],
    samples: SampleSource,
    method: CalibMethod,
    *,
    symmetric: bool,
    runtime: str = "onnxruntime",
    progress: bool = True,
    cache_bytes: int = CACHE_BYTES,
    measure_memory: bool = True,
) -> CalibrationResult:
    """Observe ``names`` over ``samples``, one sample at a time; ranges and peak memory.

    Args:
        graph: The float graph to run.
        names: The values to observe.
        samples: Feed dicts, one per calibration sample, iterated once per pass.
        method: The calibration method (its ``passes`` decide how often the samples are seen).
        symmetric: The quantizer is symmetric (int8 activations).
        runtime: ``onnxruntime`` or ``interpreter``.
        progress: Draw a progress bar on stderr.
        cache_bytes: Memory for the observed arrays between passes (0: run the model every pass).
        measure_memory: Trace allocations (:mod:`tracemalloc`) to report the peak.
    """
    count = len(samples)
    if not count:
        raise ValueError("calibration needs at least one sample")
    run = graph_runner(graph, names, runtime)
    observers = {n: make_observer(method) for n in names}
    started = measure_memory and not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0] if measure_memory else 0
    try:
        ranges, choices, full = _passes(run, observers, samples, method, symmetric, progress, cache_bytes)
        peak = max(tracemalloc.get_traced_memory()[1] - base, 0) if measure_memory else 0
    finally:
        if started:
            tracemalloc.stop()
    if choices:
        log.info("calibration auto: %s", dict(sorted(Counter(choices.values()).items())))
    return CalibrationResult(ranges, peak, count, choices, full)


def _passes(
    run: GraphRunner,
    observers: Mapping[str, Observer],
    samples: SampleSource,
    method: CalibMethod,
    symmetric: bool,
    progress: bool,
    cache_bytes: int,
) -> tuple[dict[str, tuple[float, float]], dict[str, str], dict[str, tuple[float, float]]]:
    """Feed every pass; the ranges, auto's choices and (entropy) the full ranges of the extremes."""
    passes, count = method.passes, len(samples)
    cache: list[dict[str, np.ndarray] | None] = []  # pass 1's arrays per sample, while they fit
    used = 0
    label = f"calibrating ({method.name})"
    with Progress(count * passes, label, enabled=progress) as bar:
        for p in range(passes):
            if p:
                for obs in observers.values():
                    obs.next_pass()
            seen = 0
            for i, feeds in enumerate(samples):
                outs = cache[i] if p and cache[i] else None
                if outs is None:
                    outs = {
                        n: np.asarray(v, dtype=np.float32) for n, v in run(feeds).items() if n in observers
                    }
                _observe(observers, outs)
                if p == 0 and passes > 1:
                    used += sum(a.nbytes for a in outs.values()) if cache_bytes else 0
                    cache.append(outs if cache_bytes and used <= cache_bytes else None)
                elif p and p == passes - 1 and cache[i] is not None:
                    cache[i] = {}  # release the arrays
                del outs, feeds
                seen += 1
                bar.step()
            if seen != count:
                raise ValueError(f"calibration samples: pass {p + 1} saw {seen}, expected {count}")
    rerun = sum(c is None for c in cache)
    if rerun and cache_bytes:
        log.info("calibration: %d of %d samples ran again (cache %d bytes)", rerun, count, cache_bytes)
    ranges = {n: o.range(symmetric=symmetric) for n, o in observers.items()}
    choices: dict[str, str] = {}
    if method.name == "auto":
        from compiler.calibration.auto import AutoObserver

        choices = {
            n: o.choice(symmetric=symmetric) for n, o in observers.items() if isinstance(o, AutoObserver)
        }
    full: dict[str, tuple[float, float]] = {}
    if method.name == "entropy":
        from compiler.calibration.entropy import EntropyObserver

        full = {
            n: o.full_range(symmetric=symmetric)
            for n, o in observers.items()
            if isinstance(o, EntropyObserver)
        }
    return ranges, choices, full


def _observe(observers: Mapping[str, Observer], outs: Mapping[str, np.ndarray]) -> None:
    for n, obs in observers.items():
        obs.update(outs[n])
