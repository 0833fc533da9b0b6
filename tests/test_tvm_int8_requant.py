"""The int8 conv kernel's requantize epilogue and accumulator seeding (host: AVX-512 VNNI).

* ``QConv2dSpec.requant_clamp``: ``round(clip(v, lo, hi))`` clamped to the output range equals
  ``round(clip(v, L, H))`` with one clamp (rounding is monotone and fixes integers), checked against the
  registry's :func:`compiler.ops.qconv.linear_requantize` on ties, huge values and empty clip ranges;
* the AVX-512 epilogue rounds with one ``vcvtpd2dq {rn-sae}`` (no ``vrndscalepd``), bit-exact on exact
  ``x.5`` ties; a 12-channel block (no 8- or 4-lane convert) keeps ``nearbyint`` (must-not-fire);
* the VNNI accumulator starts at the bias (no ``memset`` per output tile), bit-exact;
* depthwise convs read the zero padding inline (no padded copy of the input).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from backends.tvm.kernels.conv2d_int8 import dot_kind, qconv2d_kernel
from backends.tvm.kernels.qconv_spec import QUANT_RANGES, QConv2dSpec
from backends.tvm.target import resolve_target, why_not_runnable_here
from compiler.ops.qconv import linear_requantize
from tests.helpers.int8_conv_reference import P1, case_inputs, reference, run_packed

HOST = resolve_target("x86-avx512")
"""The VNNI target: every kernel here builds on any host and runs where the CPU has AVX512-VNNI."""


def _runnable() -> None:
    if reason := why_not_runnable_here(HOST):  # the instruction set is missing, not a dependency
        pytest.skip(f"{HOST.name}: {reason} (its code is checked by the build-only tests)")


def _build(spec: QConv2dSpec) -> tuple[tvm.runtime.Module, str]:
    k = qconv2d_kernel(spec, HOST)
    return tvm.compile(tvm.IRModule({k.name: k.func}), HOST.tvm_target()), k.name


@pytest.mark.parametrize("out_dtype", ["uint8", "int8"])
@pytest.mark.parametrize(
    ("activation", "alpha", "beta"),
    [("none", 0.0, 0.0), ("relu", 0.0, 0.0), ("relu6", 0.0, 0.0), ("clip", -0.3, 0.45), ("clip", 0.5, 0.2)],
)
def test_requant_clamp_equals_registry_form(
    activation: str, alpha: float, beta: float, out_dtype: str
) -> None:
    rng = np.random.default_rng(0)
    acc = np.concatenate(
        [rng.integers(-40000, 40000, 20000), np.arange(-601, 602), [-(2**31), 2**31 - 1]]
    ).astype(np.int64)
    for y_zero in (QUANT_RANGES[out_dtype][0], 0, 7, QUANT_RANGES[out_dtype][1]):
        spec = QConv2dSpec(
            1, 4, 1, 1, 4, (1, 1), out_dtype=out_dtype, y_scale=0.02, y_zero=y_zero,
            activation=activation, alpha=alpha, beta=beta,
        )  # fmt: skip
        for m in (0.5, 0.25, 0.0123, 3.0):  # 0.5 / 0.25: exact ties on odd accumulators
            exp = linear_requantize(acc, np.array(m, np.float64), spec.requant_bounds, y_zero, out_dtype)
            lo, hi = spec.requant_clamp
            got = (np.rint(np.clip(acc.astype(np.float64) * m, lo, hi)) + y_zero).astype(out_dtype)
            np.testing.assert_array_equal(got, exp)


def test_epilogue_ties_round_half_even_exactly() -> None:
    """M = x_scale * w_scale / y_scale = 0.5: every odd accumulator is an exact tie."""
    spec = QConv2dSpec(1, 32, 7, 9, 32, (1, 1), x_zero=5, y_scale=1.0, y_zero=3, out_dtype="int8")
    assert dot_kind(spec, HOST) == "vnni" and spec.linear_requant
    x, w, b, _, _, _ = case_inputs(spec, seed=2)
    x = (x % 8).astype(np.uint8)  # small sums: most outputs inside the int8 range
    w = (w % 5 - 2).astype(np.int8)
    ws = np.full(32, 0.5, np.float32)
    _runnable()
    lib, name = _build(spec)
    got = run_packed(lib[name], tvm.cpu(), spec, x, w, b % 50, 1.0, ws)
    exp = reference(x, w, b % 50, 1.0, ws, spec)
    acc = np.einsum("nchw,oc->nohw", x.astype(np.int64) - 5, w[:, :, 0, 0].astype(np.int64))
    acc += (b % 50).reshape(1, -1, 1, 1)
    inside = (exp > -128) & (exp < 127)
    assert inside.mean() > 0.5 and (acc[inside] % 2 == 1).mean() > 0.3  # many exact ties in range
    np.testing.assert_array_equal(got, exp)


def test_wide_epilogue_uses_rounding_convert_and_no_memset() -> None:
    spec = QConv2dSpec(1, 64, 8, 16, 64, (1, 1), x_zero=3, y_scale=0.05, y_zero=10)
    asm = str(_build(spec)[0].mod.inspect_source("asm"))
    assert "vcvtpd2dq\t{rn-sae}" in asm
    assert "vrndscalepd" not in asm and "vroundpd" not in asm
    assert "memset" not in asm  # the accumulator is seeded with the bias, not zeroed per tile


def test_twelve_lane_block_keeps_nearbyint() -> None:
    """Must not fire: a 12-channel half has no 8/4-lane rounding convert; nearbyint stays, still exact."""
    spec = QConv2dSpec(1, 24, 5, 6, 24, (3, 3), pads=P1, in_block=12, out_block=12, y_scale=0.04, y_zero=2)
    lib, name = _build(spec)
    asm = str(lib.mod.inspect_source("asm"))
    assert "vrndscalepd" in asm or "vroundpd" in asm
    assert "{rn-sae}" not in asm
    _runnable()
    x, w, b, xs, ws, _ = case_inputs(spec, seed=4)
    np.testing.assert_array_equal(
        run_packed(lib[name], tvm.cpu(), spec, x, w, b, xs, ws), reference(x, w, b, xs, ws, spec)
    )


def test_depthwise_padding_is_inlined() -> None:
    spec = QConv2dSpec(
        1, 32, 9, 9, 32, (3, 3), pads=P1, groups=32, x_zero=17, y_scale=0.03, y_zero=4, activation="relu6"
    )
    k = qconv2d_kernel(spec, HOST)
    text = k.func.script()
    assert 'sblock("pad")' not in text and 'sblock("conv' in text
    lib = tvm.compile(tvm.IRModule({k.name: k.func}), HOST.tvm_target())
    _runnable()
    x, w, b, xs, ws, _ = case_inputs(spec, seed=6)
    exp = reference(x, w, b, xs, ws, spec)
    assert np.unique(exp).size > 20
    np.testing.assert_array_equal(run_packed(lib[k.name], tvm.cpu(), spec, x, w, b, xs, ws), exp)
