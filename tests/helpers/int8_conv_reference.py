"""The int8 conv (kiln::QConv) test tables and numpy reference shared by the x86 and ARM kernel tests.

``reference`` is the kiln::QConv semantics on NCHW/OIHW arrays: ``acc = sum (x - x_zero) * w + b``
accumulated in int64, then either the linear float64 requantize (``spec.linear_requant``:
``clip(rint(clip(acc * M[oc], lo, hi)) + y_zero)`` with ``M = x_scale * w_scale[oc] / y_scale`` and the
activation bounds divided by ``y_scale``, all float64 on float32 scales) or the float32 epilogue in the
kernels' operation order (``acc * m[oc] (+ (r - r_zero) * r_scale)``, activation,
``clip(rint(real / y_scale) + y_zero)``).
``run_packed`` packs one case's operands, calls a built kernel and unpacks its NCHW result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tvm

from backends.tvm.kernels.qconv_spec import (
    QUANT_RANGES,
    QConv2dSpec,
    pack_multiplier,
    pack_qbias,
    pack_qweight,
)
from compiler.ops.blocked_layout import pack, unpack

__all__ = ["P1", "CASES", "reference", "case_inputs", "run_packed"]


def _act(real: np.ndarray, spec: QConv2dSpec) -> np.ndarray:
    f = np.float32
    if spec.activation == "none":
        return real
    if spec.activation == "relu":
        return np.maximum(real, f(0))
    if spec.activation == "relu6":
        return np.minimum(np.maximum(real, f(0)), f(6))
    if spec.activation == "clip":
        return np.minimum(np.maximum(real, f(spec.alpha)), f(spec.beta))
    if spec.activation == "hard_swish":
        return real * np.maximum(f(0), np.minimum(f(1), real * f(1.0 / 6.0) + f(0.5)))
    if spec.activation == "hard_sigmoid":
        return np.maximum(f(0), np.minimum(f(1), real * f(spec.alpha) + f(spec.beta)))
    raise AssertionError(spec.activation)


def reference(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    x_scale: float,
    w_scale: np.ndarray,
    spec: QConv2dSpec,
    r: np.ndarray | None = None,
) -> np.ndarray:
    """The kiln::QConv semantics on NCHW/OIHW arrays: int64 accumulate, float32 epilogue."""
    n, c, h, wd = x.shape
    pt, pl, pb, pr = spec.pads
    xp = np.full((n, c, h + pt + pb, wd + pl + pr), spec.x_zero, np.int64)
    xp[:, :, pt : pt + h, pl : pl + wd] = x
    xp -= spec.x_zero
    oh, ow = spec.out_h, spec.out_w
    (sh, sw), (dh, dw) = spec.strides, spec.dilations
    acc = np.zeros((n, spec.out_channels, oh, ow), np.int64)
    for kh in range(spec.kernel[0]):
        for kw in range(spec.kernel[1]):
            patch = xp[
                :, :, kh * dh : kh * dh + sh * (oh - 1) + 1 : sh, kw * dw : kw * dw + sw * (ow - 1) + 1 : sw
            ]
            if spec.is_depthwise:
                acc += patch * w[None, :, 0, kh, kw, None, None].astype(np.int64)
            else:
                acc += np.einsum("nchw,oc->nohw", patch, w[:, :, kh, kw].astype(np.int64))
    if b is not None:
        acc += b.astype(np.int64)[None, :, None, None]
    assert np.abs(acc).max() < 2**31
    if spec.linear_requant:
        xs, ys = np.float64(np.float32(x_scale)), np.float64(np.float32(spec.y_scale))
        big_m = xs * np.asarray(w_scale, np.float32).astype(np.float64) / ys
        v = acc.astype(np.float64) * big_m[None, :, None, None]
        bounds = {
            "none": (-np.inf, np.inf),
            "relu": (0.0, np.inf),
            "relu6": (0.0, 6.0 / ys),
            "clip": (np.float64(np.float32(spec.alpha)) / ys, np.float64(np.float32(spec.beta)) / ys),
        }
        lo_v, hi_v = bounds[spec.activation]
        v = np.minimum(np.maximum(v, lo_v), hi_v)
        qlo, qhi = QUANT_RANGES[spec.out_dtype]
        return np.clip(np.rint(v).astype(np.int64) + spec.y_zero, qlo, qhi).astype(spec.out_dtype)
    m = (np.float64(x_scale) * np.asarray(w_scale, np.float64)).astype(np.float32)
    real = acc.astype(np.float32) * m[None, :, None, None]
    if r is not None:
        real = real + (r.astype(np.int32) - spec.r_zero).astype(np.float32) * np.float32(spec.r_scale)
    real = _act(real, spec)
    if spec.out_dtype == "float32":
        return real
    lo, hi = QUANT_RANGES[spec.out_dtype]
    q = np.rint(real / np.float32(spec.y_scale)).astype(np.int64) + spec.y_zero
    return np.clip(q, lo, hi).astype(spec.out_dtype)


def case_inputs(spec: QConv2dSpec, seed: int) -> tuple[Any, ...]:
    """Random (x, w, b, x_scale, w_scale, residual or None) for ``spec``, seeded."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (spec.batch, spec.in_channels, spec.in_h, spec.in_w)).astype(np.uint8)
    w_ic = 1 if spec.is_depthwise else spec.in_channels
    w = rng.integers(-128, 128, (spec.out_channels, w_ic, *spec.kernel)).astype(np.int8)
    b = rng.integers(-20000, 20000, spec.out_channels).astype(np.int32)
    w_scale = rng.uniform(0.0005, 0.004, spec.out_channels).astype(np.float32)
    r = None
    if spec.residual:
        lo, hi = QUANT_RANGES[spec.r_dtype]
        r = rng.integers(lo, hi + 1, (spec.batch, spec.out_channels, spec.out_h, spec.out_w)).astype(
            spec.r_dtype
        )
    return x, w, b, 0.0137, w_scale, r


