"""Benchmark: Kiln's fp32 conv as padding-free regions against the padded dense kernel and
onnxruntime, 1 thread.

Usage, from the repository root::

    .venv/bin/python benchmarks/conv_regions.py [--rounds 15] [--target cpu] [--only LABEL]

Each case is built twice, dense (``regions=False``: pad stage + every tap) and split into its
padding-free regions (``regions=True``, :mod:`backends.tvm.kernels.conv_regions`), and timed
interleaved with an onnxruntime single-conv session (dense, regions, ort, dense, ...), per-thread
CPU time over ~20 ms batches (as :mod:`benchmarks.conv_kernels`). Printed: the dead share of the
dense multiply-adds, whether :func:`splits_regions` picks the split, medians and the ratios
regions/dense and regions/ort (below 1: the split is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from backends.tvm.kernels.conv2d_nchwc import conv2d_nchwc_kernel  # noqa: E402
from backends.tvm.kernels.conv_regions import live_share, splits_regions  # noqa: E402
from backends.tvm.kernels.conv_spec import Conv2dSpec, pack_bias, pack_data, pack_weight  # noqa: E402
from backends.tvm.target import TargetSpec, resolve_target  # noqa: E402
from benchmarks.conv_kernels import _ort_session, _per_call, _reps_for  # noqa: E402

__all__ = ["main", "cases"]


def cases(block: int) -> dict[str, Conv2dSpec]:
    """Dilated convs on small maps (the split's class) and ordinary padded convs (its non-class)."""

    def c(ic: int, hw: int, oc: int, k: int, pad: int, dil: int = 1, stride: int = 1) -> Conv2dSpec:
        return Conv2dSpec(
            1,
            ic,
            hw,
            hw,
            oc,
            (k, k),
            strides=(stride, stride),
            pads=(pad,) * 4,
            dilations=(dil, dil),
            in_block=block,
            out_block=block,
        )

    return {
        "aspp r12 960->256 20x20": c(960, 20, 256, 3, 12, 12),
        "aspp r6 512->256 33x33": c(512, 33, 256, 3, 6, 6),
        "dil2 3x3 256 14x14": c(256, 14, 256, 3, 2, 2),
        "3x3 512 7x7": c(512, 7, 512, 3, 1),
        "3x3 256 14x14": c(256, 14, 256, 3, 1),
        "3x3 s2 128->256 14x14": c(128, 14, 256, 3, 1, 1, 2),
        "3x3 96 5x5": c(96, 5, 96, 3, 1),
    }


def _kiln(
    spec: Conv2dSpec, target: TargetSpec, regions: bool, w: np.ndarray, b: np.ndarray
) -> Callable[[], object]:
    import tvm

    kernel = conv2d_nchwc_kernel(spec, target, regions=regions)
    ex = tvm.compile(tvm.IRModule({kernel.name: kernel.func}), target.tvm_target())
    dev = tvm.cpu()
    x = np.random.default_rng(1).standard_normal((spec.batch, spec.in_channels, spec.in_h, spec.in_w))
    args = [
        tvm.runtime.tensor(pack_data(x.astype(np.float32), spec.in_block), dev),
        tvm.runtime.tensor(pack_weight(w, spec), dev),
        tvm.runtime.tensor(pack_bias(b, spec), dev),
        tvm.runtime.tensor(np.zeros(spec.out_shape, np.float32), dev),
    ]
    fn = ex[kernel.name]
    return lambda: fn(*args)


def bench(spec: Conv2dSpec, target: TargetSpec, rounds: int) -> tuple[float, float, float]:
    """Median per-call thread-CPU seconds (dense, regions, ort) over interleaved rounds."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((spec.out_channels, spec.in_channels, *spec.kernel)) * 0.1).astype(np.float32)
    b = rng.standard_normal(spec.out_channels).astype(np.float32)
    fns = [_kiln(spec, target, False, w, b), _kiln(spec, target, True, w, b), _ort_session(spec, w, b)]
    reps = [_reps_for(f) for f in fns]
    times: list[list[float]] = [[], [], []]
    for _ in range(rounds):
        for i, f in enumerate(fns):
            times[i].append(_per_call(f, reps[i]))
    d, r, o = (statistics.median(t) for t in times)
    return d, r, o


def main(argv: list[str] | None = None) -> int:
    """Run every case and print medians and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--only", default="", help="run the cases whose label contains this")
    args = ap.parse_args(argv)
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(1, 1)  # one thread: TVM runs on the caller
    target = resolve_target(args.target)
    print(f"target {target.name} (mcpu {target.mcpu}, lanes {target.lanes}), 1 thread")
    for label, spec in cases(target.lanes).items():
        if args.only not in label:
            continue
        t0 = time.perf_counter()
        d, r, o = bench(spec, target, args.rounds)
        dead = 1.0 - live_share(spec)
        pick = "split" if splits_regions(spec) else "dense"
        print(
            f"{label:26s} dead {dead:4.0%} picks {pick}  dense {d * 1e3:7.3f} ms  regions {r * 1e3:7.3f} ms"
            f"  ort {o * 1e3:7.3f} ms  regions/dense {r / d:5.2f}  regions/ort {r / o:5.2f}"
            f"  ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
