"""Kiln's int8 conv2d kernel (kiln::QConv) against an int64/float32 numpy reference.

Built for the host (``cpu``: AVX-512 VNNI, ``vpdpbusd``), for ``x86-avx2`` (``pmaddwd`` on widened
u8/s8, which this host also runs) and for a plain int32 fallback (the host target with no int8 dot
family). Every output is compared bit-exactly, integer and float32 alike: the integer part is exact
by construction, and the float32 epilogue performs the same IEEE operations in the same order as the
reference (the kernel fences the products that LLVM would otherwise contract into FMAs: the residual
term and hard_swish/hard_sigmoid's ``alpha*x + beta``); the linear requantize form (integer output,
activation none/relu/relu6/clip, no residual) is one float64 product ``acc * M`` rounded once. The NCHW
fallback of the kiln::QConv lowering (Relax ops, grouped convs) is checked against the registry reference. tanh/sigmoid (libm vs numpy exp) are not
covered here: they cannot be bit-exact.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import tvm

from backends.tvm.kernels.conv2d_int8 import dot_kind, qconv2d_kernel
from backends.tvm.kernels.qconv_spec import (
    QUANT_RANGES,
    QConv2dSpec,
    pack_multiplier,
    pack_qbias,
    pack_qweight,
)
from backends.tvm.target import TargetSpec, resolve_target, why_not_runnable_here
from tests.helpers.int8_conv_reference import CASES, P1, case_inputs, reference, run_packed


def _targets() -> dict[str, TargetSpec]:
    host = resolve_target("cpu")
    return {
        "vnni": resolve_target("x86-avx512"),  # built on any host; run only where the CPU has VNNI
        "avx2": resolve_target("x86-avx2"),
        "plain": replace(host, name="x86-plain", int8_dot="none"),
    }


TARGETS = _targets()


def _build(spec: QConv2dSpec, target: TargetSpec) -> tuple[Any, str]:
    k = qconv2d_kernel(spec, target)
    assert k.out_shape == spec.out_shape and k.out_dtype == spec.out_dtype
    lib = tvm.compile(tvm.IRModule({k.name: k.func}), target.tvm_target())
    return lib, k.name


def _run(spec: QConv2dSpec, target: TargetSpec, *inputs: Any) -> np.ndarray:
    """Build ``spec`` for ``target`` and run it on the host: ``inputs`` as :func:`run_packed` takes them."""
    if reason := why_not_runnable_here(target):  # the instruction set is missing, not a dependency
        pytest.skip(f"{target.name}: {reason} (its code is checked by the build-only tests)")
    lib, name = _build(spec, target)
    return run_packed(lib[name], tvm.cpu(), spec, *inputs)


@pytest.mark.parametrize("path", list(TARGETS))
@pytest.mark.parametrize("case", list(CASES))
def test_qconv_matches_reference_exactly(case: str, path: str) -> None:
    spec = CASES[case]
    target = TARGETS[path]
    if not spec.is_depthwise:
        assert dot_kind(spec, target) == path
    x, w, b, xs, ws, r = case_inputs(spec, seed=len(case))
    got = _run(spec, target, x, w, b, xs, ws, r)
    exp = reference(x, w, b, xs, ws, spec, r)
    assert got.dtype == exp.dtype and got.shape == exp.shape
    if spec.out_dtype != "float32":
        lo, hi = QUANT_RANGES[spec.out_dtype]
        assert (
            len(np.unique(exp)) > 20 and (exp > lo).mean() > 0.3 and (exp < hi).mean() > 0.3
        )  # not all clipped
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("path", list(TARGETS))
def test_full_range_no_saturation(path: str) -> None:
    """u8 activations at 0/255 against s8 weights at -128/-127/127: pmaddubsw would saturate here."""
    spec = QConv2dSpec(1, 64, 6, 6, 32, (3, 3), pads=P1, out_dtype="float32", x_zero=0)
    rng = np.random.default_rng(5)
    x = rng.choice(np.array([0, 255], np.uint8), (1, 64, 6, 6))
    x[:, :, :3] = 255  # long runs of the worst case
    w = rng.choice(np.array([-128, -127, 127], np.int8), (32, 64, 3, 3))
    w[:8] = -128
    ws = np.ones(32, np.float32)
    got = _run(spec, TARGETS[path], x, w, None, 1.0, ws)
    exp = reference(x, w, None, 1.0, ws, spec)
    assert np.abs(exp).max() > 2**22  # |acc| near 255*128*576
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("path", list(TARGETS))
@pytest.mark.parametrize("activation", ["relu", "hard_swish"])
@pytest.mark.parametrize("r_dtype", ["uint8", "int8"])
def test_residual_and_activation(path: str, activation: str, r_dtype: str) -> None:
    """Residual on its own grid + activation, bit-exact (the residual product is fenced against FMA)."""
    spec = QConv2dSpec(
        1, 32, 9, 9, 32, (3, 3), pads=P1, x_zero=40, y_scale=0.07, y_zero=20, activation=activation,
        residual=True, r_scale=0.031, r_zero=9 if r_dtype == "uint8" else -3, r_dtype=r_dtype,
    )  # fmt: skip
    x, w, b, xs, ws, r = case_inputs(spec, seed=11)
    got = _run(spec, TARGETS[path], x, w, b, xs, ws, r)
    exp = reference(x, w, b, xs, ws, spec, r)
    assert len(np.unique(exp)) > 50
    np.testing.assert_array_equal(got, exp)


def test_residual_float_out() -> None:
    spec = QConv2dSpec(
        1, 16, 6, 6, 16, (1, 1), out_dtype="float32", x_zero=8, residual=True, r_scale=0.05, r_zero=100
    )
    x, w, b, xs, ws, r = case_inputs(spec, seed=3)
    got = _run(spec, TARGETS["vnni"], x, w, b, xs, ws, r)
    exp = reference(x, w, b, xs, ws, spec, r)
    np.testing.assert_array_equal(got, exp)


def _asm(spec: QConv2dSpec, target: TargetSpec) -> str:
    lib, _ = _build(spec, target)
    return str(lib.mod.inspect_source("asm"))


def test_vnni_build_uses_vpdpbusd() -> None:
    spec = CASES["3x3_s1_p1_relu_xzero"]
    assert "vpdpbusd" in _asm(spec, TARGETS["vnni"])
    spec8 = CASES["ob8"]
    asm8 = _asm(spec8, TARGETS["vnni"])
    assert "vpdpbusd" in asm8 and "%ymm" in asm8


@pytest.mark.parametrize("case", ["depthwise_5x5_hard_swish", "ob12_hard_sigmoid"])
def test_fenced_epilogue_is_vectorized(case: str) -> None:
    """The fenced epilogue runs on whole vectors: no scalar convert/round/divide (the 5x slowdown before)."""
    asm = _asm(CASES[case], TARGETS["vnni"])
    for scalar in ("vroundss", "vcvtsi2ss", "vdivss", "vcvttss2si"):
        assert scalar not in asm, scalar
    assert "vfmadd" not in asm and "vfmsub" not in asm  # the fences still block FMA contraction


@pytest.mark.parametrize("case", ["3x3_s1_p1_relu_xzero", "depthwise_3x3", "ob8_clip"])
def test_linear_requant_epilogue_is_vectorized(case: str) -> None:
    """The float64 linear requantize runs on whole vectors (packed convert/multiply/round, no scalar ones)."""
    spec = CASES[case]
    assert spec.linear_requant
    asm = _asm(spec, TARGETS["vnni"])
    for scalar in ("vroundsd", "vcvtsi2sd", "vmulsd", "vcvttsd2si", "vroundss", "vdivss"):
        assert scalar not in asm, scalar
    assert "vmulpd" in asm and ("vrndscalepd" in asm or "vroundpd" in asm or "vcvtpd2dq" in asm)


def test_linear_requant_store_is_not_re_vectorized_across_pixels() -> None:
    """A 16-pixel output tile with 16 channels once made LLVM gather accumulators and extract
    bytes one by one; the epilogue must read and store whole blocks."""
    spec = QConv2dSpec(1, 16, 160, 160, 16, (1, 1), y_scale=0.025, y_zero=169)
    asm = _asm(spec, TARGETS["vnni"])
    assert "vpextrb" not in asm and "vpgatherqd" not in asm
    assert "vpmovdb" in asm or "vpmovusdb" in asm


def test_avx2_build_uses_exact_pmaddwd() -> None:
    asm = _asm(CASES["3x3_s1_p1_relu_xzero"], TARGETS["avx2"])
    assert "vpmaddwd" in asm and "vpmaddubsw" not in asm and "zmm" not in asm


def test_kernel_names_deterministic_and_distinct() -> None:
    a = qconv2d_kernel(CASES["3x3_s2"], TARGETS["vnni"]).name
    assert a == qconv2d_kernel(CASES["3x3_s2"], TARGETS["vnni"]).name
    assert a != qconv2d_kernel(replace(CASES["3x3_s2"], y_zero=1), TARGETS["vnni"]).name
    assert a != qconv2d_kernel(CASES["3x3_s2"], TARGETS["avx2"]).name


def test_packing_layout() -> None:
    spec = QConv2dSpec(1, 6, 4, 4, 5, (3, 3), in_block=4, out_block=4, x_zero=10)
    w = np.arange(5 * 6 * 9).reshape(5, 6, 3, 3).astype(np.int8)
    p = pack_qweight(w, spec)
    assert p.shape == (2, 2, 3, 3, 1, 4, 4)
    assert p[1, 1, 2, 0, 0, 0, 1] == w[4, 5, 2, 0] and p[1, 1, 0, 0, 0, 1, 0] == 0
    bias = pack_qbias(np.array([1, 2, 3, 4, 5], np.int32), w, spec)
    assert (
        bias.shape == (2, 4) and bias[1, 0] == 5 - 10 * int(w[4].astype(np.int64).sum()) and bias[1, 1] == 0
    )
    m = pack_multiplier(0.1, np.full(5, 0.3, np.float32), replace(spec, y_scale=0.7))
    assert spec.linear_requant and m.dtype == np.float64 and m[1, 1] == 0
    f64 = np.float64
    assert m[0, 0] == f64(np.float32(0.1)) * f64(np.float32(0.3)) / f64(np.float32(0.7))
    spec32 = replace(spec, out_dtype="float32")
    m32 = pack_multiplier(0.1, np.full(5, 0.3, np.float32), spec32)
    assert not spec32.linear_requant and m32.dtype == np.float32
    assert m32[0, 0] == np.float32(0.1 * np.float64(np.float32(0.3))) and m32[1, 1] == 0


def test_rejects_unsupported() -> None:
    with pytest.raises(ValueError):
        qconv2d_kernel(QConv2dSpec(1, 8, 4, 4, 8, (3, 3), groups=2), TARGETS["vnni"])
    with pytest.raises(ValueError):
        qconv2d_kernel(QConv2dSpec(1, 8, 4, 4, 8, (3, 3), in_block=6), TARGETS["vnni"])


@pytest.mark.parametrize(
    ("activation", "out_dtype"),
    [("none", "uint8"), ("relu6", "int8"), ("clip", "uint8"), ("hard_swish", "uint8")],
)
def test_nchw_fallback_matches_registry_reference(activation: str, out_dtype: str) -> None:
    """A grouped (not depthwise) kiln::QConv lowers to Relax ops; bit-exact against the op reference."""
    from tvm import relax

    from backends.tvm.build import compile_module
    from backends.tvm.lower import lower_graph
    from compiler.ir.graph import Graph
    from compiler.ir.types import TensorType
    from compiler.ops.qconv import QConvAttrs, linear_requant
    from compiler.ops.registry import get_op

    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (1, 8, 7, 6)).astype(np.uint8)
    w = rng.integers(-128, 128, (6, 4, 3, 3)).astype(np.int8)
    b = rng.integers(-3000, 3000, 6).astype(np.int32)
    attrs = QConvAttrs(
        group=2,
        pads=(1, 1, 1, 1),
        activation=activation,
        alpha=-1.5 if activation == "clip" else 0.0,
        beta=2.25 if activation == "clip" else 0.0,
        x_scale=0.0137,
        x_zero=90,
        w_scales=tuple(float(v) for v in rng.uniform(0.001, 0.004, 6).astype(np.float32)),
        y_scale=0.021,
        y_zero=-7 if out_dtype == "int8" else 100,
        out_dtype=out_dtype,
    )
    assert linear_requant(attrs) == (activation != "hard_swish")
    g = Graph("qconv")
    xv = g.add_input("x", TensorType.of(x))
    node = g.add_node(
        "QConv", [xv, g.add_constant(w, "w"), g.add_constant(b, "b")], attrs, domain="kiln", name="qconv"
    )
    g.set_outputs(g.outputs_of(node))
    target = resolve_target("cpu")
    vm = relax.VirtualMachine(compile_module(lower_graph(g, target).mod, target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    exp = get_op("QConv", "kiln").reference([x, w, b], attrs, 1)[0]
    assert got.dtype == exp.dtype and len(np.unique(exp)) > 20
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize(
    ("trans_b", "bias", "out_dtype"), [(1, True, "uint8"), (0, False, "int8"), (1, True, "float32")]
)
def test_qgemm_matches_registry_reference(trans_b: int, bias: bool, out_dtype: str) -> None:
    """kiln::QGemm lowers to an int32 Relax matmul plus the requantize epilogue: bit-exact
    against the op reference (float32 output: the same float32 product)."""
    from tvm import relax

    from backends.tvm.build import compile_module
    from backends.tvm.lower import lower_graph
    from compiler.ir.graph import Graph
    from compiler.ir.types import TensorType
    from compiler.ops.qgemm import QGemmAttrs
    from compiler.ops.registry import get_op

    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, (5, 24) if trans_b else (2, 5, 24)).astype(np.uint8)
    w = rng.integers(-128, 128, (10, 24) if trans_b else (24, 10)).astype(np.int8)
    b = rng.integers(-3000, 3000, 10).astype(np.int32)
    attrs = QGemmAttrs(
        trans_b=trans_b,
        x_scale=0.0137,
        x_zero=90,
        w_scales=tuple(float(v) for v in rng.uniform(0.001, 0.004, 10).astype(np.float32)),
        y_scale=0.05,
        y_zero=-7 if out_dtype == "int8" else 100,
        out_dtype=out_dtype,
    )
    g = Graph("qgemm")
    ins = [g.add_input("x", TensorType.of(x)), g.add_constant(w, "w")]
    if bias:
        ins.append(g.add_constant(b, "b"))
    node = g.add_node("QGemm", ins, attrs, domain="kiln", name="qgemm")
    g.set_outputs(g.outputs_of(node))
    target = resolve_target("cpu")
    vm = relax.VirtualMachine(compile_module(lower_graph(g, target).mod, target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    exp = get_op("QGemm", "kiln").reference([x, w, b if bias else None], attrs, 1)[0]
    assert got.dtype == exp.dtype and len(np.unique(exp)) > 20
    np.testing.assert_array_equal(got, exp)
