"""Per-op-type time of several ``.mnn`` files in MNN's runtime, interleaved (where a file loses time).

Usage, from the repository root::

    .venv/bin/python benchmarks/mnn_op_profile.py INPUTS.npz A.mnn B.mnn [--rounds 50]

Each file runs in MNN's Session API (CPU, 1 thread, fp32 "high" precision); each round runs every
file once plainly (the ``forward`` row: thread CPU time of the whole forward) and once with MNN's
per-op callback (``runSessionWithCallBackInfo``), which times each executed op (after MNN's
geometry stage: Permute/Reshape show as Raster, MatMul/BatchMatMul/GatherV2 as While) with the
thread's CPU time. The files alternate in mirrored order from round to round, so a slow spell of
a shared machine hits all of them. Printed: per op type, the mean microseconds per forward and the
op count, per file. The callback adds a few microseconds per op, so compare rows, not totals.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["profile", "main"]


def _session(path: Path, feeds: dict[str, np.ndarray]) -> tuple[object, object]:
    import MNN

    interp = MNN.Interpreter(str(path))
    session = interp.createSession({"numThread": 1, "precision": "high"})
    for name, tensor in interp.getSessionInputAll(session).items():
        a = feeds[name]
        a = np.ascontiguousarray(a, np.float32 if a.dtype.kind == "f" else np.int32)
        kind = MNN.Halide_Type_Float if a.dtype == np.float32 else MNN.Halide_Type_Int
        tensor.copyFrom(MNN.Tensor(tuple(a.shape), kind, a, MNN.Tensor_DimensionType_Caffe))
    return interp, session


def profile(
    paths: list[Path], feeds: dict[str, np.ndarray], rounds: int
) -> tuple[list[float], list[dict[str, tuple[float, int]]]]:
    """(median forward us per file, per file {op type: (mean us per forward, ops per forward)})."""
    sessions = [_session(p, feeds) for p in paths]
    spent: list[collections.Counter[str]] = [collections.Counter() for _ in paths]
    counts: list[collections.Counter[str]] = [collections.Counter() for _ in paths]
    forward: list[list[float]] = [[] for _ in paths]
    state = {"file": 0, "t": 0}

    def begin(_tensors: object, _info: object) -> bool:
        state["t"] = time.thread_time_ns()
        return True

    def end(_tensors: object, info: object) -> bool:
        kind = info.getType()  # type: ignore[attr-defined]
        spent[state["file"]][kind] += time.thread_time_ns() - state["t"]
        counts[state["file"]][kind] += 1
        return True

    for r in range(rounds + 2):
        order = list(range(len(paths)))
        for i in order if r % 2 else order[::-1]:
            interp, session = sessions[i]
            t0 = time.thread_time_ns()
            interp.runSession(session)  # type: ignore[attr-defined]
            if r < 2:
                continue
            forward[i].append((time.thread_time_ns() - t0) / 1e3)
            state["file"] = i
            interp.runSessionWithCallBackInfo(session, begin, end)  # type: ignore[attr-defined]
    per_type = [
        {k: (spent[i][k] / rounds / 1e3, counts[i][k] // rounds) for k in spent[i]} for i in range(len(paths))
    ]
    return [statistics.median(f) for f in forward], per_type


def main(argv: list[str] | None = None) -> int:
    """Profile the files and print one row per op type."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", type=Path, help="an .npz of the model's inputs (by input name)")
    p.add_argument("files", type=Path, nargs="+", help=".mnn files of the same model")
    p.add_argument("--rounds", type=int, default=50)
    args = p.parse_args(argv)
    with np.load(args.inputs) as z:
        feeds = {k: z[k] for k in z.files}
    totals, per_type = profile(list(args.files), feeds, args.rounds)
    kinds = sorted({k for t in per_type for k in t}, key=lambda k: -per_type[0].get(k, (0.0, 0))[0])
    print(f"{'op type':<16}" + "".join(f"{str(f)[-26:]:>28}" for f in args.files))
    print(f"{'forward us':<16}" + "".join(f"{t:28.1f}" for t in totals))
    for k in kinds:
        cells = [t.get(k, (0.0, 0)) for t in per_type]
        print(f"{k:<16}" + "".join(f"{us:21.1f} ({n:4d})" for us, n in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
