"""Per-kernel times of a compiled TVM CPU artifact (which kernels a model's time goes to).

Usage, from the repository root::

    .venv/bin/python benchmarks/tvm_kernel_times.py OUT/cpu/model.so --inputs inputs.npz [--top 25]

The Relax VM calls an instrument before and after every call instruction; this script times each
call with ``perf_counter`` there and prints, per called function (Kiln's kernels, the generic
schedule's fused functions and the VM's builtins), its median time per model run, its share and
its calls per run, at one thread. The instrument's own overhead (a Python call, about a
microsecond) is inside every figure, so only the large rows and their ratios mean much; the plain
median latency of the run without the instrument is printed first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def kernel_times(
    artifact: Path, feeds: dict[str, np.ndarray], runs: int
) -> tuple[float, dict[str, tuple[float, int]]]:
    """(plain median run seconds, {function: (median seconds per run, calls per run)})."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from backends.tvm.runtime import configure_threads

    configure_threads(1)
    meta = json.loads(artifact.with_suffix(".json").read_text())
    vm = VirtualMachine(tvm.runtime.load_module(str(artifact)), tvm.cpu())
    args = [tvm.runtime.tensor(np.asarray(feeds[d["name"]])) for d in meta["inputs"]]
    main = vm["main"]
    plain = []
    for _ in range(runs):
        t0 = time.perf_counter()
        main(*args)
        plain.append(time.perf_counter() - t0)
    per_run: list[dict[str, list[float]]] = []
    started: list[float] = []

    def instrument(_func: Any, symbol: str, before: bool, _ret: Any, *_args: Any) -> int:
        if before:
            started.append(time.perf_counter())
        else:
            per_run[-1].setdefault(str(symbol), []).append(time.perf_counter() - started.pop())
        return 0

    vm.set_instrument(instrument)
    for _ in range(runs):
        per_run.append({})
        main(*args)
    names = sorted({n for r in per_run for n in r})
    table = {
        n: (float(np.median([sum(r.get(n, [])) for r in per_run])), len(per_run[-1].get(n, [])))
        for n in names
    }
    return float(np.median(plain)), table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path, help="a --target cpu model.so (its model.json beside it)")
    p.add_argument("--inputs", type=Path, required=True, help=".npz keyed by input name")
    p.add_argument("--runs", type=int, default=20, help="instrumented runs (medians)")
    p.add_argument("--top", type=int, default=25, help="rows to print")
    a = p.parse_args(argv)
    with np.load(a.inputs) as z:
        feeds = {k: np.asarray(z[k]) for k in z.files}
    plain, table = kernel_times(a.artifact, feeds, a.runs)
    total = sum(t for t, _ in table.values())
    print(f"plain run {plain * 1e3:.3f} ms; instrumented sum {total * 1e3:.3f} ms")
    for name, (t, calls) in sorted(table.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"{t * 1e6:10.1f} us {100 * t / total:5.1f}%  x{calls:<4d} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
