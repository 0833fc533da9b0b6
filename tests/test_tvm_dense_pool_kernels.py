"""Kiln's dense and NCHW[b]c pooling kernels against numpy / the op registry references."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
import tvm

from backends.tvm.kernels.dense import DenseSpec, dense_kernel, pack_dense_bias, pack_dense_weight
from backends.tvm.kernels.kernel import Kernel
from backends.tvm.kernels.pool_nchwc import PoolSpec, pool_kernel
from backends.tvm.target import TargetSpec, resolve_target
from compiler.ops.pooling import AveragePoolAttrs, MaxPoolAttrs
from compiler.ops.registry import get_op

CPU = resolve_target("cpu")
AVX2 = resolve_target("x86-avx2")


def _close(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@cache
def _build(func: Any, target: TargetSpec) -> Any:
    return tvm.compile(func, target.tvm_target())


def _call(kern: Kernel, target: TargetSpec, *args: np.ndarray) -> np.ndarray:
    lib = _build(kern.func, target)
    out = tvm.runtime.tensor(np.zeros(kern.out_shape, np.float32))
    lib[kern.name](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args], out)
    return out.numpy()


def _act(y: np.ndarray, name: str, alpha: float, beta: float) -> np.ndarray:
    """ONNX activation math in float64."""
    if name == "none":
        return y
    if name == "relu":
        return np.maximum(y, 0)
    if name == "relu6":
        return np.clip(y, 0, 6)
    if name == "clip":
        return np.minimum(np.maximum(y, alpha), beta)
    if name == "leaky_relu":
        return np.where(y >= 0, y, alpha * y)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-y))
    if name == "hard_sigmoid":
        return np.clip(alpha * y + beta, 0, 1)
    if name == "hard_swish":
        return y * np.clip(y / 6 + 0.5, 0, 1)
    if name == "tanh":
        return np.tanh(y)
    raise AssertionError(name)


DENSE_CASES = [
    DenseSpec(1, 512, 1000, "none"),
    DenseSpec(1, 64, 10, "relu", block=8),
    DenseSpec(2, 100, 48, "relu6", has_bias=False),
    DenseSpec(3, 48, 37, "clip", alpha=-0.5, beta=0.7),
    DenseSpec(4, 32, 64, "leaky_relu", alpha=0.1),
    DenseSpec(1, 40, 33, "sigmoid", block=8),
    DenseSpec(1, 80, 16, "hard_sigmoid", alpha=0.2, beta=0.5),
    DenseSpec(5, 24, 20, "hard_swish"),
    DenseSpec(1, 1024, 128, "tanh"),
]


@pytest.mark.parametrize("spec", DENSE_CASES, ids=lambda s: f"{s.m}x{s.k}x{s.n}-{s.activation}-b{s.block}")
def test_dense_matches_numpy(spec: DenseSpec) -> None:
    target = CPU if spec.block == 16 else AVX2
    rng = np.random.default_rng(spec.k + spec.n)
    x = rng.uniform(-1, 1, (spec.m, spec.k)).astype(np.float32)
    w = (rng.uniform(-1, 1, (spec.n, spec.k)) * 2 / np.sqrt(spec.k)).astype(np.float32)
    b = rng.uniform(-1, 1, spec.n).astype(np.float32)
    kern = dense_kernel(spec, target)
    args = [x, pack_dense_weight(w, spec)] + ([pack_dense_bias(b, spec)] if spec.has_bias else [])
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + (b if spec.has_bias else 0.0)
    _close(_call(kern, target, *args), _act(ref, spec.activation, spec.alpha, spec.beta))


def test_dense_packing_names_and_schedule() -> None:
    spec = DenseSpec(2, 300, 70, "relu")
    w = np.arange(70 * 300, dtype=np.float32).reshape(70, 300)
    wp = pack_dense_weight(w, spec)
    assert wp.shape == (5, 300, 16) and wp[4, 7, 5] == w[69, 7] and not wp[4, :, 6:].any()
    assert pack_dense_bias(None, spec).shape == (80,)
    k1, k2 = dense_kernel(spec, CPU), dense_kernel(spec, CPU)
    assert k1.name == k2.name and k1.name != dense_kernel(DenseSpec(2, 300, 70), CPU).name
    assert k1.out_shape == (2, 70) and k1.func.attrs["kiln.scheduled"] == "dense"
    text = k1.func.script()
    assert "T.vectorized" in text and "T.unroll" in text and '"local"' not in text  # stack, not workspace
    assert "T.parallel" in dense_kernel(DenseSpec(1, 512, 1024), CPU).func.script()
    with pytest.raises(ValueError):
        dense_kernel(DenseSpec(1, 8, 8, "gelu"), CPU)


def _to_nchw(x: np.ndarray) -> np.ndarray:
    n, cb, h, w, b = x.shape
    return x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)


def _to_blocked(x: np.ndarray, block: int) -> np.ndarray:
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def _pool_ref(spec: PoolSpec, x: np.ndarray) -> np.ndarray:
    nchw = _to_nchw(x)
    pt, pl, pb, pr = spec.pads
    if spec.mode == "global_avg":
        y = get_op("GlobalAveragePool").reference([nchw], None, 1)[0]
    elif spec.mode == "max":
        ma = MaxPoolAttrs(
            kernel_shape=spec.kernel,
            strides=spec.strides,
            pads=(pt, pl, pb, pr),
            ceil_mode=int(spec.ceil_mode),
        )
        y = get_op("MaxPool").reference([nchw], ma, 1)[0]
    else:
        aa = AveragePoolAttrs(
            kernel_shape=spec.kernel,
            strides=spec.strides,
            pads=(pt, pl, pb, pr),
            ceil_mode=int(spec.ceil_mode),
            count_include_pad=int(spec.count_include_pad),
        )
        y = get_op("AveragePool").reference([nchw], aa, 1)[0]
    return _to_blocked(y, spec.block)


POOL_CASES = [
    PoolSpec("max", 1, 4, 56, 56, 16, (3, 3), (2, 2), (1, 1, 1, 1)),
    PoolSpec("max", 2, 2, 13, 15, 8, (3, 3), (2, 2), (0, 1, 1, 0), ceil_mode=True),
    PoolSpec("max", 1, 3, 9, 9, 16, (2, 2), (2, 2), ceil_mode=True),
    PoolSpec("max", 1, 2, 10, 12, 16, (3, 2), (1, 1), (1, 0, 2, 1)),
    PoolSpec("avg", 1, 4, 28, 28, 16, (3, 3), (2, 2), (1, 1, 1, 1)),
    PoolSpec("avg", 1, 4, 28, 28, 16, (3, 3), (2, 2), (1, 1, 1, 1), count_include_pad=True),
    PoolSpec("avg", 2, 2, 11, 14, 8, (3, 3), (2, 2), (1, 0, 0, 2), ceil_mode=True),
    PoolSpec("avg", 1, 2, 11, 14, 8, (3, 3), (2, 2), (1, 0, 0, 2), ceil_mode=True, count_include_pad=True),
    PoolSpec("avg", 1, 1, 7, 7, 16, (7, 7)),
    PoolSpec("global_avg", 1, 8, 7, 7, 16),
    PoolSpec("global_avg", 2, 3, 20, 17, 8),
]


@pytest.mark.parametrize("spec", POOL_CASES, ids=lambda s: f"{s.mode}-{s.in_h}x{s.in_w}-k{s.kernel}-{s.pads}")
def test_pool_matches_reference(spec: PoolSpec) -> None:
    target = CPU if spec.block == 16 else AVX2
    x = np.random.default_rng(spec.in_h * spec.in_w).standard_normal(spec.data_shape).astype(np.float32)
    kern = pool_kernel(spec, target)
    got = _call(kern, target, x)
    assert got.shape == spec.out_shape
    _close(got, _pool_ref(spec, x))


def test_pool_schedule_and_names() -> None:
    spec = POOL_CASES[0]
    kern = pool_kernel(spec, CPU)
    text = kern.func.script()
    assert "T.parallel" in text and "T.vectorized" in text
    assert kern.name == pool_kernel(spec, CPU).name != pool_kernel(POOL_CASES[1], CPU).name
    assert kern.func.attrs["kiln.scheduled"] == "pool_nchwc" and kern.out_shape == (1, 4, 28, 28, 16)
    with pytest.raises(ValueError):
        pool_kernel(PoolSpec("min", 1, 1, 4, 4, 8, (2, 2)), CPU)
