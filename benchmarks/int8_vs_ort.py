"""Benchmark: Kiln int8 on TVM CPU against onnxruntime's int8 on Kiln's own QDQ export, and Kiln fp32.

Usage, from the repository root::

    .venv/bin/python benchmarks/int8_vs_ort.py            # resnet50 and mobilenet_v2, 1 and 2 threads
    .venv/bin/python benchmarks/int8_vs_ort.py --models mobilenet_v2 --threads 1 --rounds 5

Models: the ResNet-50-, ResNet-18- and MobileNetV2-shaped builders of :mod:`tests.helpers.cnn_models`
(seeded random weights, input and calibration samples, as in ``benchmarks/cpu_vs_ort.py``).

Each model is compiled by Kiln for ``--target cpu`` twice (:func:`benchmarks.cpu_vs_ort.compile_kiln`):
fp32, and int8 (``--quantize int8``, seeded calibration samples) with ``--emit onnx`` as well, so the int8
compile also writes its QDQ ``model.onnx``. Then for every thread count three candidates run interleaved
in this one process (median of ``--rounds`` samples, each a batch of >= 20 ms):

* ``ort_int8``: onnxruntime (CPU EP, ``ORT_ENABLE_ALL``, so QDQ groups become QLinearConv & co.,
  intra-op threads = threads, inter-op 1, no spinning) on Kiln's QDQ ``model.onnx``;
* ``kiln_int8`` and ``kiln_fp32``: Kiln's ``cpu/model.so`` run by :mod:`backends.tvm.runtime`.

The table shows medians in ms and ``kiln_int8/ort_int8`` (acceptance: <= 0.9) and ``kiln_int8/kiln_fp32``
(acceptance: <= 0.5), plus the ISA line: per op class of the int8 artifact, the instruction path its
kernels use (``vnni``: ``vpdpbusd``; ``avx2``: ``pmaddwd``), read from the artifact's kernel report, and
the host's int8 dot capability. ``err`` is the largest absolute difference between Kiln int8 and
onnxruntime on the QDQ model (same input), in output units.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import benchmarks.cpu_vs_ort as cpu_bench  # noqa: E402
from benchmarks.cpu_vs_ort import ModelCase, compile_kiln, geomean  # noqa: E402
from compiler.bench import interleaved, runner_callable  # noqa: E402
from tests.helpers.cnn_models import CNN_MODELS, INPUT_SHAPE, resnet50  # noqa: E402

__all__ = ["main", "MODELS", "kiln_int8_isa", "ort_all_callable"]

MODELS: dict[str, Callable[[], Any]] = {"resnet50": resnet50, **CNN_MODELS}
DEFAULT_MODELS = ("resnet50", "mobilenet_v2")
CALIB_SAMPLES = 16


def _case(name: str, work: Path) -> ModelCase:
    """The model written under ``work/cnn`` with seeded input and calibration samples."""
    import onnx

    folder = work / "cnn"
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / f"{name}.onnx"
    if not model.is_file():
        onnx.save(MODELS[name](), str(model))
    rng = np.random.default_rng(0)
    calib = folder / f"{name}.calib.npz"
    np.savez(calib, input=rng.standard_normal((CALIB_SAMPLES, *INPUT_SHAPE)).astype(np.float32))
    feeds = {"input": rng.standard_normal(INPUT_SHAPE).astype(np.float32)}
    return ModelCase(name, model, model, feeds, calib)


def _compile(case: ModelCase, precision: str, work: Path) -> Path:
    """Kiln's model.so; the int8 compile also emits its QDQ ONNX next to it (``OUT/model.onnx``)."""
    emit = ("onnx",) if precision == "int8" else ()
    saved = cpu_bench.KILN_EMIT
    cpu_bench.KILN_EMIT = emit
    try:
        return compile_kiln(case, precision, work)
    finally:
        cpu_bench.KILN_EMIT = saved


def ort_all_callable(model: Path, feeds: Mapping[str, np.ndarray], threads: int) -> Callable[[], object]:
    """onnxruntime with ``ORT_ENABLE_ALL`` on ``model``, ``threads`` intra-op threads, no spinning."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    bound = {i.name: np.ascontiguousarray(feeds[i.name]) for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    return lambda: sess.run(names, bound)


def kiln_int8_isa(so_path: Path) -> dict[str, list[str]]:
    """Per op class, the ISA paths of the artifact's kernels (its ``model.json`` kernel report)."""
    meta = json.loads((so_path.parent / "model.json").read_text())
    report = meta.get("kernel_report", {})
    return {k: list(v.get("isa", [])) for k, v in sorted(report.items())}


