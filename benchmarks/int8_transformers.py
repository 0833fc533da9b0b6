"""Benchmark: Kiln int8 (kiln::QGemm on the packed int8 dense kernel) against Kiln fp32, 1 thread.

Usage, from the repository root::

    .venv/bin/python benchmarks/int8_transformers.py --zoo-dir ZOO_DIR [--models bert,t5_encoder]
        [--target cpu|x86-avx2] [--rounds 15] [--skip-kernels]

Two parts, each candidate interleaved in this one process (:func:`compiler.bench.interleaved`:
median of ``--rounds`` samples, each a batch of >= ``--min-batch-s``):

* kernels: on transformer-shaped products ``[M, K] x [K, N]``, :func:`qdense_kernel` (u8 x s8,
  requantize fused, u8 out) against Kiln's fp32 dense kernel (:func:`dense_kernel`, no bias);
* models: every ``--models`` zoo model compiled by Kiln for ``--target`` in fp32 and in int8
  (``--quantize int8 --calib calib.npz``), run on the zoo's inputs, with onnxruntime fp32 on the
  source model as the third candidate (``int8/ort``).

Printed: the ISA line (the host's SIMD level, Kiln's ``cpu`` paths) and the path this run measured
(``--target`` and the int8 dense kernel's ISA from the artifact's kernel report: vnni, avx2...), then
the medians and ``int8/fp32`` per row (below 1: int8 is faster) and their geometric means, and the
same ratio of the calling thread's CPU time (``cpu int8/fp32``: on one thread it leaves out the time
other processes took the core, so on a loaded machine it is the stable one; wall ratios of one
loaded run were seen from 0.67 to 1.93 for the same whisper_encoder pair). A model that fails to
compile is reported and skipped. TVM_NUM_THREADS=1 is set before TVM is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["TVM_NUM_THREADS"] = "1"  # must precede `import tvm`; the benchmark is defined on 1 thread
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.cpu_vs_ort import ModelCase, bench_case, geomean  # noqa: E402
from benchmarks.zoo_vs_ort import isa_line, zoo_case  # noqa: E402
from compiler.bench import interleaved  # noqa: E402

__all__ = ["main", "KERNEL_SHAPES"]

DEFAULT_MODELS = "bert,distilbert,vit_tiny_patch16_224,whisper_encoder,t5_encoder"
# (M, K, N): vit_tiny qkv / fc1 / fc2 (197 tokens, width 192), a 128-wide encoder at 32 tokens,
# whisper's 200 frames at width 128, and one 768-wide BERT-base projection at 128 tokens
KERNEL_SHAPES = (
    (197, 192, 576),
    (197, 192, 768),
    (197, 768, 192),
    (32, 128, 512),
    (200, 128, 128),
    (128, 768, 768),
)


def _calls(qf: Any, q_args: list[Any], ff: Any, f_args: list[Any]) -> dict[str, Callable[[], object]]:
    return {"int8": lambda: qf(*q_args), "fp32": lambda: ff(*f_args)}


def _time_kernels(target_name: str, rounds: int, min_batch_s: float) -> list[dict[str, Any]]:
    import tvm

    from backends.tvm.kernels.dense import DenseSpec, dense_kernel, pack_dense_weight
    from backends.tvm.kernels.dense_int8 import qdense_kernel, qdense_spec
    from backends.tvm.kernels.qdense_spec import pack_qdense_bias, pack_qdense_multiplier, pack_qdense_weight
    from backends.tvm.target import resolve_target

    target = resolve_target(target_name)
    dev = tvm.cpu()
    rows = []
    for m, k, n in KERNEL_SHAPES:
        rng = np.random.default_rng(m + k + n)
        x_q = rng.integers(0, 256, (m, k)).astype(np.uint8)
        w_q = rng.integers(-128, 128, (k, n)).astype(np.int8)
        qs = qdense_spec(m, k, n, target, "uint8", 120, "uint8", 128)
        fs = DenseSpec(m=m, k=k, n=n, has_bias=False, block=target.lanes)
        qk, fk = qdense_kernel(qs, target), dense_kernel(fs, target)
        lib = tvm.compile(tvm.IRModule({qk.name: qk.func, fk.name: fk.func}), target.tvm_target())
        ws = tuple(float(v) for v in rng.uniform(1e-3, 3e-3, n).astype(np.float32))
        q_args = [
            x_q,
            pack_qdense_weight(w_q, qs),
            pack_qdense_bias(None, w_q, qs),
            pack_qdense_multiplier(0.02, ws, 0.05, qs),
        ]
        f_args = [
            rng.standard_normal((m, k)).astype(np.float32),
            pack_dense_weight(w_q.T.astype(np.float32), fs),
        ]
        q_t = [tvm.runtime.tensor(a, dev) for a in q_args] + [tvm.runtime.empty((m, n), "uint8", dev)]
        f_t = [tvm.runtime.tensor(a, dev) for a in f_args] + [tvm.runtime.empty((m, n), "float32", dev)]
        stats = interleaved(
            _calls(lib[qk.name], q_t, lib[fk.name], f_t), rounds=rounds, min_batch_s=min_batch_s
        )
        row: dict[str, Any] = {
            "shape": f"{m}x{k}x{n}",
            "path": qs.kind,
            "int8_us": stats["int8"].median_s * 1e6,
        }
        row["fp32_us"] = stats["fp32"].median_s * 1e6
        row["int8_vs_fp32"] = row["int8_us"] / row["fp32_us"]
        row["int8_gops"] = 2 * m * k * n / stats["int8"].median_s * 1e-9
        row["cpu_int8_vs_fp32"] = stats["int8"].cpu_median_s / stats["fp32"].cpu_median_s
        rows.append(row)
        print(
            f"{row['shape']:>14} {qs.kind:>5}: int8 {row['int8_us']:9.1f} us "
            f"({row['int8_gops']:6.1f} GOP/s)  fp32 {row['fp32_us']:9.1f} us"
            f"  int8/fp32 {row['int8_vs_fp32']:.3f}  cpu int8/fp32 {row['cpu_int8_vs_fp32']:.3f}",
            flush=True,
        )
    return rows


def _compile(case: ModelCase, precision: str, target: str, out: Path) -> Path:
    """``kiln compile`` of ``case`` for ``target`` at ``precision`` (fp32 | int8); the model.so path."""
    from compiler.driver import compile_model
    from compiler.options import CompileOptions
    from compiler.quant.options import QuantOptions

    out_dir = out / f"{case.name}.{target}.{precision}"
    kwargs: dict[str, Any] = {"model": case.model, "out_dir": out_dir, "emit": (), "targets": (target,)}
    kwargs["verify"] = False
    if precision == "int8":
        kwargs["quant"] = QuantOptions(calib=case.calib, sensitivity=False)
    compile_model(CompileOptions(**kwargs))
    return next(out_dir.glob("*/model.so"))


def _dense_isa(so: Path) -> str:
    """The ISA paths of the artifact's dense kernels (its model.json kernel report)."""
    meta = json.loads((so.parent / "model.json").read_text())
    return "/".join(meta.get("kernel_report", {}).get("dense", {}).get("isa", ["-"]))


