"""Benchmark: Kiln's NCHW[b]c fp32 conv kernels against onnxruntime single-conv sessions, 1 thread.

Usage, from the repository root::

    .venv/bin/python benchmarks/conv_kernels.py [--rounds 20] [--target cpu]

Three representative convs (3x3 128->128 at 28x28, 1x1 128->128 at 56x56, depthwise 3x3 128 at
56x56, all with bias) are timed in this one process, interleaved (Kiln, ORT, Kiln, ORT, ...).
Both engines run on the calling thread (TVM's pool configured to 1 thread; ORT with
``intra_op_num_threads=1`` and spinning off), so each sample is per-thread CPU time
(``time.thread_time``) over an inner batch of about 20 ms, which hides time-slicing by other
processes. The script prints per-call medians and the ratio kiln / ort (below 1: Kiln is faster).
ORT's single-conv session includes its NCHW <-> NCHWc reorders; Kiln's kernel reads and writes
the blocked layout directly (its input padding stage is included).
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

from backends.tvm.kernels.conv_spec import Conv2dSpec, conv2d_kernel, pack_bias, pack_data, pack_weight  # noqa: E402
from backends.tvm.target import TargetSpec, resolve_target  # noqa: E402

__all__ = ["main", "CASES", "bench_case"]


def _cases(block: int) -> dict[str, Conv2dSpec]:
    return {
        "conv3x3 128->128 28x28": Conv2dSpec(
            1, 128, 28, 28, 128, (3, 3), pads=(1, 1, 1, 1), in_block=block, out_block=block
        ),
        "conv1x1 128->128 56x56": Conv2dSpec(1, 128, 56, 56, 128, (1, 1), in_block=block, out_block=block),
        "dw3x3 128 56x56": Conv2dSpec(
            1, 128, 56, 56, 128, (3, 3), pads=(1, 1, 1, 1), groups=128, in_block=block, out_block=block
        ),
    }


CASES = tuple(_cases(8))


def _ort_session(spec: Conv2dSpec, w: np.ndarray, b: np.ndarray) -> Callable[[], object]:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    x_shape = [spec.batch, spec.in_channels, spec.in_h, spec.in_w]
    y_shape = [spec.batch, spec.out_channels, spec.out_h, spec.out_w]
    node = helper.make_node(
        "Conv",
        ["x", "w", "b"],
        ["y"],
        kernel_shape=list(spec.kernel),
        strides=list(spec.strides),
        pads=list(spec.pads),
        dilations=list(spec.dilations),
        group=spec.groups,
    )
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    feeds = {"x": x}
    return lambda: sess.run(None, feeds)


def _kiln_callable(
    spec: Conv2dSpec, target: TargetSpec, w: np.ndarray, b: np.ndarray
) -> Callable[[], object]:
    import tvm

    kernel = conv2d_kernel(spec, target)
    t0 = time.perf_counter()
    ex = tvm.compile(tvm.IRModule({kernel.name: kernel.func}), target.tvm_target())
    print(f"  build {kernel.name}: {time.perf_counter() - t0:.2f} s")
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


def _per_call(fn: Callable[[], object], reps: int) -> float:
    t0 = time.thread_time()
    for _ in range(reps):
        fn()
    return (time.thread_time() - t0) / reps


def _reps_for(fn: Callable[[], object], budget_s: float = 0.02) -> int:
    fn()
    t0 = time.perf_counter()
    fn()
    dt = max(time.perf_counter() - t0, 1e-6)
    return max(1, int(budget_s / dt))


def bench_case(spec: Conv2dSpec, target: TargetSpec, rounds: int) -> tuple[float, float]:
    """Median per-call thread-CPU seconds (kiln, ort) over interleaved rounds."""
    rng = np.random.default_rng(0)
    w = (
        rng.standard_normal((spec.out_channels, spec.in_channels // spec.groups, *spec.kernel)) * 0.1
    ).astype(np.float32)
    b = rng.standard_normal(spec.out_channels).astype(np.float32)
    kiln = _kiln_callable(spec, target, w, b)
    ort_fn = _ort_session(spec, w, b)
    rk, ro = _reps_for(kiln), _reps_for(ort_fn)
    tk: list[float] = []
    to: list[float] = []
    for _ in range(rounds):
        tk.append(_per_call(kiln, rk))
        to.append(_per_call(ort_fn, ro))
    return statistics.median(tk), statistics.median(to)


def main(argv: list[str] | None = None) -> int:
    """Run the three cases and print medians and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--block", type=int, default=0, help="channel block (default: the target's lanes)")
    args = ap.parse_args(argv)
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(1, 1)  # one thread: TVM runs on the caller
    target = resolve_target(args.target)
    block = args.block or target.lanes
    print(f"target {target.name} (mcpu {target.mcpu}, lanes {target.lanes}), block {block}, 1 thread")
    for label, spec in _cases(block).items():
        k, o = bench_case(spec, target, args.rounds)
        gf = spec.flops / 1e9
        print(
            f"{label:26s} kiln {k * 1e3:7.3f} ms ({gf / k:6.1f} GFLOP/s)  "
            f"ort {o * 1e3:7.3f} ms ({gf / o:6.1f} GFLOP/s)  kiln/ort {k / o:5.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
