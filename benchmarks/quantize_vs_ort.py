"""Benchmark: Kiln's int8 calibration + quantization wall time against onnxruntime's ``quantize_static``.

Usage, from the repository root (../shared must hold the developer models)::

    .venv/bin/python benchmarks/quantize_vs_ort.py                      # every model, 3 methods
    .venv/bin/python benchmarks/quantize_vs_ort.py --models yunet_n_320 --methods minmax --repeats 5

For each model and calibration method both tools quantize the same calibration samples
(``<stem>.calib.npz``, 16 samples) in this one process, interleaved (Kiln, onnxruntime, Kiln,
onnxruntime, ...) so that machine noise hits both alike; after one untimed warm-up of each, the
script prints the median of ``--repeats`` runs and the ratio kiln / ort (below 1: Kiln is faster).

* ``kiln quant``: :func:`compiler.quant.quantize.quantize_int8` on the optimized float graph
  (plan, calibration through onnxruntime, scales, QDQ insertion); the like-for-like part.
* ``kiln compile``: the whole ``kiln compile --quantize int8 --no-verify --no-sensitivity``
  (load, optimize, calibrate, quantize, export, write the artifacts; no verification run and
  no sensitivity report, which onnxruntime does not make either).
* ``ort``: ``quantize_static`` (QDQ, QUInt8 activations, per-channel QInt8 weights, the matching
  ``CalibrationMethod``) on the model raised to opset 13 (load, shape inference, calibration,
  quantization, save).

Time is wall-clock (``time.perf_counter``); onnxruntime uses its default thread pools in both.
onnxruntime's side is :mod:`tests.helpers.quant_reference`, the same calls the int8 acceptance
test makes.

**Accuracy** (``--sqnr``): instead of timing, the hold-out SQNR of Kiln's and onnxruntime's int8
models, per model x method x output (:class:`tests.helpers.quant_reference.QuantBench`, the
acceptance test's yardstick: same method name on both sides, per-channel int8 weights, QDQ,
the same calibration samples)::

    .venv/bin/python benchmarks/quantize_vs_ort.py --sqnr --zoo ZOO_DIR

The shared models calibrate on ``<stem>.calib.npz`` (16 samples) and are scored on
``<stem>.holdout.npz`` (8). A zoo CNN ``ZOO_DIR/<name>/`` has ``calib.npz`` (8 samples) and
``inputs.npz`` (1): Kiln and onnxruntime calibrate on the first 6 calibration samples, and
the hold-out set is the other 2 plus ``inputs.npz`` (3 samples, never seen in calibration).
The last lines give, per method, the worst and the mean ``kiln - ort`` (dB) over the rows, once
for onnxruntime's default execution of both QDQ models (its fused integer kernels) and once for
the models run as written (``exact``, no graph optimization). Kiln compiles with ``--no-verify``
here (the table is the verdict); ``--floor`` adds Kiln's default compile, whose 25 dB floor may
keep layers in float, as a column, with how many of its Conv/Gemm/MatMul nodes stayed int8, and
summaries of it against onnxruntime's model under either execution (``floor``, ``floorx``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compiler.api import load_model  # noqa: E402
from compiler.cli import main as kiln_main  # noqa: E402
from compiler.ir.graph import Graph  # noqa: E402
from compiler.pass_manager import PassManager  # noqa: E402
from compiler.pipelines import pipeline  # noqa: E402
from compiler.quant.options import QuantOptions  # noqa: E402
from compiler.quant.quantize import quantize_int8  # noqa: E402
from tests.helpers.quant_reference import (  # noqa: E402
    ModelCase,
    QuantBench,
    SqnrRow,
    load_samples,
    ort_quantize,
    ort_ready_model,
)

__all__ = ["main", "bench_case", "int8_share", "sqnr_table", "zoo_case"]

STEMS = ["pan_mnv3s_skin_clothes_hair", "ppocr_mobile_v2_cls", "ultraface_rfb320", "yunet_n_320"]
METHODS = ["minmax", "entropy", "percentile"]
ZOO = ["resnet18", "mobilenetv2_100", "mnasnet_100", "efficientnet_b0"]
ZOO_CALIB = 6  # of the 8 calib.npz samples; the rest, with inputs.npz, are the hold-out
RESOLUTION_DB = 0.2  # the acceptance criterion's margin: rows noisier than this cannot resolve it
SHAPES = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}


def _timed(fn: Callable[[], object]) -> float:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start


def _optimized(model: Path, shapes: Mapping[str, tuple[int, ...]]) -> Graph:
    graph = load_model(model, input_shapes=shapes or None)
    PassManager(pipeline("default")).run(graph)
    return graph


def bench_case(shared: Path, stem: str, method: str, repeats: int, work: Path) -> dict[str, float]:
    """Median seconds of Kiln (quant step, whole compile) and onnxruntime for one model and method."""
    model = shared / "models" / f"{stem}.onnx"
    calib = shared / "models" / "data" / f"{stem}.calib.npz"
    shapes = SHAPES.get(stem, {})
    graph = _optimized(model, shapes)
    q = QuantOptions(calib=calib, calib_method=method, sensitivity=False)  # calibration + QDQ only
    ready = ort_ready_model(model, work / f"{stem}.fp32.onnx", shapes)
    samples = load_samples(calib, [v.name for v in graph.inputs])
    argv = ["compile", str(model), "-o", str(work / "k"), "--quantize", "int8", "--calib", str(calib)]
    argv += ["--calib-method", method, "--no-verify", "--no-sensitivity"]
    for name, shape in shapes.items():
        argv += ["--input-shape", f"{name}={'x'.join(map(str, shape))}"]
    runs: dict[str, Callable[[], object]] = {
        "kiln quant": lambda: quantize_int8(graph.clone(), q, progress=False),
        "kiln compile": lambda: kiln_main(argv),
        "ort": lambda: ort_quantize(ready, samples, method, work / f"{stem}.ort.onnx"),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(repeats + 1):
        for name, fn in runs.items():
            t = _timed(fn)
            if rep:  # the first round warms caches and lazy imports
                times[name].append(t)
    return {k: statistics.median(v) for k, v in times.items()}


def shared_case(shared: Path, stem: str) -> ModelCase:
    """A shared model with its calibration, hold-out and real-input files."""
    data = shared / "models" / "data"
    return ModelCase(
        stem,
        shared / "models" / f"{stem}.onnx",
        data / f"{stem}.calib.npz",
        data / f"{stem}.holdout.npz",
        data / f"{stem}.npz",
        {k: tuple(v) for k, v in SHAPES.get(stem, {}).items()},
    )


def zoo_case(folder: Path, work: Path) -> ModelCase:
    """A zoo model: calibrate on calib.npz[:6]; hold out calib.npz[6:] + inputs.npz."""
    import numpy as np

    name = folder.name
    with np.load(folder / "calib.npz") as c, np.load(folder / "inputs.npz") as r:
        calib = {k: c[k] for k in c.files}
        real = {k: r[k] for k in r.files}
    hold = {k: np.concatenate([v[ZOO_CALIB:], real[k][None]]) for k, v in calib.items()}
    np.savez(work / f"{name}.calib.npz", **{k: v[:ZOO_CALIB] for k, v in calib.items()})
    np.savez(work / f"{name}.holdout.npz", **hold)  # type: ignore[arg-type]
    return ModelCase(
        name,
        folder / "model.onnx",
        work / f"{name}.calib.npz",
        work / f"{name}.holdout.npz",
        folder / "inputs.npz",
    )


def _summary(label: str, rows: list[SqnrRow], methods: list[str]) -> None:
    for method in [*methods, "all"]:
        diffs = [r.kiln - r.ort for r in rows if method in ("all", r.method)]
        if diffs:
            worst, mean = min(diffs), statistics.mean(diffs)
            print(f"{label:<6} {method:<10} worst {worst:+6.2f} dB  mean {mean:+6.2f} dB")


def sqnr_table(cases: list[ModelCase], methods: list[str], work: Path, floor: bool = False) -> list[SqnrRow]:
    """Print (as they come) and return the hold-out SQNR rows of every case and method.

    ``ort``: both QDQ models on onnxruntime's default (fused integer) execution, the acceptance
    yardstick. ``exact``: both run as written (no graph optimization: the QDQ semantics). Where
    onnxruntime's own model moves by more than the 0.2 dB criterion between the two, the model's
    output amplifies one-LSB rounding differences, and the row cannot resolve 0.2 dB either way.
    ``floor``: Kiln's default compile (25 dB floor, layer fallback) on the same samples.
    """
    bench = QuantBench({c.stem: c for c in cases}, work, verify=False)
    head = (
        f"{'model':<28} {'method':<10} {'output':<20} {'kiln dB':>8} {'ort dB':>8} {'diff':>7}"
        f" {'exact k':>8} {'exact o':>8} {'diff':>7}"
        + (f" {'floor dB':>9} {'int8 MACs':>9}" if floor else "")
    )
    print(head)
    print("-" * len(head))
    rows: list[SqnrRow] = []
    exact_rows: list[SqnrRow] = []
    floor_rows: list[tuple[SqnrRow, float, float]] = []
    for case in cases:
        for method in methods:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                got = bench.sqnr(case.stem, method)
                exact = bench.sqnr(case.stem, method, exact=True)
                floored = bench.sqnr(case.stem, method, floor=True) if floor else None
            if floored is not None:
                n_int8, n_all = int8_share(bench.kiln_dir(case.stem, method, floor=True) / "model.onnx")
                share = f"{n_int8}/{n_all}"
                floor_rows += [(f, r.ort, e.ort) for f, r, e in zip(floored, got, exact, strict=True)]
            for i, (r, e) in enumerate(zip(got, exact, strict=True)):
                line = (
                    f"{r.stem:<28} {r.method:<10} {r.output[:20]:<20} {r.kiln:8.2f} {r.ort:8.2f} "
                    f"{r.kiln - r.ort:+7.2f} {e.kiln:8.2f} {e.ort:8.2f} {e.kiln - e.ort:+7.2f}"
                )
                if floored is not None:
                    line += f" {floored[i].kiln:9.2f} {share:>9}"
                if abs(r.ort - e.ort) > RESOLUTION_DB:
                    line += f"  (ort moves {e.ort - r.ort:+.2f} dB between executions)"
                print(line, flush=True)
            rows.extend(got)
            exact_rows.extend(exact)
    print("-" * len(head))
    _summary("ort", rows, methods)
    _summary("exact", exact_rows, methods)
    steady = [r for r, e in zip(rows, exact_rows, strict=True) if abs(r.ort - e.ort) <= RESOLUTION_DB]
    print(f"rows whose onnxruntime model is steady within {RESOLUTION_DB} dB: {len(steady)}/{len(rows)}")
    _summary("steady", steady, methods)
    if floor_rows:  # Kiln's default compile against onnxruntime's model, under either execution
        _summary("floor", [replace(f, ort=o) for f, o, _ in floor_rows], methods)
        _summary("floorx", [replace(f, ort=x) for f, _, x in floor_rows], methods)
    return rows


def int8_share(model: Path) -> tuple[int, int]:
    """(Conv/ConvTranspose/Gemm/MatMul nodes whose weight comes through DequantizeLinear, all such nodes)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    heavy = [n for n in graph.node if n.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul")]
    return sum(len(n.input) > 1 and n.input[1] in dequantized for n in heavy), len(heavy)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per model and method."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared", help="the ../shared folder")
    p.add_argument("--models", nargs="+", default=STEMS, metavar="STEM")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated calibration methods")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per tool (median reported)")
    p.add_argument("--sqnr", action="store_true", help="print hold-out SQNR (Kiln vs ort), not times")
    p.add_argument("--zoo", type=Path, help="with --sqnr: also the zoo CNNs under this folder")
    p.add_argument("--zoo-models", nargs="+", default=ZOO, metavar="NAME")
    p.add_argument("--floor", action="store_true", help="with --sqnr: also Kiln's default compile (floor)")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    methods = [m.strip() for m in args.methods.split(",")]
    if args.sqnr:
        with tempfile.TemporaryDirectory(prefix="kiln-sqnr-") as tmp:
            cases = [shared_case(args.shared, s) for s in args.models]
            if args.zoo is not None:
                cases += [zoo_case(args.zoo / n, Path(tmp)) for n in args.zoo_models]
            sqnr_table(cases, methods, Path(tmp), args.floor)
        return 0
    cols = ("kiln quant", "kiln compile", "ort", "quant/ort", "compile/ort")
    head = f"{'model':<28} {'method':<10} " + " ".join(f"{c:>12}" for c in cols)
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        for stem in args.models:
            for method in args.methods.split(","):
                t = bench_case(args.shared, stem, method.strip(), args.repeats, Path(tmp))
                cells = [f"{t[k]:11.2f}s" for k in ("kiln quant", "kiln compile", "ort")]
                cells += [f"{t[k] / t['ort']:12.2f}" for k in ("kiln quant", "kiln compile")]
                print(f"{stem:<28} {method:<10} " + " ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
