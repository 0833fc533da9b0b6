"""Benchmark: every zoo model compiled for ``--target arm`` and run on the emulated aarch64 board.

Usage, from the repository root (``scripts/setup_arm.sh`` must have made ``.arm/``)::

    .venv/bin/python benchmarks/zoo_arm.py --zoo-dir ZOO_DIR                    # all models
    .venv/bin/python benchmarks/zoo_arm.py --zoo-dir ZOO_DIR --models bert,resnet18 --json out.json

``ZOO_DIR`` is a materialized zoo (``../shared/tools/zoo/zoo.py materialize all DIR``). One
emulated RPC server (qemu-aarch64, see :mod:`backends.tvm.arm_emulator`) serves the whole run;
each model goes through :func:`tests.helpers.arm_judge.judge_on_arm`: ``kiln compile --target arm
--no-verify``, one run over RPC on ``inputs.npz``, and Kiln's fp32 verification rule against
onnxruntime on this x86 host. Printed: the host ISA and the ARM target's ISA path, then one row per
model (ok / miss / refused / error, seconds, worst output's max rel and its allowance), and the
counts. This is a coverage sweep, not a timing: qemu's speed says nothing about a real board.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from backends.tvm.arm_emulator import DEFAULT_ARM_DIR, emulated_rpc_server  # noqa: E402
from benchmarks.zoo_matrix import cpu_isa, kiln_commit  # noqa: E402
from tests.helpers.arm_judge import judge_on_arm  # noqa: E402


def _row(name: str, cls: str, seconds: float, detail: str) -> str:
    return f"{name:<38} {cls:<8} {seconds:7.1f}  {detail}"


def _worst(checks: list[dict[str, Any]]) -> str:
    worst = max(checks, key=lambda c: c["max_rel"])
    allow = f", exact {worst['exact']:.3g} vs ort {worst['ref_exact']:.3g}" if "exact" in worst else ""
    return f"worst {worst['name']}: max_rel {worst['max_rel']:.3g}{allow}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run every requested zoo model on the emulated board and print the table."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--zoo-dir", type=Path, required=True, help="materialized zoo")
    p.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one remote run may take")
    p.add_argument("--json", type=Path, metavar="FILE", help="save every result")
    args = p.parse_args(argv)
    names = sorted(d.name for d in args.zoo_dir.iterdir() if (d / "model.onnx").is_file())
    wanted = [s.strip() for s in args.models.split(",") if s.strip()]
    if wanted:
        missing = sorted(set(wanted) - set(names))
        if missing:
            p.error(f"--models: not in {args.zoo_dir}: {', '.join(missing)}")
        names = [n for n in names if n in wanted]
    print(f"host cpu isa: {cpu_isa()}")
    print("target: arm (aarch64, NEON fp32 path), run under qemu-aarch64 over TVM RPC")
    print(f"kiln commit: {kiln_commit()}; models: {len(names)}")
    print(f"{'model':<38} {'class':<8} {'seconds':>7}  detail")
    results: list[dict[str, Any]] = []
    with emulated_rpc_server(DEFAULT_ARM_DIR) as rpc, tempfile.TemporaryDirectory(prefix="kiln-arm-") as tmp:
        for name in names:
            d = args.zoo_dir / name
            t0 = time.perf_counter()
            try:
                j = judge_on_arm(d / "model.onnx", d / "inputs.npz", Path(tmp) / name, rpc, args.timeout)
                if j.rc == 2:
                    cls, detail = "refused", j.why_not
                elif j.rc != 0 or not j.checks:
                    cls, detail = "error", j.why_not
                else:
                    cls, detail = ("ok" if j.passed else "miss"), _worst(j.checks)
                checks = j.checks
            except Exception as exc:  # a benchmark row, not a crash of the sweep
                cls, detail, checks = "error", f"{type(exc).__name__}: {exc}"[:200], []
                traceback.print_exc(file=sys.stderr)
            secs = time.perf_counter() - t0
            print(_row(name, cls, secs, detail), flush=True)
            results.append({"model": name, "class": cls, "seconds": secs, "detail": detail, "checks": checks})
    counts = Counter(r["class"] for r in results)
    print("\n" + ", ".join(f"{k}: {counts.get(k, 0)}" for k in ("ok", "miss", "refused", "error")))
    if args.json is not None:
        args.json.write_text(json.dumps({"commit": kiln_commit(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