def _time_models(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-int8-tf-") as tmp:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            case, _ = zoo_case(args.zoo_dir, name)
            try:
                so = {p: _compile(case, p, args.target, Path(tmp)) for p in ("fp32", "int8")}
            except Exception as exc:  # noqa: BLE001 - report and carry on with the other models
                print(f"{name}: compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                continue
            row = bench_case(case, so, 1, args.rounds, args.min_batch_s)
            row["int8_dense_isa"] = _dense_isa(so["int8"])
            row["cpu_int8_vs_fp32"] = row["int8_cpu_ms"] / row["fp32_cpu_ms"]
            rows.append(row)
            print(
                f"{name:<24} ort {row['ort_ms']:8.3f} ms  fp32 {row['fp32_ms']:8.3f} ms"
                f"  int8 {row['int8_ms']:8.3f} ms  int8/fp32 {row['int8_vs_fp32']:.3f}"
                f"  int8/ort {row['int8_vs_ort']:.3f}  cpu int8/fp32 {row['cpu_int8_vs_fp32']:.3f}"
                f"  (int8 dense: {row['int8_dense_isa']})",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Time the kernels and the models; print the table. Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--zoo-dir", type=Path, required=True, help="a materialized zoo (ZOO_DIR/<name>/model.onnx)"
    )
    p.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated zoo names")
    p.add_argument("--target", default="cpu", help="cpu (the host's best path) or x86-avx2")
    p.add_argument("--rounds", type=int, default=15, help="interleaved samples per candidate (median)")
    p.add_argument("--min-batch-s", type=float, default=0.02, help="minimum seconds of one sample")
    p.add_argument("--skip-kernels", action="store_true", help="only the models")
    args = p.parse_args(argv)
    import logging

    logging.disable(logging.WARNING)
    from backends.tvm.kernels.dense_int8 import qdense_kind
    from backends.tvm.target import resolve_target

    print(isa_line())
    kind = qdense_kind(resolve_target(args.target))
    print(f"measured: --target {args.target}, int8 dense path {kind}, 1 thread")
    if not args.skip_kernels:
        k_rows = _time_kernels(args.target, args.rounds, args.min_batch_s)
        kg = geomean([r["int8_vs_fp32"] for r in k_rows])
        kc = geomean([r["cpu_int8_vs_fp32"] for r in k_rows])
        print(f"kernels geomean int8/fp32: {kg:.3f} (cpu time {kc:.3f})")
    rows = _time_models(args)
    g = geomean([r["int8_vs_fp32"] for r in rows])
    if g is None:
        print("models: none ran")
    else:
        gc = geomean([r["cpu_int8_vs_fp32"] for r in rows])
        print(f"models geomean int8/fp32: {g:.3f} (cpu time {gc:.3f}) over {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
