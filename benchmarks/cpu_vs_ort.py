"""Benchmark: Kiln's TVM CPU artifacts (fp32 and int8) against onnxruntime fp32, same process.

Usage, from the repository root (../shared must hold the developer models)::

    .venv/bin/python benchmarks/cpu_vs_ort.py                                  # every model, 1 and 2 threads
    .venv/bin/python benchmarks/cpu_vs_ort.py --models yunet_n_320 --threads 1 --rounds 3
    .venv/bin/python benchmarks/cpu_vs_ort.py --ort-stand-in --rounds 3        # timing paths only

Models: the four developer models of ``../shared/models`` (real inputs ``data/<stem>.npz``,
calibration ``data/<stem>.calib.npz``) and the ResNet-18- and MobileNetV2-shaped builders of
:mod:`tests.helpers.cnn_models` (seeded random input and calibration samples).

Each model is compiled by Kiln for ``--target cpu`` twice, fp32 and int8 (:func:`compile_kiln`),
then for every thread count three candidates run interleaved in this one process
(:func:`compiler.bench.interleaved`, median of ``--rounds`` samples, each a batch of >= 20 ms):

* ``ort``: onnxruntime fp32 (CPU EP, default graph optimizations, intra-op threads = threads,
  inter-op 1, no spin-waiting) on the source model with its input shape fixed;
* ``fp32`` and ``int8``: Kiln's ``cpu/model.so`` run by :mod:`backends.tvm.runtime` with the same
  thread count (no spin-waiting either).

The table shows medians in ms, ``fp32/ort`` (below 1: Kiln is faster) and ``int8/fp32`` (the int8
speed-up, below 1 is faster), then the geometric mean of ``fp32/ort`` and ``int8/ort`` per thread
count. ``err`` is the largest absolute difference between Kiln fp32 and onnxruntime outputs on the
real input. ``--ort-stand-in`` replaces both Kiln artifacts by onnxruntime sessions (no compile), to
exercise the timing and report code.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compiler.bench import interleaved, ort_session, runner_callable  # noqa: E402
from tests.helpers.cnn_models import CNN_MODELS, INPUT_SHAPE  # noqa: E402
from tests.helpers.quant_reference import ort_ready_model  # noqa: E402

__all__ = ["main", "compile_kiln", "ModelCase", "prepare_cases", "bench_case", "geomean"]

SHARED_STEMS = ["pan_mnv3s_skin_clothes_hair", "ppocr_mobile_v2_cls", "ultraface_rfb320", "yunet_n_320"]
ALL_MODELS = SHARED_STEMS + list(CNN_MODELS)
SHAPES: dict[str, dict[str, tuple[int, ...]]] = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}
CALIB_SAMPLES = 16
PRECISIONS = ("fp32", "int8")

# What Kiln is asked to emit: the TVM CPU artifact lands at OUT/cpu/model.so.
KILN_EMIT: tuple[str, ...] = ()
KILN_TARGETS: tuple[str, ...] = ("cpu",)


@dataclass
class ModelCase:
    """One benchmark model: its source, the ORT-ready copy, real feeds, calibration samples."""

    name: str
    model: Path
    ort_model: Path
    feeds: dict[str, np.ndarray]
    calib: Path
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def compile_kiln(case: ModelCase, precision: str, out: Path) -> Path:
    """Compile ``case`` with Kiln for ``--target cpu`` at ``precision`` (fp32 | int8); the model.so path."""
    from compiler.driver import compile_model
    from compiler.options import CompileOptions
    from compiler.quant.options import QuantOptions

    out_dir = out / f"{case.name}.{precision}"
    kwargs: dict[str, Any] = {
        "model": case.model,
        "out_dir": out_dir,
        "emit": KILN_EMIT,
        "targets": KILN_TARGETS,
        "input_shapes": dict(case.shapes),
        "verify": False,  # outputs are compared below, without stopping the benchmark
    }
    if precision == "int8":
        kwargs["quant"] = QuantOptions(calib=case.calib, sensitivity=False)
    compile_model(CompileOptions(**kwargs))
    return out_dir / "cpu" / "model.so"


def _random_case(name: str, work: Path) -> ModelCase:
    from tests.helpers.cnn_models import save_cnn_models

    paths = save_cnn_models(work / "cnn") if not (work / "cnn" / f"{name}.onnx").is_file() else {}
    model = paths.get(name, work / "cnn" / f"{name}.onnx")
    rng = np.random.default_rng(0)
    calib = work / "cnn" / f"{name}.calib.npz"
    samples = rng.standard_normal((CALIB_SAMPLES, *INPUT_SHAPE)).astype(np.float32)
    np.savez(calib, input=samples)
    feeds = {"input": rng.standard_normal(INPUT_SHAPE).astype(np.float32)}
    return ModelCase(name, model, model, feeds, calib)


def prepare_cases(names: list[str], shared: Path, work: Path) -> list[ModelCase]:
    """The cases for ``names`` (shared stems or builder names), writing helper files under ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    cases = []
    for name in names:
        if name in CNN_MODELS:
            cases.append(_random_case(name, work))
            continue
        if name not in SHARED_STEMS:
            raise SystemExit(f"cpu_vs_ort: unknown model {name!r} (choose from {', '.join(ALL_MODELS)})")
        model = shared / "models" / f"{name}.onnx"
        shapes = SHAPES.get(name, {})
        with np.load(shared / "models" / "data" / f"{name}.npz") as z:
            feeds = {k: np.asarray(z[k], dtype=np.float32) for k in z.files}
        ready = ort_ready_model(model, work / f"{name}.ort.onnx", shapes)
        cases.append(
            ModelCase(name, model, ready, feeds, shared / "models" / "data" / f"{name}.calib.npz", shapes)
        )
    return cases


