"""The fp32 conv2d kernel spec for blocked NCHW[b]c layouts, weight/bias packing, and dispatch.

Layouts (channel counts zero-padded up to whole blocks):

* data ``[N, ceil(IC/ib), IH, IW, ib]``; output and residual ``[N, ceil(OC/ob), OH, OW, ob]``;
* general conv weight ``[ceil(OC/ob), ceil(IC/ib), KH, KW, ib, ob]`` with
  ``Wp[o, i, kh, kw, bi, bo] = W[o*ob + bo, i*ib + bi, kh, kw]`` (zero outside);
* grouped conv weight ``[ceil(OC/ob), group_chunks, KH, KW, ib, ob]`` with ``Wp[o, r, kh, kw, bi, bo]``
  the weight from input channel ``(group_chunk_start(o) + r)*ib + bi`` to output ``o*ob + bo`` (zero
  where they are in different groups or outside; see :mod:`backends.tvm.kernels.conv_geometry`);
* depthwise weight ``[ceil(C/cb), KH, KW, cb]`` with ``Wp[c, kh, kw, b] = W[c*cb + b, 0, kh, kw]``;
* bias ``[ceil(OC/ob), ob]`` with ``Bp[o, b] = B[o*ob + b]`` (zero outside).

``OH = (IH + pad_top + pad_bottom - dh*(KH-1) - 1) // sh + 1`` and likewise for ``OW``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from backends.tvm.kernels.conv_geometry import (
    ConvGeometry,
    check_weight_shape,
    depthwise_weight,
    grouped_fits,
)
from backends.tvm.kernels.epilogue import ACTIVATIONS
from compiler.ops.blocked_layout import pack

if TYPE_CHECKING:
    from backends.tvm.kernels.kernel import Kernel
    from backends.tvm.target import TargetSpec

__all__ = [
    "Conv2dSpec",
    "conv2d_kernel",
    "pack_weight",
    "pack_bias",
    "pack_data",
    "supports",
]


@dataclass(frozen=True)
class Conv2dSpec(ConvGeometry):
    """One fp32 conv2d (+ bias, optional residual add, activation) in NCHW[b]c layout."""

    activation: str = "none"
    alpha: float = 0.0
    beta: float = 0.0
    residual: bool = False

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """The packed weight shape the kernel reads (see the module docstring)."""
        kh, kw = self.kernel
        if self.is_depthwise:
            return (self.out_chunks, kh, kw, self.out_block)
        return (self.out_chunks, self.group_chunks, kh, kw, self.in_block, self.out_block)


def supports(spec: Conv2dSpec) -> bool:
    """True when :func:`conv2d_kernel` builds this spec (groups == 1, depthwise, or grouped with whole
    input chunks per output chunk; valid shapes)."""
    if spec.activation not in ACTIVATIONS:
        return False
    if min(spec.batch, spec.in_channels, spec.out_channels, spec.in_h, spec.in_w) < 1:
        return False
    if min(*spec.kernel, *spec.strides, *spec.dilations, spec.in_block, spec.out_block) < 1:
        return False
    if min(spec.pads) < 0 or spec.out_h < 1 or spec.out_w < 1:
        return False
    if spec.groups == 1:
        return True
    if spec.is_grouped:
        return grouped_fits(spec)
    return spec.is_depthwise and spec.in_block == spec.out_block


def pack_weight(w: np.ndarray, spec: Conv2dSpec) -> np.ndarray:
    """ONNX OIHW ``[OC, IC/groups, KH, KW]`` float32 -> the packed, zero-padded layout the kernel reads."""
    kh, kw = spec.kernel
    w = np.asarray(w, dtype=np.float32)
    oc_pad = spec.out_chunks * spec.out_block
    if spec.is_depthwise:
        full = np.zeros((oc_pad, kh, kw), np.float32)
        full[: spec.out_channels] = depthwise_weight(w, spec)
        packed = full.reshape(spec.out_chunks, spec.out_block, kh, kw).transpose(0, 2, 3, 1)
        return np.ascontiguousarray(packed)
    if spec.is_grouped:
        return _pack_grouped(w, spec)
    check_weight_shape(w, spec)
    ic_pad = spec.in_chunks * spec.in_block
    full = np.zeros((oc_pad, ic_pad, kh, kw), np.float32)
    full[: spec.out_channels, : spec.in_channels] = w
    packed = full.reshape(spec.out_chunks, spec.out_block, spec.in_chunks, spec.in_block, kh, kw)
    return np.ascontiguousarray(packed.transpose(0, 2, 4, 5, 3, 1))


def _pack_grouped(w: np.ndarray, spec: Conv2dSpec) -> np.ndarray:
    """Grouped OIHW ``[OC, IC/groups, KH, KW]`` -> ``[OCc, group_chunks, KH, KW, ib, ob]`` (see above)."""
    kh, kw = spec.kernel
    gi, go = spec.in_channels // spec.groups, spec.out_channels // spec.groups
    if w.shape != (spec.out_channels, gi, kh, kw):
        raise ValueError(f"grouped weight shape {w.shape} != {(spec.out_channels, gi, kh, kw)}")
    ib, ob, r = spec.in_block, spec.out_block, spec.group_chunks
    out = np.zeros((spec.out_chunks, r, kh, kw, ib, ob), np.float32)
    for o in range(spec.out_chunks):
        oc = np.arange(o * ob, (o + 1) * ob)
        ic = (spec.group_chunk_start(o) * ib + np.arange(r * ib)).reshape(r, ib)
        live = (oc[None, None, :] < spec.out_channels) & (ic[:, :, None] < spec.in_channels)
        live &= ic[:, :, None] // gi == oc[None, None, :] // go
        rr, bi, bo = np.nonzero(live)
        out[o, rr, :, :, bi, bo] = w[oc[bo], ic[rr, bi] - (oc[bo] // go) * gi]
    return out


def pack_bias(b: np.ndarray | None, spec: Conv2dSpec) -> np.ndarray:
    """Bias ``[OC]`` (or None: zeros) -> ``[out_chunks, out_block]`` zero padded."""
    full = np.zeros(spec.out_chunks * spec.out_block, np.float32)
    if b is not None:
        full[: spec.out_channels] = np.asarray(b, dtype=np.float32).reshape(-1)
    return full.reshape(spec.out_chunks, spec.out_block)


def pack_data(x: np.ndarray, block: int) -> np.ndarray:
    """NCHW -> NCHW[block]c float32, channels zero-padded to a multiple of ``block``."""
    return pack(np.asarray(x, dtype=np.float32), block)


def conv2d_kernel(spec: Conv2dSpec, target: TargetSpec) -> Kernel:
    """The scheduled kernel for ``spec``: depthwise, general or grouped (:func:`supports`)."""
    if not supports(spec):
        if spec.is_grouped:
            raise NotImplementedError(
                f"grouped conv with groups={spec.groups} does not fit its blocks: {spec}"
            )
        raise NotImplementedError(f"unsupported conv2d spec: {spec}")
    if spec.is_depthwise:
        from backends.tvm.kernels.depthwise_nchwc import depthwise_nchwc_kernel

        return depthwise_nchwc_kernel(spec, target)
    from backends.tvm.kernels.conv2d_nchwc import conv2d_nchwc_kernel

    return conv2d_nchwc_kernel(spec, target)
