"""The int8 conv2d kernel spec (kiln::QConv) for blocked NCHW[b]c layouts, and its constant packing.

Math (integers exact; float64 or float32 epilogue, :mod:`compiler.ops.qconv`):

* ``acc[n,oc,oh,ow] = sum_{ic,kh,kw} (x_q - x_zero) * w_q + bias_q[oc]`` in int32, computed as
  ``sum x_q * w_q + (bias_q[oc] - x_zero * sum(w_q[oc]))`` (the second term is :func:`pack_qbias`);
* linear requantize (``spec.linear_requant``: uint8/int8 out, activation none/relu/relu6/clip, no
  residual): ``y_q = clamp(round_half_even(clip(float64(acc) * M[oc], lo, hi)) + y_zero, qmin, qmax)``
  with ``M[oc] = float64(x_scale) * float64(w_scale[oc]) / float64(y_scale)`` and the activation's bounds
  ``lo, hi`` divided by ``y_scale`` in float64 (:func:`compiler.ops.qconv.qconv_requant_bounds`). The
  kernels compute it as ``round_half_even(clip(v, L, H)) + y_zero`` with one clamp
  (:attr:`QConv2dSpec.requant_clamp`): rounding is monotone and fixes the integers ``a = qmin - y_zero``,
  ``b = qmax - y_zero``, so ``clamp(round(u), a, b) = round(clamp(u, a, b))``, and two clamps in a row
  are one, ``L = min(max(lo, a), b)``, ``H = min(max(hi, a), b)`` (``L = min(L, H)`` when ``lo > hi``);
* otherwise ``real = float32(acc) * m[oc]`` with ``m[oc] = float32(float64(x_scale) * float64(w_scale[oc]))``;
* with a residual: ``real = real + float32(r_q - r_zero) * float32(r_scale)``;
* ``real = act(real)`` (ONNX activation math, float32);
* integer outputs: ``y_q = clamp(round_half_even(real / y_scale) + y_zero, qmin, qmax)``;
  float32 output: ``real``.

Layouts (channels zero-padded up to whole blocks; ``in_block`` is a multiple of 4):

* data ``[N, ceil(IC/ib), IH, IW, ib]`` (``in_dtype``). Padded input channels may hold any value: their
  weights are 0. Spatial zero padding is done inside the kernel with ``x_zero`` (the real value 0);
* general weight ``[ceil(OC/ob), ceil(IC/ib), KH, KW, ib/4, ob, 4]`` int8 with
  ``Wp[o, i, kh, kw, g, bo, p] = W[o*ob + bo, i*ib + 4*g + p, kh, kw]``, so the ``4*ob`` bytes one dot step
  reads (one 4-channel group, one output block) are contiguous;
* depthwise weight ``[ceil(C/cb), KH, KW, cb]`` int8 with ``Wp[c, kh, kw, b] = W[c*cb + b, 0, kh, kw]``;
* bias (int32) and multiplier (float64 ``M`` for the linear form, else float32 ``m``) ``[ceil(OC/ob), ob]``;
* output and residual ``[N, ceil(OC/ob), OH, OW, ob]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.tvm.kernels.conv_geometry import ConvGeometry, check_weight_shape, depthwise_weight
from compiler.ops.qconv import linear_requant_form, qconv_requant_bounds, qconv_requant_multiplier

__all__ = [
    "linear_requant_expr",
    "QConv2dSpec",
    "QUANT_RANGES",
    "pack_qweight",
    "pack_qbias",
    "pack_multiplier",
]

QUANT_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


@dataclass(frozen=True)
class QConv2dSpec(ConvGeometry):
    """One int8 conv2d with a fused requantize epilogue (see the module docstring)."""

    in_block: int = 16
    out_block: int = 16
    in_dtype: str = "uint8"
    out_dtype: str = "uint8"  # uint8 | int8 | float32
    x_zero: int = 0
    y_scale: float = 1.0
    y_zero: int = 0
    activation: str = "none"
    alpha: float = 0.0
    beta: float = 0.0
    residual: bool = False
    r_scale: float = 1.0
    r_zero: int = 0
    r_dtype: str = "uint8"

    @property
    def linear_requant(self) -> bool:
        """Whether the epilogue is the linear float64 requantize (see the module docstring)."""
        return linear_requant_form(self.activation, self.residual, self.out_dtype)

    @property
    def mult_dtype(self) -> str:
        """The multiplier operand's dtype: float64 for the linear requantize, float32 otherwise."""
        return "float64" if self.linear_requant else "float32"

    @property
    def requant_bounds(self) -> tuple[float, float]:
        """The linear form's activation bounds on ``acc * M`` (float64 values, +-inf where unbounded)."""
        return qconv_requant_bounds(self.activation, self.alpha, self.beta, self.y_scale)

    @property
    def requant_clamp(self) -> tuple[float, float]:
        """``(L, H)``: the activation bounds and the output range as one clamp on ``v`` (module docstring)."""
        lo, hi = self.requant_bounds
        qmin, qmax = QUANT_RANGES[self.out_dtype]
        a, b = float(qmin - self.y_zero), float(qmax - self.y_zero)
        top = min(max(hi, a), b)
        return min(min(max(lo, a), b), top), top

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """The packed weight shape the kernel reads (see the module docstring)."""
        kh, kw = self.kernel
        if self.is_depthwise:
            return (self.out_chunks, kh, kw, self.out_block)
        return (self.out_chunks, self.in_chunks, kh, kw, self.in_block // 4, self.out_block, 4)

    @property
    def ops(self) -> int:
        """Integer multiply-adds times two over the real channels."""
        return self.flops

    def validate(self) -> None:
        """Raise ValueError for specs the int8 kernel does not build."""
        from backends.tvm.kernels.epilogue import ACTIVATIONS

        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}")
        if self.in_dtype != "uint8" or self.r_dtype not in QUANT_RANGES:
            raise ValueError(
                f"in_dtype must be uint8 and r_dtype uint8/int8 (got {self.in_dtype}, {self.r_dtype})"
            )
        if self.out_dtype not in ("uint8", "int8", "float32"):
            raise ValueError(f"out_dtype must be uint8, int8 or float32 (got {self.out_dtype})")
        if not 0 <= self.x_zero <= 255:
            raise ValueError(f"x_zero {self.x_zero} outside uint8")
        if min(self.batch, self.in_channels, self.out_channels, self.in_h, self.in_w) < 1:
            raise ValueError("empty conv")
        if min(*self.kernel, *self.strides, *self.dilations, self.out_block) < 1 or min(self.pads) < 0:
            raise ValueError("bad kernel/stride/dilation/pad/block")
        if self.in_block < 4 or self.in_block % 4:
            raise ValueError(f"in_block {self.in_block} must be a positive multiple of 4")
        if self.out_h < 1 or self.out_w < 1:
            raise ValueError("empty output")
        if self.groups != 1 and not (self.is_depthwise and self.in_block == self.out_block):
            raise ValueError(f"groups={self.groups}: only 1 or depthwise with in_block == out_block")


