"""A detector with data-dependent shapes (NonZero, NonMaxSuppression) on Kiln's TVM CPU artifact vs
onnxruntime: agreement of the detections as sets, and interleaved median latencies.

Usage, from the repository root (compile first, e.g. ``kiln compile MODEL -o OUT --target cpu``)::

    .venv/bin/python benchmarks/tvm_detector.py OUT/cpu/model.so MODEL.onnx --inputs inputs.npz [--runs 5]

Outputs are read as ``boxes [n, 4]``, ``scores [n]``, ``labels [n]`` (the first three outputs).
Each onnxruntime detection is matched to the unused Kiln detection of the same label nearest in
box and score (ties may be ordered differently); the script prints the counts, the unmatched
rows, the worst box and score differences over matched rows, whether the order is the same, and
the median latencies (runs interleaved: Kiln, onnxruntime, Kiln, ...) with their ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def match_detections(ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[int, float, float]:
    """(unmatched reference rows, worst |box diff|, worst |score diff|) over label-matched rows."""
    rb, rs, rl = ref[:3]
    gb, gs, gl = got[:3]
    used: set[int] = set()
    unmatched, worst_box, worst_score = 0, 0.0, 0.0
    for i in range(len(rb)):
        cands = [j for j in range(len(gb)) if gl[j] == rl[i] and j not in used]
        if not cands:
            unmatched += 1
            continue
        j = min(cands, key=lambda j: float(np.abs(gb[j] - rb[i]).max() + abs(gs[j] - rs[i])))
        used.add(j)
        worst_box = max(worst_box, float(np.abs(gb[j] - rb[i]).max()))
        worst_score = max(worst_score, float(abs(gs[j] - rs[i])))
    return unmatched, worst_box, worst_score


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("--inputs", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    import onnxruntime as ort

    from backends.tvm.runtime import load_artifact

    data = np.load(args.inputs)
    feeds = {k: data[k] for k in data.files}
    model = load_artifact(args.artifact)
    sess = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    got_d = model.run(feeds)
    got = [got_d[n] for n in names]
    ref = sess.run(None, feeds)
    unmatched, worst_box, worst_score = match_detections(ref, got)
    same = len(got[2]) == len(ref[2]) and bool(np.array_equal(got[2], ref[2]))
    print(f"detections: kiln {len(got[0])}, onnxruntime {len(ref[0])}; unmatched {unmatched}")
    print(f"matched rows: worst |box diff| {worst_box:.3g}, worst |score diff| {worst_score:.3g}")
    print(f"same order and labels: {same}")
    kiln_t, ort_t = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        model.run(feeds)
        kiln_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sess.run(None, feeds)
        ort_t.append(time.perf_counter() - t0)
    k, o = float(np.median(kiln_t)), float(np.median(ort_t))
    print(f"median latency: kiln {k * 1e3:.1f} ms, onnxruntime {o * 1e3:.1f} ms, ratio {k / o:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
