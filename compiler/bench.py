"""Interleaved in-process timing: the method behind ``kiln bench`` and ``benchmarks/``.

Candidates run round-robin in one process (the starting candidate rotates each round), so machine
noise hits all of them alike. Each sample is an inner batch of ``n`` calls lasting at least
``min_batch_s``; its time per call is ``batch / n``. A candidate's statistics over ``rounds``
samples are the median and the 10th / 90th percentiles, of wall time (``perf_counter``) and of
the calling thread's CPU time (``thread_time``; with one thread it hides time-slicing by other
processes, with more threads it misses the workers' share).

ONNX models are timed in onnxruntime's CPU provider with ``intra_op_num_threads`` = threads,
``inter_op_num_threads`` = 1, no spin-waiting and default graph optimizations; TVM artifacts
through TVM's runtime (the ``tvm`` backend's, imported only when needed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import KilnError, ModelFileError, OptionError

__all__ = [
    "Stats",
    "BenchReport",
    "interleaved",
    "bench_artifact",
    "bench_remote",
    "ort_session",
    "runner_callable",
    "random_feeds_for",
]


@dataclass(frozen=True)
class Stats:
    """Seconds per call of one candidate: wall median / p10 / p90 and thread-CPU median."""

    median_s: float
    p10_s: float
    p90_s: float
    cpu_median_s: float
    rounds: int
    calls_per_sample: int

    @property
    def median_ms(self) -> float:
        """Wall median in milliseconds."""
        return self.median_s * 1e3

    def as_json(self) -> dict[str, float | int]:
        """Milliseconds, rounded to the microsecond."""
        return {
            "median_ms": round(self.median_s * 1e3, 4),
            "p10_ms": round(self.p10_s * 1e3, 4),
            "p90_ms": round(self.p90_s * 1e3, 4),
            "cpu_median_ms": round(self.cpu_median_s * 1e3, 4),
            "rounds": self.rounds,
            "calls_per_sample": self.calls_per_sample,
        }


def _batch_size(fn: Callable[[], object], min_batch_s: float) -> int:
    """Calls per sample: double n until n calls take >= min_batch_s (this also warms fn up)."""
    fn()
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        took = time.perf_counter() - start
        if took >= min_batch_s or n >= 1 << 20:
            break
        # jump close to the target, at most 2x past what the last batch suggests
        n = min(n * 16, max(2 * n, int(n * min_batch_s / max(took, 1e-9) * 1.2) + 1))
    return n


def interleaved(
    fns: Mapping[str, Callable[[], object]], rounds: int = 30, min_batch_s: float = 0.02
) -> dict[str, Stats]:
    """Time every candidate ``rounds`` times, round-robin; statistics per call by name."""
    if rounds < 1:
        raise OptionError(f"rounds {rounds}: must be >= 1")
    names = list(fns)
    batch = {k: _batch_size(fns[k], min_batch_s) for k in names}
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for i in range(len(names)):
            k = names[(r + i) % len(names)]
            fn, n = fns[k], batch[k]
            c0, t0 = time.thread_time(), time.perf_counter()
            for _ in range(n):
                fn()
            t1, c1 = time.perf_counter(), time.thread_time()
            wall[k].append((t1 - t0) / n)
            cpu[k].append((c1 - c0) / n)
    out = {}
    for k in names:
        w = np.asarray(wall[k])
        p10, med, p90 = (float(v) for v in np.percentile(w, [10, 50, 90]))
        out[k] = Stats(med, p10, p90, float(np.median(cpu[k])), rounds, batch[k])
    return out


def ort_session(model: Path | bytes, threads: int) -> Any:
    """An onnxruntime CPU session: ``threads`` intra-op threads, 1 inter-op, no spinning."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    src = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises several private types
        where = "model bytes" if isinstance(model, bytes) else str(model)
        raise ModelFileError(f"{where}: onnxruntime cannot load it ({str(exc).splitlines()[0]})") from None


def _ort_callable(model: Path, feeds: Mapping[str, np.ndarray], threads: int) -> Callable[[], object]:
    sess = ort_session(model, threads)
    want = {i.name for i in sess.get_inputs()}
    missing = sorted(want - set(feeds))
    if missing:
        raise KilnError(f"{model}: no feed for input {missing[0]!r}")
    bound = {k: np.ascontiguousarray(v) for k, v in feeds.items() if k in want}
    names = [o.name for o in sess.get_outputs()]
    return lambda: sess.run(names, bound)


def runner_callable(artifact: Path, feeds: Mapping[str, np.ndarray], threads: int) -> Callable[[], object]:
    """A zero-argument call running one artifact (``.so``: TVM, ``.onnx``: onnxruntime) on ``feeds``."""
    suffix = Path(artifact).suffix.lower()
    if suffix == ".onnx":
        return _ort_callable(Path(artifact), feeds, threads)
    if suffix == ".so":
        from compiler.plugins import TVM_RUNTIME, entry

        return entry(f"{TVM_RUNTIME}:load_artifact")(Path(artifact), threads).bind(feeds)
    raise OptionError(f"{artifact}: kiln bench times .so (TVM) and .onnx artifacts")