P1 = (1, 1, 1, 1)
CASES = {
    "3x3_s1_p1_relu_xzero": QConv2dSpec(
        1, 32, 10, 11, 40, (3, 3), pads=P1, x_zero=100, y_scale=0.05, y_zero=7, activation="relu"
    ),
    "1x1_int8_out": QConv2dSpec(2, 64, 7, 9, 32, (1, 1), out_dtype="int8", x_zero=5, y_scale=1.3, y_zero=-5),
    "3x3_s2": QConv2dSpec(
        1, 32, 15, 15, 32, (3, 3), strides=(2, 2), pads=P1, x_zero=128, y_scale=1.1, y_zero=128
    ),
    "stem_c3": QConv2dSpec(
        1, 3, 20, 20, 16, (3, 3), strides=(2, 2), pads=P1, in_block=4, x_zero=114, y_scale=0.2, y_zero=3
    ),
    "dilated_asym_pad": QConv2dSpec(
        1, 16, 9, 9, 16, (3, 3), pads=(2, 0, 1, 2), dilations=(2, 2), x_zero=9, y_scale=0.7, y_zero=60
    ),
    "depthwise_3x3": QConv2dSpec(
        1, 32, 12, 12, 32, (3, 3), pads=P1, groups=32, x_zero=77, y_scale=0.05, y_zero=11
    ),
    "depthwise_3x3_s2_relu": QConv2dSpec(
        1,
        48,
        13,
        13,
        48,
        (3, 3),
        strides=(2, 2),
        pads=P1,
        groups=48,
        x_zero=3,
        y_scale=0.05,
        activation="relu",
    ),
    "float_out": QConv2dSpec(1, 32, 8, 8, 32, (3, 3), pads=P1, out_dtype="float32", x_zero=17),
    "float_out_hard_swish": QConv2dSpec(
        1, 32, 8, 8, 32, (3, 3), pads=P1, out_dtype="float32", x_zero=17, activation="hard_swish"
    ),
    "depthwise_5x5_hard_swish": QConv2dSpec(
        1,
        48,
        3,
        20,
        48,
        (5, 5),
        pads=(2, 2, 2, 2),
        groups=48,
        x_zero=5,
        y_scale=0.05,
        y_zero=7,
        activation="hard_swish",
    ),  # fmt: skip
    "ob12_hard_sigmoid": QConv2dSpec(
        1,
        40,
        4,
        6,
        20,
        (1, 1),
        in_block=12,
        out_block=12,
        x_zero=51,
        y_scale=0.004,
        y_zero=3,
        activation="hard_sigmoid",
        alpha=0.2,
        beta=0.5,
    ),  # fmt: skip
    "ob8": QConv2dSpec(
        1, 16, 8, 8, 24, (3, 3), pads=P1, in_block=8, out_block=8, x_zero=1, y_scale=0.1, y_zero=128
    ),
    "relu6_int8_out": QConv2dSpec(
        1, 32, 6, 7, 32, (1, 1), out_dtype="int8", x_zero=90, y_scale=0.03, y_zero=-100, activation="relu6"
    ),
    "ob8_clip": QConv2dSpec(
        1,
        16,
        8,
        8,
        24,
        (3, 3),
        pads=P1,
        in_block=8,
        out_block=8,
        x_zero=1,
        y_scale=0.1,
        y_zero=128,
        activation="clip",
        alpha=-3.5,
        beta=4.25,
    ),  # fmt: skip
}


def run_packed(
    fn: Callable[..., Any],
    dev: Any,
    spec: QConv2dSpec,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    x_scale: float,
    w_scale: np.ndarray,
    r: np.ndarray | None = None,
) -> np.ndarray:
    """Call kernel ``fn`` on ``dev`` with the packed operands; its output unpacked to NCHW."""
    # padded input channels hold garbage on purpose: their packed weights are 0
    args = [pack(x, spec.in_block, fill=201), pack_qweight(w, spec), pack_qbias(b, w, spec)]
    args.append(pack_multiplier(x_scale, w_scale, spec))
    if r is not None:
        args.append(pack(r, spec.out_block))
    t_args = [tvm.runtime.tensor(a, dev) for a in args]
    out = tvm.runtime.tensor(np.zeros(spec.out_shape, spec.out_dtype), dev)
    fn(*t_args, out)
    return unpack(out.numpy(), spec.out_channels)
