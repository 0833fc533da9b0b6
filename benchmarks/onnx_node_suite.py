"""Benchmark: ONNX's whole node test suite through ``kiln compile --emit onnx --inputs`` (issue 15).

Usage, from the repository root::

    .venv/bin/python benchmarks/onnx_node_suite.py                    # every case, 2 worker processes
    .venv/bin/python benchmarks/onnx_node_suite.py --filter 'test_(conv|gemm)' --jobs 1
    .venv/bin/python benchmarks/onnx_node_suite.py --data-dir path/to/onnx/backend/test/data/node

Each case onnxruntime 1.32 can run is compiled by the real CLI and classified pass / refused /
wrong / crash (see :mod:`tests.helpers.node_suite`); the script prints the counts, the pass rate
over the ORT-runnable cases, the refused ops with their counts, and every non-passing case with
its reason (``--skipped`` also lists each case onnxruntime cannot run, with ORT's reason).
The exit status is 1 when any case is wrong or crashes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers.node_suite import cases_from_dir, load_cases, run_cases, summarize  # noqa: E402

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and print its report; returns 1 when any case is wrong or crashes."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--filter", default="", help="regex: only cases whose name matches")
    p.add_argument("--data-dir", type=Path, help="an on-disk node suite folder instead of the wheel's")
    p.add_argument("--skipped", action="store_true", help="list every case onnxruntime cannot run")
    p.add_argument("--json", type=Path, help="also write every case's outcome to this JSON file")
    args = p.parse_args(argv)
    start = time.perf_counter()
    cases = cases_from_dir(args.data_dir) if args.data_dir else load_cases()
    cases = [c for c in cases if re.search(args.filter, c.name)]
    outcomes = run_cases(cases, args.jobs)
    print(summarize(outcomes))
    if args.skipped:
        print("skipped cases:")
        print("\n".join(f"  {o.name}: {o.reason}" for o in outcomes if o.kind == "skipped"))
    if args.json:
        rows = [{"name": o.name, "kind": o.kind, "reason": o.reason, "ops": list(o.ops)} for o in outcomes]
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wall time: {time.perf_counter() - start:.0f} s ({args.jobs} jobs)")
    return 1 if any(o.kind in ("wrong", "crash") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
