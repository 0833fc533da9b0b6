"""Benchmark: Kiln's TVM CPU fp32 artifacts against onnxruntime fp32 over the architecture zoo.

Usage, from the repository root::

    .venv/bin/python benchmarks/zoo_vs_ort.py --zoo-dir ZOO_DIR                       # all models
    .venv/bin/python benchmarks/zoo_vs_ort.py --zoo-dir ZOO_DIR --models resnet18,bert --rounds 10

``ZOO_DIR`` is a materialized zoo (``ZOO_DIR/<name>/model.onnx``, ``inputs.npz``, ``meta.json``;
see ``../shared/zoo/README.md``). Each model is compiled by Kiln for ``--target cpu`` in fp32
(:func:`benchmarks.cpu_vs_ort.compile_kiln`), then Kiln's ``cpu/model.so`` and onnxruntime on the
source model (CPU EP, ORT_ENABLE_ALL, 1 intra-op thread, no spinning) run interleaved in this one
process on the zoo's real inputs (:func:`benchmarks.cpu_vs_ort.bench_case`: medians of ``--rounds``
samples, each a batch of >= ``--min-batch-s``).

Printed: the ISA line (the host's best SIMD level and the ISA path Kiln's ``cpu`` target compiles
for), one row per model (family, wall medians, ``kiln/ort``: below 1 Kiln is faster, ``cpu k/o``:
the same ratio of thread-CPU medians, which at one thread hides time-slicing by other processes,
the max abs error against onnxruntime), the geometric means of both ratios overall and over the
transformer family, and the models above :data:`MAX_RATIO`. The transformer family is read from
the zoo's metadata, not from names: a model whose ``meta.json`` op histogram holds attention
(Softmax and MatMul) or whose family is one of :data:`ATTENTION_FAMILIES`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cpu_vs_ort import (  # noqa: E402
    ModelCase,
    _max_err,
    _ort_outputs,
    _tvm_outputs,
    bench_case,
    compile_kiln,
    geomean,
)
from benchmarks.zoo_matrix import cpu_isa, kiln_commit  # noqa: E402

__all__ = ["main", "zoo_case", "is_transformer", "isa_line", "ATTENTION_FAMILIES", "MAX_RATIO"]

ATTENTION_FAMILIES = frozenset({"nlp", "vit", "audio"})  # the zoo README's transformer categories
ATTENTION_OPS = ("Softmax", "MatMul")  # an op histogram with both holds attention
MAX_RATIO = 1.3  # the issue's per-model bound on kiln/ort
FAILURE_CHARS = 160


def _meta(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def is_transformer(meta: dict[str, Any]) -> bool:
    """True for a zoo model of the transformer family (its category, or attention in its ops)."""
    hist = meta.get("op_hist", {})
    return meta.get("family") in ATTENTION_FAMILIES or all(hist.get(op, 0) > 0 for op in ATTENTION_OPS)


def zoo_case(zoo: Path, name: str) -> tuple[ModelCase, dict[str, Any]]:
    """The benchmark case of one zoo model (real inputs, their own dtypes) and its metadata."""
    d = zoo / name
    model = d / "model.onnx"
    if not model.is_file():
        raise SystemExit(f"zoo_vs_ort: {model} is missing (materialize the zoo first)")
    with np.load(d / "inputs.npz") as z:
        feeds = {k: np.asarray(z[k]) for k in z.files}
    return ModelCase(name, model, model, feeds, d / "calib.npz"), _meta(d)


def isa_line() -> str:
    """The host's SIMD level and the ISA paths of Kiln's ``--target cpu`` (AVX-512 / VNNI, AVX2, generic)."""
    from backends.tvm.kernels.kernel import INT8_DOT_ISA, simd_isa
    from backends.tvm.target import host_target
    from compiler.errors import OptionError

    try:
        t = host_target()
        int8 = INT8_DOT_ISA.get(t.int8_dot, t.int8_dot)
        kiln = f"fp32 {simd_isa(t)}, int8 {int8} (mcpu {t.mcpu}, {t.lanes} fp32 lanes)"
    except OptionError:
        kiln = "generic (no AVX2+FMA: --target cpu refuses)"
    return f"cpu isa: {cpu_isa()}; kiln --target cpu: {kiln}"


def _names(zoo: Path, models: str | None) -> list[str]:
    if models:
        return [m.strip() for m in models.split(",") if m.strip()]
    return sorted(p.name for p in zoo.iterdir() if (p / "model.onnx").is_file())


def _ratio(row: dict[str, Any], key: str) -> float | None:
    k, o = row.get(f"fp32_{key}"), row.get(f"ort_{key}")
    return k / o if isinstance(k, float) and isinstance(o, float) and o > 0 else None


def print_table(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The per-model table and the geometric means (wall and thread-CPU medians); the summary."""
    head = (
        f"{'model':<38} {'family':<7} {'tf':>2} {'ort ms':>9} {'kiln ms':>9} {'kiln/ort':>9} "
        f"{'cpu k/o':>8} {'err':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        wall, cpu = _ratio(r, "ms"), _ratio(r, "cpu_ms")
        cells = [
            f"{r['ort_ms']:9.3f}",
            f"{r['fp32_ms']:9.3f}",
            f"{wall:9.3f}" if wall is not None else f"{'-':>9}",
            f"{cpu:8.3f}" if cpu is not None else f"{'-':>8}",
            f"{r['fp32_max_err']:9.2g}",
        ]
        tf = "y" if r["transformer"] else ""
        print(f"{r['model']:<38} {r['family']:<7} {tf:>2} " + " ".join(cells), flush=True)

    def gm(key: str, transformers: bool) -> float | None:
        vals = [_ratio(r, key) for r in rows if r["transformer"] or not transformers]
        return geomean([v for v in vals if v is not None])

    summary = {
        "geomean": gm("ms", False),
        "transformer_geomean": gm("ms", True),
        "max": max((v for r in rows if (v := _ratio(r, "ms")) is not None), default=None),
        "cpu_geomean": gm("cpu_ms", False),
        "cpu_transformer_geomean": gm("cpu_ms", True),
    }
    for k, v in summary.items():
        print(f"{k}: {'-' if v is None else format(v, '.3f')}")
    over = [f"{r['model']} {v:.2f}" for r in rows if (v := _ratio(r, "ms")) is not None and v > MAX_RATIO]
    print(f"above {MAX_RATIO}x: {', '.join(over) or 'none'}")
    return summary


def main(argv: list[str] | None = None) -> int:
    """Compile, time and report; returns the exit status (1 when a model failed to compile)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--zoo-dir", type=Path, required=True, help="a materialized zoo (ZOO_DIR/<name>/model.onnx)"
    )
    p.add_argument("--models", default=None, help="comma-separated zoo names (default: every model)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved samples per candidate (median)")
    p.add_argument("--min-batch-s", type=float, default=0.02, help="minimum seconds of one sample")
    p.add_argument("--out", type=Path, default=None, help="work folder for artifacts (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None, help="write the rows and summary here")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    print(isa_line(), flush=True)
    rows: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kiln-zoo-bench-") as tmp:
        work = args.out if args.out is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in _names(args.zoo_dir, args.models):
            case, meta = zoo_case(args.zoo_dir, name)
            info = {"model": name, "family": meta.get("family", "?"), "transformer": is_transformer(meta)}
            try:
                so = compile_kiln(case, "fp32", work)
            except Exception as exc:  # noqa: BLE001 - report and carry on with the other models
                first = str(exc).splitlines()[0] if str(exc) else ""
                failures[name] = f"{type(exc).__name__}: {first[:FAILURE_CHARS]}"
                logging.getLogger(__name__).debug(traceback.format_exc())
                print(f"{name}: compile failed: {failures[name]}", flush=True)
                continue
            row = bench_case(case, {"fp32": so}, 1, args.rounds, args.min_batch_s)
            row.update(info)
            row["fp32_max_err"] = _max_err(_tvm_outputs(so, case.feeds), _ort_outputs(case.model, case.feeds))
            rows.append(row)
            print(f"{name}: kiln/ort {row['fp32_vs_ort']:.3f}", flush=True)
        print()
        print(isa_line())
        summary = print_table(rows)
        for what, msg in failures.items():
            print(f"compile failed: {what}: {msg}")
        if args.json is not None:
            report = {
                "isa": isa_line(),
                "commit": kiln_commit(),
                "ort_version": ort.__version__,
                "rounds": args.rounds,
                "rows": rows,
                "summary": summary,
                "failures": failures,
            }
            args.json.write_text(json.dumps(report, indent=2))
            print(f"wrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
