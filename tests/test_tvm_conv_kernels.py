"""Kiln's NCHW[b]c fp32 conv2d / depthwise kernels, built for the host and checked against numpy.

The reference is the Conv op's numpy reference (NCHW), followed by the ONNX activation math;
kernel inputs are packed with the kernel module's own helpers and the output unpacked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from backends.tvm.kernels.conv2d_nchwc import pick_conv_tile
from backends.tvm.kernels.conv_spec import (
    Conv2dSpec,
    conv2d_kernel,
    pack_bias,
    pack_data,
    pack_weight,
    supports,
)
from backends.tvm.kernels.depthwise_nchwc import pick_depthwise_tile
from backends.tvm.target import TargetSpec, resolve_target
from compiler.ops.blocked_layout import unpack
from compiler.ops.conv import ConvAttrs
from compiler.ops.registry import get_op

RTOL = 1e-4
ATOL = 1e-4
HOST = resolve_target("cpu")
AVX2 = resolve_target("x86-avx2")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _act(x: np.ndarray, spec: Conv2dSpec) -> np.ndarray:
    a, b = spec.alpha, spec.beta
    table: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "none": lambda v: v,
        "relu": lambda v: np.maximum(v, 0),
        "relu6": lambda v: np.minimum(np.maximum(v, 0), 6),
        "clip": lambda v: np.minimum(np.maximum(v, a), b),
        "leaky_relu": lambda v: np.where(v >= 0, v, a * v),
        "sigmoid": _sigmoid,
        "hard_sigmoid": lambda v: np.clip(a * v + b, 0, 1),
        "hard_swish": lambda v: v * np.maximum(0, np.minimum(1, v / 6 + 0.5)),
        "tanh": np.tanh,
    }
    return table[spec.activation](x).astype(np.float32)


def _reference(
    spec: Conv2dSpec, x: np.ndarray, w: np.ndarray, b: np.ndarray, res: np.ndarray | None
) -> np.ndarray:
    attrs = ConvAttrs(
        group=spec.groups,
        kernel_shape=spec.kernel,
        pads=spec.pads,  # ONNX order: top, left, bottom, right
        strides=spec.strides,
        dilations=spec.dilations,
    )
    y = get_op("Conv").reference([x, w, b], attrs, 1)[0]
    if res is not None:
        y = y + res
    return _act(y, spec)


def _run(spec: Conv2dSpec, target: TargetSpec = HOST, seed: int = 0) -> tuple[np.ndarray, np.ndarray, Any]:
    """Build and run ``spec``; returns (kernel output unpacked, reference, raw blocked output)."""
    import tvm

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((spec.batch, spec.in_channels, spec.in_h, spec.in_w)).astype(np.float32)
    w = (
        rng.standard_normal((spec.out_channels, spec.in_channels // spec.groups, *spec.kernel)) * 0.3
    ).astype(np.float32)
    b = rng.standard_normal(spec.out_channels).astype(np.float32)
    res = None
    if spec.residual:
        res = rng.standard_normal((spec.batch, spec.out_channels, spec.out_h, spec.out_w)).astype(np.float32)
    kernel = conv2d_kernel(spec, target)
    assert kernel.out_shape == spec.out_shape and kernel.out_dtype == "float32"
    ex = tvm.compile(tvm.IRModule({kernel.name: kernel.func}), target.tvm_target())
    dev = tvm.cpu()
    args = [pack_data(x, spec.in_block), pack_weight(w, spec), pack_bias(b, spec)]
    if res is not None:
        args.append(pack_data(res, spec.out_block))
    out = tvm.runtime.tensor(np.full(spec.out_shape, np.nan, np.float32), dev)
    ex[kernel.name](*[tvm.runtime.tensor(a, dev) for a in args], out)
    raw = out.numpy()
    return unpack(raw, spec.out_channels), _reference(spec, x, w, b, res), raw


def _check(spec: Conv2dSpec, target: TargetSpec = HOST) -> None:
    got, ref, raw = _run(spec, target)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)
    assert np.isfinite(raw).all(), "padded output channels must be finite"


B = HOST.lanes  # the host's natural channel block (16 with AVX-512, 8 with AVX2)

CONV_CASES = {
    "3x3_s1_p1": Conv2dSpec(1, 32, 14, 14, 32, (3, 3), pads=(1, 1, 1, 1), in_block=B, out_block=B),
    "1x1": Conv2dSpec(1, 32, 9, 11, 48, (1, 1), in_block=B, out_block=B),
    "3x3_s2": Conv2dSpec(
        1, 16, 15, 16, 32, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), in_block=B, out_block=B
    ),
    "7x7_s2_stem": Conv2dSpec(
        1, 3, 32, 30, 24, (7, 7), strides=(2, 2), pads=(3, 3, 3, 3), in_block=3, out_block=16
    ),
    "asym_pads": Conv2dSpec(1, 16, 10, 9, 16, (3, 3), pads=(0, 1, 2, 1), in_block=B, out_block=B),
    "dilation2": Conv2dSpec(
        1, 16, 12, 12, 16, (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2), in_block=B, out_block=B
    ),
    "nonmultiple_channels": Conv2dSpec(
        1, 20, 9, 10, 24, (3, 3), pads=(1, 1, 1, 1), in_block=16, out_block=16
    ),
    "mixed_blocks": Conv2dSpec(1, 24, 8, 8, 40, (3, 1), pads=(1, 0, 1, 0), in_block=8, out_block=16),
    "rect_kernel_strides": Conv2dSpec(
        1, 8, 13, 17, 8, (1, 5), strides=(1, 3), pads=(0, 2, 0, 1), in_block=8, out_block=8
    ),
    "batch2_relu": Conv2dSpec(
        2, 16, 7, 7, 32, (3, 3), pads=(1, 1, 1, 1), in_block=B, out_block=B, activation="relu"
    ),
}

DW_CASES = {
    "dw3x3_s1": Conv2dSpec(1, 32, 14, 13, 32, (3, 3), pads=(1, 1, 1, 1), groups=32, in_block=B, out_block=B),
    "dw3x3_s2": Conv2dSpec(
        1, 24, 15, 16, 24, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), groups=24, in_block=16, out_block=16
    ),
    "dw5x5": Conv2dSpec(1, 16, 12, 12, 16, (5, 5), pads=(2, 2, 2, 2), groups=16, in_block=B, out_block=B),
    "dw3x3_nopad_dil2_batch2": Conv2dSpec(
        2, 8, 11, 11, 8, (3, 3), dilations=(2, 2), groups=8, in_block=8, out_block=8
    ),
}

ACT_PARAMS = {
    "none": (0.0, 0.0),
    "relu": (0.0, 0.0),
    "relu6": (0.0, 0.0),
    "clip": (-0.5, 1.5),
    "leaky_relu": (0.1, 0.0),
    "sigmoid": (0.0, 0.0),
    "hard_sigmoid": (0.2, 0.5),
    "hard_swish": (0.0, 0.0),
    "tanh": (0.0, 0.0),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv2d_nchwc(case: str) -> None:
    _check(CONV_CASES[case])


@pytest.mark.parametrize("case", sorted(DW_CASES))
def test_depthwise_nchwc(case: str) -> None:
    _check(DW_CASES[case])


@pytest.mark.parametrize("activation", sorted(ACT_PARAMS))
def test_residual_and_activation(activation: str) -> None:
    alpha, beta = ACT_PARAMS[activation]
    base = Conv2dSpec(1, 12, 6, 7, 20, (3, 3), pads=(1, 1, 1, 1), in_block=8, out_block=8)
    _check(replace(base, activation=activation, alpha=alpha, beta=beta, residual=True))


@pytest.mark.parametrize("activation", ["relu6", "hard_swish", "sigmoid"])
def test_depthwise_residual_and_activation(activation: str) -> None:
    base = Conv2dSpec(1, 20, 7, 6, 20, (3, 3), pads=(1, 1, 1, 1), groups=20, in_block=8, out_block=8)
    _check(replace(base, activation=activation, residual=True))


@pytest.mark.parametrize("case", ["3x3_s1_p1", "7x7_s2_stem", "nonmultiple_channels"])
def test_avx2_target_block8(case: str) -> None:
    """The 16-register AVX2 tiles (this host runs AVX2 code too)."""
    spec = CONV_CASES[case]
    if spec.in_block == B:
        spec = replace(spec, in_block=8, out_block=8)
    _check(spec, AVX2)
    _check(replace(DW_CASES["dw3x3_s2"], in_block=8, out_block=8), AVX2)


def test_padded_channels_are_activation_of_zero() -> None:
    spec = Conv2dSpec(
        1,
        5,
        6,
        6,
        5,
        (3, 3),
        pads=(1, 1, 1, 1),
        in_block=8,
        out_block=8,
        activation="hard_sigmoid",
        alpha=0.2,
        beta=0.5,
    )
    _, _, raw = _run(spec)
    np.testing.assert_array_equal(raw[:, :, :, :, 5:], np.full_like(raw[:, :, :, :, 5:], 0.5))


def test_kernel_names_and_attrs() -> None:
    a = CONV_CASES["3x3_s1_p1"]
    k1, k2 = conv2d_kernel(a, HOST), conv2d_kernel(a, HOST)
    assert k1.name == k2.name and k1.name.startswith("kiln_conv2d_nchwc_")
    assert conv2d_kernel(replace(a, activation="relu"), HOST).name != k1.name
    assert str(k1.func.attrs["kiln.scheduled"]) == "conv2d_nchwc"
    assert str(k1.func.attrs["global_symbol"]) == k1.name
    dw = conv2d_kernel(DW_CASES["dw5x5"], HOST)
    assert dw.name.startswith("kiln_dwconv2d_nchwc_")
    assert str(dw.func.attrs["kiln.scheduled"]) == "depthwise_nchwc"
    params = [p.name for p in conv2d_kernel(replace(a, residual=True), HOST).func.params]
    assert len(params) == 5


GROUPED_CASES = {
    # ResNeXt 32x4d: 4 groups a 16-wide chunk, one input chunk per output chunk
    "resnext_w4": Conv2dSpec(
        1, 64, 9, 9, 64, (3, 3), pads=(1, 1, 1, 1), groups=16, in_block=16, out_block=16
    ),
    # RegNet group width 8, 24 channels (padded chunk: its second group does not exist)
    "regnet_w8_pad": Conv2dSpec(
        1, 24, 7, 8, 24, (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), groups=3, in_block=16, out_block=16
    ),
    # a group spans two chunks
    "wide_groups": Conv2dSpec(
        1, 64, 6, 6, 64, (3, 3), pads=(1, 1, 1, 1), groups=2, in_block=16, out_block=16, activation="relu"
    ),
    "mixed_blocks": Conv2dSpec(1, 32, 6, 6, 64, (1, 1), groups=4, in_block=8, out_block=16, residual=True),
}


@pytest.mark.parametrize("name", list(GROUPED_CASES))
def test_grouped_conv(name: str) -> None:
    spec = GROUPED_CASES[name]
    assert supports(spec)
    _check(spec)
    k = conv2d_kernel(spec, HOST)
    assert k.name.startswith("kiln_gconv2d_nchwc_") and str(k.func.attrs["kiln.op_class"]) == "grouped_conv"


def test_grouped_conv_that_does_not_fit_is_rejected() -> None:
    # groups of 24 channels in 16-channel chunks: a chunk would hold one and a half groups
    spec = Conv2dSpec(1, 48, 8, 8, 48, (3, 3), groups=2, in_block=16, out_block=16)
    assert not supports(spec)
    with pytest.raises(NotImplementedError):
        conv2d_kernel(spec, HOST)
    assert not supports(replace(CONV_CASES["1x1"], activation="gelu"))
    assert supports(DW_CASES["dw5x5"])


@pytest.mark.parametrize("target", [HOST, AVX2], ids=lambda t: t.name)
def test_tiles_fit_registers(target: TargetSpec) -> None:
    regs = 32 if target.lanes >= 16 else 16
    for spec in list(CONV_CASES.values()) + [
        Conv2dSpec(
            1, 128, 28, 28, 128, (3, 3), pads=(1, 1, 1, 1), in_block=target.lanes, out_block=target.lanes
        ),
        Conv2dSpec(
            1, 512, 7, 7, 512, (3, 3), pads=(1, 1, 1, 1), in_block=target.lanes, out_block=target.lanes
        ),
    ]:
        t = pick_conv_tile(spec, target)
        vpb = -(-spec.out_block // target.lanes)
        acc = t.oc * t.oh * t.ow * vpb
        assert acc + t.oc * vpb + 1 <= regs
        assert t.oc <= spec.out_chunks and t.ow <= spec.out_w and t.oh <= spec.out_h
    big = Conv2dSpec(
        1, 128, 56, 56, 128, (3, 3), pads=(1, 1, 1, 1), in_block=target.lanes, out_block=target.lanes
    )
    tile = pick_conv_tile(big, target)
    acc = tile.oc * tile.oh * tile.ow
    # AVX-512: the accumulators stay under TVM's 1 KiB stack limit (a bigger tile is a workspace buffer)
    assert (8 <= acc <= 13) if regs == 16 else (acc >= 12 and acc * big.out_block * 4 < 1024)
    assert pick_depthwise_tile(replace(big, groups=128), target) >= 4
