"""Benchmark: CPU time of Kiln's calibration observers against onnxruntime's ``HistogramCollector``.

Usage, from the repository root (../shared must hold the developer models)::

    .venv/bin/python benchmarks/observer_cost.py [--model pan_mnv3s_skin_clothes_hair] [--repeats 5]

Every float tensor of the model (its input and every node output) is recorded by onnxruntime
once, on the model's 16 calibration samples. Then, per repeat and interleaved (Kiln, ORT, Kiln,
ORT, ...), each side observes the same activations and computes its ranges:

* Kiln: :func:`compiler.calibration.observers.make_observer` per tensor, ``update`` per sample
  (two passes for the histogram methods), then ``range``;
* onnxruntime: ``HistogramCollector(method, ...)`` over the same activations, then
  ``compute_collection_result`` (its calibrators' own histogram code); MinMax is a per-tensor
  ``min``/``max`` reduction, as ``MinMaxCalibrater`` does it.

The time is this thread's CPU time (``time.thread_time``), so other load on the machine does not
count; the script prints the median per method and the ratio kiln / ort (below 1: Kiln is
cheaper). ``mse`` has no onnxruntime counterpart; its row has no ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.zoo_matrix import cpu_isa  # noqa: E402
from compiler.calibration import CalibMethod  # noqa: E402
from compiler.calibration.observers import make_observer  # noqa: E402

MODELS = ROOT.parent / "shared" / "models"
# Kiln's method -> onnxruntime's HistogramCollector method (None: min/max reduction; absent: no peer).
PEERS: dict[str, str | None] = {
    "minmax": None,
    "percentile": "percentile",
    "entropy": "entropy",
    "entropy-ort": "entropy",
}
METHODS = ("minmax", "percentile", "entropy", "entropy-ort", "mse")

Activations = list[dict[str, np.ndarray]]


def record(stem: str) -> Activations:
    """Every float tensor of ``stem`` on each of its calibration samples, recorded by onnxruntime."""
    model = onnx.shape_inference.infer_shapes(onnx.load(MODELS / f"{stem}.onnx"))
    floats = {
        v.name
        for v in [*model.graph.value_info, *model.graph.output]
        if v.type.tensor_type.elem_type == TensorProto.FLOAT
    }
    extra = sorted(floats - {o.name for o in model.graph.output})
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in extra)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names, inp = [o.name for o in sess.get_outputs()], sess.get_inputs()[0].name
    samples = np.load(MODELS / "data" / f"{stem}.calib.npz")[inp]
    return [dict(zip(names, sess.run(None, {inp: x}), strict=True)) | {inp: x} for x in samples]


def kiln_ranges(method: str, acts: Activations) -> list[np.ndarray]:
    """Kiln's (lo, hi) per tensor for ``method`` over ``acts`` (two passes for histogram methods)."""
    m = CalibMethod(method)
    observers = {n: make_observer(m) for n in acts[0]}
    for p in range(1 if method == "minmax" else 2):
        for sample in acts:
            for n, obs in observers.items():
                obs.update(sample[n])
        if p == 0 and method != "minmax":
            for obs in observers.values():
                obs.next_pass()
    return [np.asarray(obs.range(symmetric=False)) for obs in observers.values()]


def kiln_seconds(method: str, acts: Activations) -> float:
    """CPU seconds for Kiln's observers of ``method`` over ``acts``, ranges included."""
    start = time.thread_time()
    ranges = kiln_ranges(method, acts)
    spent = time.thread_time() - start
    assert all(np.isfinite(r).all() for r in ranges)
    return spent


def ort_seconds(method: str, acts: Activations) -> float:
    """CPU seconds for onnxruntime's counterpart of ``method`` over ``acts``."""
    from onnxruntime.quantization.calibrate import HistogramCollector

    peer = PEERS[method]
    start = time.thread_time()
    if peer is None:
        for n in acts[0]:
            lo = min(float(s[n].min()) for s in acts)
            hi = max(float(s[n].max()) for s in acts)
            assert lo <= hi
    else:
        collector = HistogramCollector(
            peer,
            symmetric=False,
            num_bins=128 if peer == "entropy" else 2048,
            num_quantized_bins=128,
            percentile=99.999,
            scenario="same",
        )
        with contextlib.redirect_stdout(io.StringIO()):  # its progress prints
            for sample in acts:
                collector.collect({n: [a] for n, a in sample.items()})
            collector.compute_collection_result()
    return time.thread_time() - start


def main(argv: list[str] | None = None) -> int:
    """Print per-method medians and ratios; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pan_mnv3s_skin_clothes_hair", help="stem under ../shared/models")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    acts = record(args.model)
    print(f"isa: {cpu_isa()} (numpy observers; single thread CPU time)")
    print(f"model {args.model}: {len(acts[0])} tensors x {len(acts)} samples")
    print(f"{'method':<12} {'kiln s':>8} {'ort s':>8} {'kiln/ort':>9}")
    for method in METHODS:
        runs: dict[str, list[float]] = {"kiln": [], "ort": []}
        sides: dict[str, Callable[[str, Activations], float]] = {"kiln": kiln_seconds}
        if method in PEERS:
            sides["ort"] = ort_seconds
        for _ in range(args.repeats):
            for side, fn in sides.items():
                runs[side].append(fn(method, acts))
        k = statistics.median(runs["kiln"])
        if runs["ort"]:
            o = statistics.median(runs["ort"])
            print(f"{method:<12} {k:8.3f} {o:8.3f} {k / o:9.2f}")
        else:
            print(f"{method:<12} {k:8.3f} {'-':>8} {'-':>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
