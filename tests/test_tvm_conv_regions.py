"""Convs split into padding-free output regions (backends/tvm/kernels/conv_regions.py).

The band math is checked against brute-force enumeration, the split kernel against onnxruntime
running the same Conv (fp32, 1e-4), its structure (one conv block a live region, no pad stage),
and the rule that picks it: it fires on a dilated conv whose taps mostly read padding and not on
ordinary padded convs.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from backends.tvm.kernels.conv2d_nchwc import conv2d_nchwc_kernel
from backends.tvm.kernels.conv_regions import (
    AxisBand,
    axis_bands,
    conv_regions,
    live_share,
    splits_regions,
)
from backends.tvm.kernels.conv_spec import Conv2dSpec, conv2d_kernel, pack_bias, pack_data, pack_weight
from backends.tvm.target import resolve_target
from compiler.ops.blocked_layout import unpack
from tests.helpers.numerics import assert_close
from tests.helpers.single_op import run_ort

HOST = resolve_target("cpu")
B = HOST.lanes
TOL = 1e-4


def _aspp(rate: int, hw: int = 20, ic: int = 24, oc: int = 32) -> Conv2dSpec:
    """A 3x3 conv with dilation and padding ``rate`` (DeepLab's ASPP branch)."""
    pads = (rate, rate, rate, rate)
    return Conv2dSpec(1, ic, hw, hw, oc, (3, 3), pads=pads, dilations=(rate, rate), in_block=B, out_block=B)


def _brute_live(size: int, k: int, s: int, d: int, pb: int, out: int) -> list[tuple[int, int]]:
    """(output, tap) pairs whose read lands in the input."""
    return [(o, t) for o in range(out) for t in range(k) if 0 <= o * s + t * d - pb < size]


def test_aspp_rate12_bands() -> None:
    # 20x20 map, dilation 12: the first 8 rows miss tap 0, the last 8 tap 2, rows 8-11 read only tap 1
    assert axis_bands(20, 3, 1, 12, 12, 20) == [
        AxisBand(0, 8, 1, 3),
        AxisBand(8, 12, 1, 2),
        AxisBand(12, 20, 0, 2),
    ]
    spec = _aspp(12)
    assert len(conv_regions(spec)) == 9
    assert live_share(spec) == pytest.approx((8 * 2 + 4 + 8 * 2) ** 2 / (20 * 3) ** 2)


@pytest.mark.parametrize(
    ("size", "k", "s", "d", "pb", "pe"),
    [(20, 3, 1, 12, 12, 12), (7, 3, 1, 1, 1, 1), (15, 3, 2, 1, 1, 1), (6, 1, 1, 1, 2, 3), (9, 5, 2, 3, 5, 2)],
)
def test_bands_match_brute_force(size: int, k: int, s: int, d: int, pb: int, pe: int) -> None:
    out = (size + pb + pe - d * (k - 1) - 1) // s + 1
    bands = axis_bands(size, k, s, d, pb, out)
    assert bands[0].o0 == 0 and bands[-1].o1 == out
    assert all(a.o1 == b.o0 for a, b in itertools.pairwise(bands))
    got = [(o, t) for b in bands for o in range(b.o0, b.o1) for t in range(b.t0, b.t1)]
    assert sorted(got) == _brute_live(size, k, s, d, pb, out)


def test_split_fires_on_mostly_padded_dilated_convs() -> None:
    assert splits_regions(_aspp(12))
    assert splits_regions(_aspp(6, hw=33))
    # every tap but the centre is dead for every output (what trim_dead_taps leaves as a 1x1)
    assert splits_regions(_aspp(8, hw=6))


def test_split_does_not_fire_on_ordinary_convs() -> None:
    plain = [
        Conv2dSpec(1, 64, 7, 7, 64, (3, 3), pads=(1, 1, 1, 1), in_block=B, out_block=B),  # 18% dead
        Conv2dSpec(1, 64, 5, 5, 64, (3, 3), pads=(1, 1, 1, 1), in_block=B, out_block=B),  # 25% dead
        Conv2dSpec(1, 64, 56, 56, 64, (3, 3), pads=(1, 1, 1, 1), in_block=B, out_block=B),
        Conv2dSpec(1, 64, 14, 14, 64, (3, 3), pads=(2,) * 4, dilations=(2, 2), in_block=B, out_block=B),
        Conv2dSpec(1, 64, 30, 30, 64, (3, 3), dilations=(12, 12), in_block=B, out_block=B),  # no pads
    ]
    for spec in plain:
        assert not splits_regions(spec), spec
        names = _block_names(conv2d_kernel(spec, HOST).func)
        assert "conv_update" in names and "assemble" not in names


def _block_names(func: Any) -> set[str]:
    """The names of the PrimFunc's blocks (from its TVMScript)."""
    return set(re.findall(r'T\.sblock\("([^"]+)"\)', func.script()))


def test_split_kernel_structure() -> None:
    spec = _aspp(12)
    names = _block_names(conv2d_kernel(spec, HOST).func)
    assert {f"conv{k}_update" for k in range(9)} <= names and "assemble" in names
    assert "pad" not in names and "conv_update" not in names  # no padded copy of the input


def _run_vs_ort(spec: Conv2dSpec, regions: bool | None = None, seed: int = 0) -> None:
    import tvm

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((spec.batch, spec.in_channels, spec.in_h, spec.in_w)).astype(np.float32)
    w = (rng.standard_normal((spec.out_channels, spec.in_channels, *spec.kernel)) * 0.2).astype(np.float32)
    b = rng.standard_normal(spec.out_channels).astype(np.float32)
    res = None
    if spec.residual:
        res = rng.standard_normal((spec.batch, spec.out_channels, spec.out_h, spec.out_w)).astype(np.float32)
    kernel = conv2d_nchwc_kernel(spec, HOST, regions=regions)
    ex = tvm.compile(tvm.IRModule({kernel.name: kernel.func}), HOST.tvm_target())
    args = [pack_data(x, spec.in_block), pack_weight(w, spec), pack_bias(b, spec)]
    if res is not None:
        args.append(pack_data(res, spec.out_block))
    out = tvm.runtime.tensor(np.full(spec.out_shape, np.nan, np.float32))
    ex[kernel.name](*[tvm.runtime.tensor(a) for a in args], out)
    raw = out.numpy()
    assert np.isfinite(raw).all(), "padded output channels must be finite"
    got = unpack(raw, spec.out_channels)
    attrs = {
        "kernel_shape": list(spec.kernel),
        "pads": list(spec.pads),
        "strides": list(spec.strides),
        "dilations": list(spec.dilations),
    }
    ref = run_ort("Conv", [x, w, b], attrs)[0]
    if res is not None:
        ref = ref + res
    if spec.activation == "relu":
        ref = np.maximum(ref, 0)
    elif spec.activation == "hard_swish":
        ref = ref * np.clip(ref / 6 + 0.5, 0, 1)
    assert_close(got, ref, rtol=TOL, atol=TOL, what=f"{spec}")


@pytest.mark.parametrize(
    "spec",
    [
        _aspp(12),  # partly dead taps in every border region
        _aspp(8, hw=6),  # rows and columns whose taps all but one fall into padding
        _aspp(8, hw=12, ic=20, oc=24),  # channels not a multiple of the block
        replace(_aspp(12), activation="hard_swish", residual=True),
        replace(_aspp(8, hw=24), strides=(2, 2)),
        Conv2dSpec(1, 16, 6, 6, 16, (1, 1), pads=(2, 1, 3, 2), in_block=B, out_block=B, activation="relu"),
    ],
    ids=["aspp12", "dead_outer_taps", "nonmultiple", "residual_hswish", "stride2", "pad_only_border_1x1"],
)
def test_split_conv_matches_onnxruntime(spec: Conv2dSpec) -> None:
    assert splits_regions(spec)
    _run_vs_ort(spec)


def test_forced_split_matches_onnxruntime_on_small_borders() -> None:
    # one-wide border bands, asymmetric pads, rectangular dilated kernel: exact either way
    spec = Conv2dSpec(1, 16, 9, 11, 16, (3, 2), pads=(1, 0, 2, 3), dilations=(2, 3), in_block=B, out_block=B)
    _run_vs_ort(spec, regions=True)
    _run_vs_ort(spec, regions=False)
