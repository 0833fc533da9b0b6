"""Register-tile accumulators of the CPU kernels (fp32, int8 conv, weight-only matmul) are stack arrays.

TVM serves every ``local``-scope buffer (and a global one of 1 KiB or more) from the workspace pool:
a ``TVMBackendAllocWorkspace``/``FreeWorkspace`` call pair around every tile. A global tile buffer
under 1 KiB is an ``alloca`` that LLVM keeps in registers, and the tile pickers keep their tiles
under that limit. Kernels without a padding stage must compile with no workspace call at all; the
numerics are checked against numpy.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import te

from backends.tvm.kernels.conv2d_int8 import _tile, dot_kind, qconv2d_kernel
from backends.tvm.kernels.conv2d_nchwc import ConvTile, conv2d_nchwc_kernel, pick_conv_tile
from backends.tvm.kernels.conv_spec import Conv2dSpec, conv2d_kernel, pack_bias, pack_data, pack_weight
from backends.tvm.kernels.dense import DenseSpec, dense_kernel, pack_dense_bias, pack_dense_weight
from backends.tvm.kernels.kernel import Kernel
from backends.tvm.kernels.pool_nchwc import PoolSpec, pool_kernel
from backends.tvm.kernels.qconv_spec import QConv2dSpec
from backends.tvm.lowering.weight_only import schedule_weight_only, weight_only_matmul_te
from backends.tvm.schedule_matmul import MatmulTile, pick_matmul_tile
from backends.tvm.schedule_nest import fits_stack
from backends.tvm.target import resolve_target, why_not_runnable_here
from tests.helpers.int8_conv_reference import case_inputs, reference, run_packed

CPU = resolve_target("cpu")
_WORKSPACE = re.compile(r"load ptr, ptr @__TVMBackendAllocWorkspace")


def _build(kern: Kernel) -> tuple[Any, int]:
    """The compiled module and the number of workspace allocation sites in its LLVM IR."""
    lib = tvm.compile(kern.func, CPU.tvm_target())
    return lib, len(_WORKSPACE.findall(str(lib.mod.inspect_source("ll"))))


def _call(lib: Any, kern: Kernel, *args: np.ndarray) -> np.ndarray:
    out = tvm.runtime.tensor(np.zeros(kern.out_shape, np.float32))
    lib[kern.name](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args], out)
    return out.numpy()


def test_dense_tile_has_no_workspace_call() -> None:
    spec = DenseSpec(32, 64, 64, "relu")
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (spec.m, spec.k)).astype(np.float32)
    w = rng.uniform(-0.2, 0.2, (spec.n, spec.k)).astype(np.float32)
    b = rng.uniform(-1, 1, spec.n).astype(np.float32)
    kern = dense_kernel(spec, CPU)
    assert '"local"' not in kern.func.script()
    lib, sites = _build(kern)
    assert sites == 0
    got = _call(lib, kern, x, pack_dense_weight(w, spec), pack_dense_bias(b, spec))
    ref = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_depthwise_tile_has_no_workspace_call() -> None:
    spec = Conv2dSpec(1, 32, 12, 14, 32, (3, 3), groups=32, in_block=16, out_block=16)
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (1, 32, 12, 14)).astype(np.float32)
    w = rng.uniform(-1, 1, (32, 1, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 32).astype(np.float32)
    kern = conv2d_kernel(spec, CPU)
    lib, sites = _build(kern)
    assert sites == 0  # no pads: no padding stage, and the accumulator tile is on the stack
    got = _call(lib, kern, pack_data(x, spec.in_block), pack_weight(w, spec), pack_bias(b, spec))
    ref = np.zeros((1, 32, spec.out_h, spec.out_w))
    for kh in range(3):
        for kw in range(3):
            ref += x[:, :, kh : kh + spec.out_h, kw : kw + spec.out_w] * w[None, :, 0, kh, kw, None, None]
    ref += b[None, :, None, None]
    np.testing.assert_allclose(got, pack_data(ref.astype(np.float32), spec.out_block), rtol=1e-5, atol=1e-5)


def test_pool_tile_has_no_workspace_call() -> None:
    spec = PoolSpec("avg", 1, 2, 9, 9, 16, (3, 3), (2, 2), (1, 1, 1, 1))
    x = np.random.default_rng(2).uniform(-1, 1, (1, 2, 9, 9, 16)).astype(np.float32)
    kern = pool_kernel(spec, CPU)
    lib, sites = _build(kern)
    assert sites == 0
    got = _call(lib, kern, x)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1), (0, 0)))
    ones = np.pad(np.ones((9, 9)), 1)
    ref = np.zeros(kern.out_shape)
    for i in range(spec.out_h):
        for j in range(spec.out_w):
            win = (slice(2 * i, 2 * i + 3), slice(2 * j, 2 * j + 3))
            ref[:, :, i, j] = xp[:, :, win[0], win[1]].sum((2, 3)) / ones[win].sum()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_tile_of_one_kib_still_uses_the_pool() -> None:
    """Must-not-fire: a 1792-byte tile (2 chunks x 14 columns x 16 lanes) is beyond TVM's stack limit
    and stays one workspace allocation site; 2 x 7 columns (896 bytes) is on the stack."""
    spec = Conv2dSpec(1, 32, 14, 14, 32, (1, 1), in_block=16, out_block=16)
    assert _build(conv2d_nchwc_kernel(spec, CPU, ConvTile(2, 1, 14)))[1] == 1
    assert _build(conv2d_nchwc_kernel(spec, CPU, ConvTile(2, 1, 7)))[1] == 0
    assert _build(conv2d_kernel(spec, CPU))[1] == 0  # the picked tile stays under the limit


def test_tile_pickers_respect_the_stack_limit() -> None:
    for target in (CPU, resolve_target("x86-avx2"), resolve_target("x86-avx512")):
        for spec in (
            Conv2dSpec(1, 16, 112, 112, 96, (1, 1), in_block=16, out_block=16),
            Conv2dSpec(1, 64, 56, 56, 64, (3, 3), pads=(1, 1, 1, 1), in_block=16, out_block=16),
        ):
            t = pick_conv_tile(spec, target)
            assert fits_stack(t.oc * t.oh * t.ow * spec.out_block)
    for rows in (1, 8, 64, 196, 197):
        mt = pick_matmul_tile(rows, 12, 32, 16)
        assert fits_stack(mt.ti * mt.tv * 16)
    assert pick_matmul_tile(197, 12, 32) == MatmulTile(9, 3)  # without a vector width: unconstrained


@pytest.mark.parametrize("target", ["x86-avx512", "x86-avx2"])
@pytest.mark.parametrize("depthwise", [False, True])
def test_int8_conv_tile_has_no_workspace_call(target: str, depthwise: bool) -> None:
    """VNNI (2 chunks x 7 columns x 16 int32 = 896 bytes, where 8 columns would be exactly 1 KiB),
    AVX2 (two int32 partial sums per channel) and the depthwise tile: no pads, so no padding stage and
    no workspace call; bit-exact against the int64 reference."""
    tgt = resolve_target(target)
    groups = 32 if depthwise else 1
    spec = QConv2dSpec(1, 32, 6, 56, 32, (1, 1) if not depthwise else (3, 3), groups=groups, y_scale=0.05)
    kind = dot_kind(spec, tgt)
    assert kind == ("depthwise" if depthwise else {"x86-avx512": "vnni", "x86-avx2": "avx2"}[target])
    if not depthwise:
        ow, oc = _tile(spec, kind)
        assert fits_stack(ow * oc * spec.out_block * (2 if kind == "avx2" else 1))
    kern = qconv2d_kernel(spec, tgt)
    assert '"local"' not in kern.func.script()
    lib = tvm.compile(tvm.IRModule({kern.name: kern.func}), tgt.tvm_target())
    assert len(_WORKSPACE.findall(str(lib.mod.inspect_source("ll")))) == 0
    if reason := why_not_runnable_here(tgt):  # the instruction set is missing, not a dependency
        pytest.skip(f"{target}: {reason} (built and inspected above)")
    x, w, b, xs, ws, r = case_inputs(spec, seed=3)
    got = run_packed(lib[kern.name], tvm.cpu(), spec, x, w, b, xs, ws, r)
    np.testing.assert_array_equal(got, reference(x, w, b, xs, ws, spec, r))


def test_int8_conv_tile_caps_below_one_kib() -> None:
    """Must-not-fire: a wide 1x1 conv whose register budget allows 8 VNNI columns x 2 chunks (exactly
    1 KiB) is capped at 7; a single-chunk conv keeps its full-width tile under the limit."""
    wide = QConv2dSpec(1, 32, 1, 56, 32, (1, 1))
    assert _tile(wide, "vnni") == (7, 2)
    one = QConv2dSpec(1, 32, 1, 56, 16, (1, 1))
    ow, oc = _tile(one, "vnni")
    assert oc == 1 and fits_stack(ow * 16) and ow > 7


@pytest.mark.parametrize("rows", [1, 197])
def test_weight_only_tile_has_no_workspace_call(rows: int) -> None:
    k, n, bs = 64, 96, 32
    rng = np.random.default_rng(rows)
    a = rng.uniform(-1, 1, (rows, k)).astype(np.float32)
    q = rng.integers(-8, 8, (k, n)).astype(np.int8)
    s = rng.uniform(0.01, 0.1, (k // bs, n)).astype(np.float32)
    z = rng.integers(-8, 8, (k // bs, n)).astype(np.int8)
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    arrays: list[np.ndarray] = [a, q, s, z, bias]
    x_t, q_t, s_t, z_t, b_t = (te.placeholder(v.shape, str(v.dtype), f"t{i}") for i, v in enumerate(arrays))
    y = weight_only_matmul_te(x_t, q_t, s_t, z_t, b_t, bs)
    func = schedule_weight_only(te.create_prim_func([x_t, q_t, s_t, z_t, b_t, y]), rows, n, CPU)
    assert func is not None and '"local"' not in func.script()
    lib = tvm.compile(tvm.IRModule({"wo": func.with_attr("global_symbol", "wo")}), CPU.tvm_target())
    assert len(_WORKSPACE.findall(str(lib.mod.inspect_source("ll")))) == 0
    out = tvm.runtime.tensor(np.zeros((rows, n), np.float32))
    lib["wo"](*[tvm.runtime.tensor(v) for v in arrays], out)
    wq = (q.astype(np.float64) - np.repeat(z, bs, 0)) * np.repeat(s, bs, 0)
    np.testing.assert_allclose(out.numpy(), a.astype(np.float64) @ wq + bias, rtol=1e-5, atol=1e-5)
