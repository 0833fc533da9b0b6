"""Pass instruments: hooks that run before and after every pass.

* :class:`PassTiming` records wall time per pass.
* :class:`DumpIR` writes the IR text after every pass as numbered files.
* :class:`NumericsCheck` runs the graph after every pass and names the first
  pass that moves any output past a tolerance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compiler.errors import KilnError
from compiler.ir.graph import Graph
from compiler.ir.printer import print_graph
from compiler.metrics import agreement
from compiler.rewriter import PassResult

__all__ = ["Instrument", "PassTiming", "DumpIR", "NumericsCheck", "NumericsRegression"]


class Instrument:
    """Base class: override any hook."""

    def before_pipeline(self, graph: Graph) -> None:
        """Called once before the first pass."""

    def before_pass(self, name: str, graph: Graph) -> None:
        """Called before each pass."""

    def after_pass(self, name: str, graph: Graph, result: PassResult) -> None:
        """Called after each pass (after verification)."""


@dataclass
class PassTiming(Instrument):
    """Wall-clock seconds per pass, in run order."""

    timings: list[tuple[str, float]] = field(default_factory=list)
    _start: float = 0.0

    def before_pass(self, name: str, graph: Graph) -> None:
        self._start = time.perf_counter()

    def after_pass(self, name: str, graph: Graph, result: PassResult) -> None:
        self.timings.append((name, time.perf_counter() - self._start))

    def report(self) -> str:
        """A table of pass times."""
        total = sum(t for _, t in self.timings) or 1e-12
        lines = [f"{'pass':<40} {'ms':>9} {'%':>6}"]
        lines += [f"{n:<40} {t * 1e3:9.2f} {100 * t / total:6.1f}" for n, t in self.timings]
        lines.append(f"{'total':<40} {total * 1e3:9.2f}")
        return "\n".join(lines)


@dataclass
class DumpIR(Instrument):
    """Write ``NN-<pass>.txt`` after every pass (``00-input.txt`` first) into ``directory``."""

    directory: Path
    _count: int = 0

    def before_pipeline(self, graph: Graph) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "00-input.txt").write_text(print_graph(graph))

    def after_pass(self, name: str, graph: Graph, result: PassResult) -> None:
        self._count += 1
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        (self.directory / f"{self._count:02d}-{safe}.txt").write_text(print_graph(graph))


class NumericsRegression(KilnError):
    """A pass moved the model's outputs past the tolerance."""


Runner = Callable[[Graph, Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def _interpreter(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    from compiler.ir.interpreter import run_graph

    return run_graph(graph, feeds)


def onnxruntime_runner(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a graph by exporting it to ONNX and executing it in onnxruntime."""
    from compiler.onnx_export import export_onnx
    from compiler.runners import run_onnxruntime

    model = export_onnx(graph)
    return run_onnxruntime(model.SerializeToString(deterministic=True), feeds)


@dataclass
class NumericsCheck(Instrument):
    """Compare outputs after each pass with the outputs before the pipeline.

    Fails on the first pass whose outputs differ by more than ``max_rel``
    (max|a-e| / max(1, max|e|)); ``raise_on_fail=False`` only records it.
    """

    feeds: Mapping[str, np.ndarray]
    max_rel: float = 1e-4
    runner: Runner = _interpreter
    raise_on_fail: bool = True
    reference: dict[str, np.ndarray] = field(default_factory=dict)
    first_failure: str | None = None
    worst: list[tuple[str, float]] = field(default_factory=list)

    def before_pipeline(self, graph: Graph) -> None:
        self.reference = self.runner(graph, self.feeds)

    def after_pass(self, name: str, graph: Graph, result: PassResult) -> None:
        if not result.changed:
            return
        got = self.runner(graph, self.feeds)
        worst, where = 0.0, ""
        for k, ref in self.reference.items():
            m = agreement(got[k], ref) if k in got else None
            err = float("inf") if m is None or not m.shape_ok else m.max_rel
            if err > worst:
                worst, where = err, k
        self.worst.append((name, worst))
        if worst > self.max_rel and self.first_failure is None:
            self.first_failure = name
            if self.raise_on_fail:
                raise NumericsRegression(
                    f"pass {name!r} moved output {where!r} by max_rel {worst:.3g} > {self.max_rel:g}"
                )