def pack_qweight(w_q: np.ndarray, spec: QConv2dSpec) -> np.ndarray:
    """ONNX OIHW int8 ``[OC, IC/groups, KH, KW]`` -> the packed, zero-padded layout the kernel reads."""
    kh, kw = spec.kernel
    w = np.asarray(w_q)
    if w.dtype != np.int8:
        raise ValueError(f"weights must be int8, got {w.dtype}")
    oc_pad = spec.out_chunks * spec.out_block
    if spec.is_depthwise:
        full = np.zeros((oc_pad, kh, kw), np.int8)
        full[: spec.out_channels] = depthwise_weight(w, spec)
        return np.ascontiguousarray(
            full.reshape(spec.out_chunks, spec.out_block, kh, kw).transpose(0, 2, 3, 1)
        )
    check_weight_shape(w, spec)
    ic_pad = spec.in_chunks * spec.in_block
    full = np.zeros((oc_pad, ic_pad, kh, kw), np.int8)
    full[: spec.out_channels, : spec.in_channels] = w
    g = spec.in_block // 4
    packed = full.reshape(spec.out_chunks, spec.out_block, spec.in_chunks, g, 4, kh, kw)
    # axes: o, bo, i, g, p, kh, kw -> o, i, kh, kw, g, bo, p
    return np.ascontiguousarray(packed.transpose(0, 2, 5, 6, 3, 1, 4))


def pack_qbias(bias_q: np.ndarray | None, w_q: np.ndarray, spec: QConv2dSpec) -> np.ndarray:
    """``bias_q[oc] - x_zero * sum(w_q[oc])`` as int32 ``[out_chunks, out_block]`` (zero padded)."""
    w = np.asarray(w_q).astype(np.int64)
    folded = -int(spec.x_zero) * w.reshape(w.shape[0], -1).sum(axis=1)
    if bias_q is not None:
        folded = folded + np.asarray(bias_q).astype(np.int64).reshape(-1)
    if folded.size != spec.out_channels:
        raise ValueError(f"bias/weight give {folded.size} channels, spec has {spec.out_channels}")
    info = np.iinfo(np.int32)
    if folded.min(initial=0) < info.min or folded.max(initial=0) > info.max:
        raise ValueError("folded int8 conv bias overflows int32")
    full = np.zeros(spec.out_chunks * spec.out_block, np.int32)
    full[: spec.out_channels] = folded
    return full.reshape(spec.out_chunks, spec.out_block)


def pack_multiplier(x_scale: float, w_scale: np.ndarray, spec: QConv2dSpec) -> np.ndarray:
    """The per-channel multiplier ``[out_chunks, out_block]`` (zero padded), ``spec.mult_dtype``.

    Linear requantize: float64 ``M[oc] = float64(x_scale) * float64(w_scale[oc]) / float64(spec.y_scale)``;
    otherwise float32 ``m[oc] = float32(float64(x_scale) * float64(w_scale[oc]))``. Scales are taken as
    float32 values (``x_scale`` as given in the float32 form); a scalar ``w_scale`` (per-tensor) is
    broadcast to every output channel.
    """
    ws = np.asarray(w_scale, dtype=np.float32).reshape(-1)
    if ws.size == 1:
        ws = np.full(spec.out_channels, ws[0], np.float32)
    if ws.size != spec.out_channels:
        raise ValueError(f"w_scale has {ws.size} entries, spec has {spec.out_channels} channels")
    full = np.zeros(spec.out_chunks * spec.out_block, spec.mult_dtype)
    if spec.linear_requant:
        full[: spec.out_channels] = qconv_requant_multiplier(x_scale, ws, spec.y_scale)
    else:
        full[: spec.out_channels] = (np.float64(x_scale) * ws.astype(np.float64)).astype(np.float32)
    return full.reshape(spec.out_chunks, spec.out_block)


def linear_requant_expr(v: Any, spec: QConv2dSpec, out_dtype: str) -> Any:
    """Linear form on float64 ``v = acc * M``: ``round_half_even(clip(v, L, H)) + y_zero`` (exact)."""
    from tvm import te, tirx

    def f64(x: float) -> Any:
        return tirx.const(float(x), "float64")

    lo, hi = spec.requant_clamp
    q = tirx.nearbyint(te.min(te.max(v, f64(lo)), f64(hi))) + f64(spec.y_zero)
    return tirx.Cast(out_dtype, q)