def _max_err(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    common = [k for k in a if k in b]
    if not common:  # output names may differ: compare in order
        return max(float(np.max(np.abs(x - y))) for x, y in zip(a.values(), b.values(), strict=False))
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in common)


def _ort_outputs(model: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort_session(model, 1)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds)), strict=True))


def _tvm_outputs(model: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    from backends.tvm.runtime import run_tvm

    return run_tvm(model, feeds)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bench_case(
    case: ModelCase, artifacts: Mapping[str, Path], threads: int, rounds: int, min_batch_s: float
) -> dict[str, Any]:
    """One row: medians (ms) of ort / fp32 / int8 interleaved at ``threads`` threads, and ratios."""
    fns: dict[str, Callable[[], object]] = {"ort": runner_callable(case.ort_model, case.feeds, threads)}
    for precision, path in artifacts.items():
        fns[precision] = runner_callable(path, case.feeds, threads)
    stats = interleaved(fns, rounds=rounds, min_batch_s=min_batch_s)
    row: dict[str, Any] = {"model": case.name, "threads": threads, "rounds": rounds}
    row.update({f"{k}_ms": s.median_s * 1e3 for k, s in stats.items()})
    row.update({f"{k}_cpu_ms": s.cpu_median_s * 1e3 for k, s in stats.items()})
    row.update({f"{k}_p10_ms": s.p10_s * 1e3 for k, s in stats.items()})
    row.update({f"{k}_p90_ms": s.p90_s * 1e3 for k, s in stats.items()})
    if "fp32" in stats:
        row["fp32_vs_ort"] = stats["fp32"].median_s / stats["ort"].median_s
    if "int8" in stats:
        row["int8_vs_ort"] = stats["int8"].median_s / stats["ort"].median_s
    if "int8" in stats and "fp32" in stats:
        row["int8_vs_fp32"] = stats["int8"].median_s / stats["fp32"].median_s
    return row


def geomean(values: list[float]) -> float | None:
    """Geometric mean (None for no values)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _cell(row: Mapping[str, Any], key: str, fmt: str) -> str:
    v = row.get(key)
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def print_table(rows: list[dict[str, Any]], summary: Mapping[str, Mapping[str, float | None]]) -> None:
    """The human-readable table and the per-thread-count geometric means."""
    head = (
        f"{'model':<28} {'thr':>3} {'ort ms':>9} {'fp32 ms':>9} {'int8 ms':>9} "
        f"{'fp32/ort':>9} {'int8/fp32':>9} {'int8/ort':>9} {'err':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = [
            _cell(r, "ort_ms", "9.3f"),
            _cell(r, "fp32_ms", "9.3f"),
            _cell(r, "int8_ms", "9.3f"),
            _cell(r, "fp32_vs_ort", "9.3f"),
            _cell(r, "int8_vs_fp32", "9.3f"),
            _cell(r, "int8_vs_ort", "9.3f"),
            _cell(r, "fp32_max_err", "9.2g"),
        ]
        print(f"{r['model']:<28} {r['threads']:>3} " + " ".join(cells), flush=True)
    for threads, g in summary.items():
        parts = [f"{k} {v:.3f}" for k, v in g.items() if v is not None]
        print(f"geomean, {threads} thread(s): " + (", ".join(parts) or "-"))


def main(argv: list[str] | None = None) -> int:
    """Compile, time and report; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared", help="the ../shared folder")
    p.add_argument("--models", default=",".join(ALL_MODELS), help="comma-separated model names")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--rounds", type=int, default=30, help="interleaved samples per candidate (median)")
    p.add_argument("--min-batch-s", type=float, default=0.02, help="minimum seconds of one sample")
    p.add_argument("--out", type=Path, default=None, help="work folder for artifacts (default: a temp dir)")
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help="write the results here (default: OUT/cpu_vs_ort.json when --out is given)",
    )
    p.add_argument("--precisions", default="fp32,int8", help="Kiln precisions to compile and time")
    p.add_argument(
        "--ort-stand-in", action="store_true", help="time onnxruntime in place of Kiln (no compile)"
    )
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    precisions = [q.strip() for q in args.precisions.split(",") if q.strip() in PRECISIONS]
    with tempfile.TemporaryDirectory(prefix="kiln-cpu-bench-") as tmp:
        work = args.out if args.out is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        cases = prepare_cases([m.strip() for m in args.models.split(",") if m.strip()], args.shared, work)
        rows: list[dict[str, Any]] = []
        failures: dict[str, str] = {}
        for case in cases:
            artifacts: dict[str, Path] = {}
            for precision in precisions:
                try:
                    artifacts[precision] = (
                        case.ort_model if args.ort_stand_in else compile_kiln(case, precision, work)
                    )
                except Exception as exc:  # noqa: BLE001 - report and carry on with the other models
                    failures[f"{case.name}.{precision}"] = f"{type(exc).__name__}: {exc}"
                    logging.getLogger(__name__).debug(traceback.format_exc())
            errs: dict[str, float] = {}
            ref = _ort_outputs(case.ort_model, case.feeds)
            for precision, path in artifacts.items():
                got = (
                    _ort_outputs(path, case.feeds)
                    if path.suffix == ".onnx"
                    else _tvm_outputs(path, case.feeds)
                )
                errs[f"{precision}_max_err"] = _max_err(got, ref)
            for t in threads:
                row = bench_case(case, artifacts, t, args.rounds, args.min_batch_s)
                row.update(errs)
                rows.append(row)
        summary = {
            str(t): {
                k: geomean([r[k] for r in rows if r["threads"] == t and k in r])
                for k in ("fp32_vs_ort", "int8_vs_ort", "int8_vs_fp32")
            }
            for t in threads
        }
        print_table(rows, summary)
        for what, msg in failures.items():
            print(f"compile failed: {what}: {msg}")
        report = {
            "machine": {"cpu": _cpu_name(), "cpus": len(os.sched_getaffinity(0))},
            "ort_version": ort.__version__,
            "stand_in": args.ort_stand_in,
            "rounds": args.rounds,
            "rows": rows,
            "geomean": summary,
            "failures": failures,
        }
        out_json = (
            args.json if args.json is not None else (args.out / "cpu_vs_ort.json" if args.out else None)
        )
        if out_json is not None:
            out_json.write_text(json.dumps(report, indent=2))
            print(f"wrote {out_json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
