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
from tests.helpers.quant_reference import load_samples, ort_quantize, ort_ready_model  # noqa: E402

__all__ = ["main", "bench_case"]

STEMS = ["pan_mnv3s_skin_clothes_hair", "ppocr_mobile_v2_cls", "ultraface_rfb320", "yunet_n_320"]
METHODS = ["minmax", "entropy", "percentile"]
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


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per model and method."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared", help="the ../shared folder")
    p.add_argument("--models", nargs="+", default=STEMS, metavar="STEM")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated calibration methods")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per tool (median reported)")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
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