def _host_isa() -> str:
    from backends.tvm.target import resolve_target

    t = resolve_target("cpu")
    path = {"vnni": "vnni (vpdpbusd)", "avx2": "avx2 (pmaddwd)"}.get(t.int8_dot, t.int8_dot)
    return f"{t.name}: int8 dot path {path}, fp32 lanes {t.lanes}"


def _row(
    name: str, threads: int, fns: dict[str, Callable[[], object]], rounds: int, min_batch_s: float
) -> dict[str, Any]:
    stats = interleaved(fns, rounds=rounds, min_batch_s=min_batch_s)
    row: dict[str, Any] = {"model": name, "threads": threads}
    row.update({f"{k}_ms": s.median_s * 1e3 for k, s in stats.items()})
    row["int8_vs_ort_int8"] = stats["kiln_int8"].median_s / stats["ort_int8"].median_s
    if "kiln_fp32" in stats:
        row["int8_vs_fp32"] = stats["kiln_int8"].median_s / stats["kiln_fp32"].median_s
    return row


def _fmt(row: Mapping[str, Any], key: str, fmt: str) -> str:
    v = row.get(key)
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def main(argv: list[str] | None = None) -> int:
    """Compile, time and report; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"from {', '.join(MODELS)}")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--rounds", type=int, default=15, help="interleaved samples per candidate (median)")
    p.add_argument("--min-batch-s", type=float, default=0.02, help="minimum seconds of one sample")
    p.add_argument("--out", type=Path, default=None, help="work folder for artifacts (default: a temp dir)")
    p.add_argument("--no-fp32", action="store_true", help="skip Kiln fp32 (int8 vs onnxruntime only)")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise SystemExit(f"int8_vs_ort: unknown model {unknown[0]!r} (choose from {', '.join(MODELS)})")
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    rows: list[dict[str, Any]] = []
    print(f"host: {_host_isa()}; onnxruntime {ort.__version__}")
    with tempfile.TemporaryDirectory(prefix="kiln-int8-bench-") as tmp:
        work = args.out if args.out is not None else Path(tmp)
        for name in names:
            case = _case(name, work)
            int8_so = _compile(case, "int8", work)
            qdq = int8_so.parent.parent / "model.onnx"
            fp32_so = None if args.no_fp32 else _compile(case, "fp32", work)
            print(f"{name}: kiln int8 ISA per op class: {kiln_int8_isa(int8_so)}", flush=True)
            ref = ort_all_callable(qdq, case.feeds, 1)()
            from backends.tvm.runtime import run_tvm

            got = run_tvm(int8_so, case.feeds)
            outs: list[np.ndarray] = [np.asarray(a) for a in list(got.values())]
            refs: list[np.ndarray] = [np.asarray(a) for a in ref]  # type: ignore[attr-defined]
            err = max(float(np.max(np.abs(a - b))) for a, b in zip(outs, refs, strict=True))
            for t in threads:
                fns: dict[str, Callable[[], object]] = {
                    "ort_int8": ort_all_callable(qdq, case.feeds, t),
                    "kiln_int8": runner_callable(int8_so, case.feeds, t),
                }
                if fp32_so is not None:
                    fns["kiln_fp32"] = runner_callable(fp32_so, case.feeds, t)
                row = _row(name, t, fns, args.rounds, args.min_batch_s)
                row["int8_max_err_vs_ort"] = err
                rows.append(row)
                print(
                    f"{name:<14} thr {t}: ort_int8 {_fmt(row, 'ort_int8_ms', '.2f')} ms, "
                    f"kiln_int8 {_fmt(row, 'kiln_int8_ms', '.2f')} ms, "
                    f"kiln_fp32 {_fmt(row, 'kiln_fp32_ms', '.2f')} ms, "
                    f"kiln_int8/ort_int8 {_fmt(row, 'int8_vs_ort_int8', '.3f')}, "
                    f"kiln_int8/kiln_fp32 {_fmt(row, 'int8_vs_fp32', '.3f')}, err {err:.3g}",
                    flush=True,
                )
    for t in threads:
        sel = [r for r in rows if r["threads"] == t]
        g1 = geomean([r["int8_vs_ort_int8"] for r in sel])
        g2 = geomean([r["int8_vs_fp32"] for r in sel if "int8_vs_fp32" in r])
        parts = [f"kiln_int8/ort_int8 {g1:.3f}" if g1 else "", f"kiln_int8/kiln_fp32 {g2:.3f}" if g2 else ""]
        print(f"geomean, {t} thread(s): " + ", ".join(x for x in parts if x))
    if args.json is not None:
        args.json.write_text(json.dumps({"host": _host_isa(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
