"""Benchmark: Kiln's int8 conv2d kernel against fp32 and onnxruntime's QLinearConv, 1 thread.

Usage, from the repository root::

    .venv/bin/python benchmarks/int8_kernels.py [--rounds 25] [--target cpu]

The case is a 3x3 conv, 128 -> 128 channels, 28x28, pad 1 (231 M int ops). Candidates run
interleaved in one process (one inner batch of each per round, >= 10 ms per batch), and the script
prints the median per-call time of each over the rounds and the ratios against Kiln int8:

* ``kiln int8``: :func:`qconv2d_kernel` (u8 x s8, requantize + relu fused, u8 NCHW16c out);
* ``kiln fp32``: Kiln's fp32 ``conv2d_kernel`` (NCHW[lanes]c, bias + relu) when it imports,
  otherwise an onnxruntime fp32 Conv+Relu session (the label says which);
* ``ort qlinearconv``: a single QLinearConv (u8 activations, per-channel s8 weights) session, and
  ``ort qlinearconv chain8/8``: 8 chained QLinearConvs divided by 8 (amortizes ORT's layout reorders).

Both engines run on the calling thread (TVM_NUM_THREADS=1 is set before TVM is imported, and
onnxruntime has intra_op_num_threads=1 without spinning), so wall time is also thread CPU time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["TVM_NUM_THREADS"] = "1"  # must precede `import tvm`; the benchmark is defined on 1 thread
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from backends.tvm.kernels.conv2d_int8 import qconv2d_kernel  # noqa: E402
from backends.tvm.kernels.qconv_spec import QConv2dSpec, pack_multiplier, pack_qbias, pack_qweight  # noqa: E402
from backends.tvm.target import resolve_target  # noqa: E402
from compiler.ops.blocked_layout import pack  # noqa: E402

__all__ = ["main"]

C, H, W = 128, 28, 28


def _ort_session(model: Any) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _qlinear_model(w_q: np.ndarray, w_scale: np.ndarray, bias_q: np.ndarray, chain: int) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
        numpy_helper.from_array(np.array(3, np.uint8), "xz"),
        numpy_helper.from_array(w_q, "w"),
        numpy_helper.from_array(w_scale, "ws"),
        numpy_helper.from_array(np.zeros(C, np.int8), "wz"),
        numpy_helper.from_array(bias_q, "b"),
    ]
    nodes = []
    prev = "x"
    for i in range(chain):
        out = "y" if i == chain - 1 else f"t{i}"
        nodes.append(
            helper.make_node(
                "QLinearConv",
                [prev, "xs", "xz", "w", "ws", "wz", "xs", "xz", "b"],
                [out],
                pads=[1, 1, 1, 1],
                kernel_shape=[3, 3],
            )
        )
        prev = out
    graph = helper.make_graph(
        nodes,
        "q",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, C, H, W])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _fp32_ort_model(w: np.ndarray, b: np.ndarray) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, W])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _kiln_fp32(x: np.ndarray, w: np.ndarray, b: np.ndarray, target_name: str) -> Callable[[], object] | None:
    """Kiln's fp32 kernel as a callable, or None when it is not available yet."""
    try:
        import tvm

        from backends.tvm.kernels.conv_spec import (
            Conv2dSpec,
            conv2d_kernel,
            pack_bias,
            pack_data,
            pack_weight,
        )
    except ImportError:
        return None
    target = resolve_target(target_name)
    blk = target.lanes
    spec = Conv2dSpec(
        1, C, H, W, C, (3, 3), pads=(1, 1, 1, 1), in_block=blk, out_block=blk, activation="relu"
    )
    try:
        k = conv2d_kernel(spec, target)
    except (ImportError, NotImplementedError):
        return None
    lib = tvm.compile(tvm.IRModule({k.name: k.func}), target.tvm_target())
    dev = tvm.cpu()
    args = [pack_data(x, blk), pack_weight(w, spec), pack_bias(b, spec), np.zeros(k.out_shape, np.float32)]
    t_args = [tvm.runtime.tensor(a, dev) for a in args]
    f = lib[k.name]
    return lambda: f(*t_args)