@dataclass(frozen=True)
class BenchReport:
    """One ``kiln bench`` result; ``ratio_vs`` = artifact median / ``vs`` median (below 1: faster);
    ``kernel_report``: a TVM artifact's "which kernel ran" report (from its model.json), else None."""

    artifact: str
    threads: int
    rounds: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    cpu_median_ms: float
    vs: str | None = None
    ort_median_ms: float | None = None
    ratio_vs: float | None = None
    kernel_report: dict[str, Any] | None = None

    def summary(self) -> str:
        """The human-readable lines ``kiln bench`` prints."""
        thr = "thread" if self.threads == 1 else "threads"
        where = f"{self.threads} {thr}" if self.threads else "the device's default threads"
        lines = [
            f"{self.artifact}: median {self.median_ms:.3f} ms (p10 {self.p10_ms:.3f}, p90 {self.p90_ms:.3f}; "
            f"{self.rounds} rounds, {where})"
        ]
        if self.vs is not None and self.ort_median_ms is not None and self.ratio_vs is not None:
            lines.append(
                f"{self.vs} (onnxruntime): median {self.ort_median_ms:.3f} ms; "
                f"ratio {self.ratio_vs:.3f} ({'faster' if self.ratio_vs < 1 else 'slower'} than onnxruntime)"
            )
        if self.kernel_report:
            parts = [
                f"{cls} {'+'.join(row['isa'])} ({row['kernels']})" for cls, row in self.kernel_report.items()
            ]
            lines.append("kernels: " + ", ".join(parts))
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """The JSON view (``kiln bench --json``)."""
        keys = (
            "artifact",
            "threads",
            "rounds",
            "median_ms",
            "p10_ms",
            "p90_ms",
            "vs",
            "ort_median_ms",
            "ratio_vs",
            "kernel_report",
        )
        return {k: getattr(self, k) for k in keys}


def random_feeds_for(artifact: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal inputs for an artifact (``.so``: its model.json; ``.onnx``: its inputs).

    Dimensions that are not fixed numbers become 1.
    """
    artifact = Path(artifact)
    specs: list[tuple[str, list[Any], str]] = []
    if artifact.suffix.lower() == ".so":
        from compiler.plugins import TVM_RUNTIME, entry

        meta = entry(f"{TVM_RUNTIME}:TvmModel").read_meta(artifact)
        specs = [(s.name, list(s.shape or ()), s.dtype) for s in meta[0]]
    else:
        for i in ort_session(artifact, 1).get_inputs():
            dtype = {"tensor(float)": "float32", "tensor(float16)": "float16"}.get(i.type)
            if dtype is None:
                raise OptionError(f"{artifact}: input {i.name!r} is {i.type}; pass --inputs with real data")
            specs.append((i.name, list(i.shape), dtype))
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal([d if isinstance(d, int) and d > 0 else 1 for d in shape]).astype(dtype)
        for name, shape, dtype in specs
    }


def _kernel_report(artifact: Path) -> dict[str, Any] | None:
    if artifact.suffix.lower() != ".so":
        return None
    from compiler.plugins import TVM_RUNTIME, entry

    report: dict[str, Any] | None = entry(f"{TVM_RUNTIME}:kernel_report_of")(artifact)
    return report


def bench_artifact(
    artifact: Path,
    feeds: Mapping[str, np.ndarray] | None,
    threads: int,
    vs: Path | None = None,
    rounds: int = 30,
    min_batch_s: float = 0.02,
) -> BenchReport:
    """Time ``artifact`` on ``feeds`` (None: seeded random) with ``threads`` threads, interleaved with vs."""
    if threads < 1:
        raise OptionError(f"--threads {threads}: must be >= 1")
    if vs is not None and Path(vs).suffix.lower() != ".onnx":
        raise OptionError(f"--vs {vs}: compare against an ONNX model (run in onnxruntime)")
    if feeds is None:
        feeds = random_feeds_for(Path(artifact))
    fns = {"kiln": runner_callable(Path(artifact), feeds, threads)}
    if vs is not None:
        fns["ort"] = _ort_callable(Path(vs), feeds, threads)
    stats = interleaved(fns, rounds=rounds, min_batch_s=min_batch_s)
    k = stats["kiln"]
    o = stats.get("ort")

    def ms(x: float) -> float:
        return x * 1e3

    return BenchReport(
        artifact=str(artifact),
        threads=threads,
        rounds=rounds,
        kernel_report=_kernel_report(Path(artifact)),
        median_ms=ms(k.median_s),
        p10_ms=ms(k.p10_s),
        p90_ms=ms(k.p90_s),
        cpu_median_ms=ms(k.cpu_median_s),
        vs=None if vs is None else str(vs),
        ort_median_ms=None if o is None else ms(o.median_s),
        ratio_vs=None if o is None else k.median_s / o.median_s,
    )


def bench_remote(
    artifact: Path, feeds: Mapping[str, np.ndarray] | None, rpc: str, rounds: int = 30
) -> BenchReport:
    """Time ``artifact`` on a remote device (``--rpc HOST:PORT`` or ``tracker:HOST:PORT:KEY``).

    The device times each run itself; the median is over ``rounds`` runs after one warm-up.
    """
    from compiler.plugins import TVM_RPC, entry

    addr = entry(f"{TVM_RPC}:RpcAddress").parse(rpc)
    time_remote = entry(f"{TVM_RPC}:time_remote")
    if feeds is None:
        feeds = random_feeds_for(Path(artifact))
    secs = sorted(time_remote(Path(artifact), feeds, addr, rounds))

    def pct(q: float) -> float:
        return float(np.percentile(secs, q)) * 1e3

    return BenchReport(
        artifact=f"{artifact} (on {addr})",
        threads=0,
        rounds=rounds,
        median_ms=pct(50),
        p10_ms=pct(10),
        p90_ms=pct(90),
        cpu_median_ms=float("nan"),
        kernel_report=_kernel_report(Path(artifact)),
    )