def _batched(fn: Callable[[], object], min_s: float = 0.01) -> tuple[Callable[[], float], int]:
    """A sampler running ``fn`` enough times per sample to take >= ``min_s``; returns per-call seconds."""
    fn()
    t0 = time.perf_counter()
    fn()
    reps = max(1, int(min_s / max(time.perf_counter() - t0, 1e-6)) + 1)

    def sample() -> float:
        s = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - s) / reps

    return sample, reps


def main(argv: list[str] | None = None) -> int:
    """Run the interleaved benchmark and print medians and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--target", default="cpu")
    args = ap.parse_args(argv)

    import tvm

    rng = np.random.default_rng(0)
    x_q = rng.integers(0, 256, (1, C, H, W)).astype(np.uint8)
    w_q = rng.integers(-127, 128, (C, C, 3, 3)).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.004, C).astype(np.float32)
    bias_q = rng.integers(-2000, 2000, C).astype(np.int32)
    x_f = (x_q.astype(np.float32) - 3) * 0.02
    w_f = w_q.astype(np.float32) * w_scale[:, None, None, None]
    b_f = bias_q.astype(np.float32) * 0.02 * w_scale

    target = resolve_target(args.target)
    spec = QConv2dSpec(
        1, C, H, W, C, (3, 3), pads=(1, 1, 1, 1), x_zero=3, y_scale=0.02, y_zero=3, activation="relu"
    )
    t0 = time.perf_counter()
    k = qconv2d_kernel(spec, target)
    lib = tvm.compile(tvm.IRModule({k.name: k.func}), target.tvm_target())
    print(f"kiln int8 kernel {k.name}: schedule+compile {time.perf_counter() - t0:.2f} s")
    dev = tvm.cpu()
    q_args = [
        pack(x_q, spec.in_block),
        pack_qweight(w_q, spec),
        pack_qbias(bias_q, w_q, spec),
        pack_multiplier(0.02, w_scale, spec),
        np.zeros(spec.out_shape, np.uint8),
    ]
    tq = [tvm.runtime.tensor(a, dev) for a in q_args]
    fq = lib[k.name]

    cands: dict[str, Callable[[], object]] = {"kiln int8": lambda: fq(*tq)}
    fp32 = _kiln_fp32(x_f, w_f, b_f, args.target)
    if fp32 is not None:
        cands["kiln fp32"] = fp32
    else:
        s32 = _ort_session(_fp32_ort_model(w_f, b_f))
        cands["ort fp32 (Kiln fp32 kernel unavailable)"] = lambda: s32.run(None, {"x": x_f})
    s1 = _ort_session(_qlinear_model(w_q, w_scale, bias_q, 1))
    s8 = _ort_session(_qlinear_model(w_q, w_scale, bias_q, 8))
    cands["ort qlinearconv"] = lambda: s1.run(None, {"x": x_q})
    cands["ort qlinearconv chain8/8"] = lambda: s8.run(None, {"x": x_q})
    scale = {"ort qlinearconv chain8/8": 1 / 8}

    samplers = {name: _batched(fn)[0] for name, fn in cands.items()}
    times: dict[str, list[float]] = {name: [] for name in cands}
    for _ in range(args.rounds):
        for name, sample in samplers.items():
            times[name].append(sample() * scale.get(name, 1.0))
    med = {name: statistics.median(v) for name, v in times.items()}
    base = med["kiln int8"]
    print(f"3x3 conv {C}->{C} {H}x{W}, {spec.ops / 1e6:.0f} M ops, 1 thread, median of {args.rounds} rounds")
    for name, m in med.items():
        gops = spec.ops / m / 1e9
        print(f"  {name:42s} {m * 1e3:8.3f} ms  {gops:7.1f} GOP/s  kiln_int8/this = {base / m:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
