"""The fp32 conv2d kernel spec for blocked NCHW[b]c layouts, weight/bias packing, and dispatch.

Layouts (channel counts zero-padded up to whole blocks):

* data ``[N, ceil(IC/ib), IH, IW, ib]``; output and residual ``[N, ceil(OC/ob), OH, OW, ob]``;
* general conv weight ``[ceil(OC/ob), ceil(IC/ib), KH, KW, ib, ob]`` with
  ``Wp[o, i, kh, kw, bi, bo] = W[o*ob + bo, i*ib + bi, kh, kw]`` (zero outside);
* depthwise weight ``[ceil(C/cb), KH, KW, cb]`` with ``Wp[c, kh, kw, b] = W[c*cb + b, 0, kh, kw]``;
* bias ``[ceil(OC/ob), ob]`` with ``Bp[o, b] = B[o*ob + b]`` (zero outside).

``OH = (IH + pad_top + pad_bottom - dh*(KH-1) - 1) // sh + 1`` and likewise for ``OW``.
"""

from __future__ import annotations

import hashlib
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING

import numpy as np

from backends.tvm.kernels.epilogue import ACTIVATIONS

if TYPE_CHECKING:
    from backends.tvm.kernels.kernel import Kernel
    from backends.tvm.target import TargetSpec

__all__ = [
    "Conv2dSpec",
    "conv2d_kernel",
    "pack_weight",
    "pack_bias",
    "pack_data",
    "unpack_output",
    "supports",
]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Conv2dSpec:
    """One fp32 conv2d (+ bias, optional residual add, activation) in NCHW[b]c layout."""

    batch: int
    in_channels: int
    in_h: int
    in_w: int
    out_channels: int
    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    dilations: tuple[int, int] = (1, 1)
    groups: int = 1
    in_block: int = 8
    out_block: int = 8
    activation: str = "none"
    alpha: float = 0.0
    beta: float = 0.0
    residual: bool = False

    @property
    def out_h(self) -> int:
        """``(IH + pt + pb - dh*(KH-1) - 1) // sh + 1``."""
        eff = self.dilations[0] * (self.kernel[0] - 1) + 1
        return (self.in_h + self.pads[0] + self.pads[2] - eff) // self.strides[0] + 1

    @property
    def out_w(self) -> int:
        """``(IW + pl + pr - dw*(KW-1) - 1) // sw + 1``."""
        eff = self.dilations[1] * (self.kernel[1] - 1) + 1
        return (self.in_w + self.pads[1] + self.pads[3] - eff) // self.strides[1] + 1

    @property
    def in_chunks(self) -> int:
        """``ceil(IC / in_block)``."""
        return _ceil_div(self.in_channels, self.in_block)

    @property
    def out_chunks(self) -> int:
        """``ceil(OC / out_block)``."""
        return _ceil_div(self.out_channels, self.out_block)

    @property
    def is_depthwise(self) -> bool:
        """groups == in_channels == out_channels (and more than one group)."""
        return self.groups > 1 and self.groups == self.in_channels == self.out_channels

    @property
    def data_shape(self) -> tuple[int, int, int, int, int]:
        """``[N, in_chunks, IH, IW, in_block]``."""
        return (self.batch, self.in_chunks, self.in_h, self.in_w, self.in_block)

    @property
    def out_shape(self) -> tuple[int, int, int, int, int]:
        """``[N, out_chunks, OH, OW, out_block]``."""
        return (self.batch, self.out_chunks, self.out_h, self.out_w, self.out_block)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """The packed weight shape the kernel reads (see the module docstring)."""
        kh, kw = self.kernel
        if self.is_depthwise:
            return (self.out_chunks, kh, kw, self.out_block)
        return (self.out_chunks, self.in_chunks, kh, kw, self.in_block, self.out_block)

    @property
    def flops(self) -> int:
        """Multiply-adds times two over the real channels."""
        per_out = 2 * (self.in_channels // self.groups) * self.kernel[0] * self.kernel[1]
        return self.batch * self.out_channels * self.out_h * self.out_w * per_out

    def key(self) -> str:
        """A short deterministic hash of all spec fields."""
        return hashlib.sha1(repr(astuple(self)).encode()).hexdigest()[:12]


def supports(spec: Conv2dSpec) -> bool:
    """True when :func:`conv2d_kernel` builds this spec (groups == 1 or depthwise, valid shapes)."""
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
    return spec.is_depthwise and spec.in_block == spec.out_block


def pack_weight(w: np.ndarray, spec: Conv2dSpec) -> np.ndarray:
    """ONNX OIHW ``[OC, IC/groups, KH, KW]`` float32 -> the packed, zero-padded layout the kernel reads."""
    kh, kw = spec.kernel
    w = np.asarray(w, dtype=np.float32)
    oc_pad = spec.out_chunks * spec.out_block
    if spec.is_depthwise:
        if w.shape != (spec.out_channels, 1, kh, kw):
            raise ValueError(f"depthwise weight shape {w.shape} != {(spec.out_channels, 1, kh, kw)}")
        full = np.zeros((oc_pad, kh, kw), np.float32)
        full[: spec.out_channels] = w[:, 0]
        packed = full.reshape(spec.out_chunks, spec.out_block, kh, kw).transpose(0, 2, 3, 1)
        return np.ascontiguousarray(packed)
    expect = (spec.out_channels, spec.in_channels // spec.groups, kh, kw)
    if spec.groups != 1 or w.shape != expect:
        raise ValueError(f"weight shape {w.shape} (groups {spec.groups}) != {expect} with groups 1")
    ic_pad = spec.in_chunks * spec.in_block
    full = np.zeros((oc_pad, ic_pad, kh, kw), np.float32)
    full[: spec.out_channels, : spec.in_channels] = w
    packed = full.reshape(spec.out_chunks, spec.out_block, spec.in_chunks, spec.in_block, kh, kw)
    return np.ascontiguousarray(packed.transpose(0, 2, 4, 5, 3, 1))


def pack_bias(b: np.ndarray | None, spec: Conv2dSpec) -> np.ndarray:
    """Bias ``[OC]`` (or None: zeros) -> ``[out_chunks, out_block]`` zero padded."""
    full = np.zeros(spec.out_chunks * spec.out_block, np.float32)
    if b is not None:
        full[: spec.out_channels] = np.asarray(b, dtype=np.float32).reshape(-1)
    return full.reshape(spec.out_chunks, spec.out_block)


def pack_data(x: np.ndarray, block: int) -> np.ndarray:
    """NCHW -> NCHW[block]c, channels zero-padded to a multiple of ``block``."""
    n, c, h, w = x.shape
    chunks = _ceil_div(c, block)
    full = np.zeros((n, chunks * block, h, w), np.float32)
    full[:, :c] = x
    return np.ascontiguousarray(full.reshape(n, chunks, block, h, w).transpose(0, 1, 3, 4, 2))


def unpack_output(y: np.ndarray, channels: int) -> np.ndarray:
    """NCHW[b]c -> NCHW, dropping the padded channels beyond ``channels``."""
    n, chunks, h, w, block = y.shape
    full = y.transpose(0, 1, 4, 2, 3).reshape(n, chunks * block, h, w)
    return np.ascontiguousarray(full[:, :channels])


def conv2d_kernel(spec: Conv2dSpec, target: TargetSpec) -> Kernel:
    """The scheduled kernel for ``spec``: depthwise or general; other grouped convs raise."""
    if not supports(spec):
        if spec.groups != 1 and not spec.is_depthwise:
            raise NotImplementedError(f"grouped conv with groups={spec.groups} is not supported")
        raise NotImplementedError(f"unsupported conv2d spec: {spec}")
    if spec.is_depthwise:
        from backends.tvm.kernels.depthwise_nchwc import depthwise_nchwc_kernel

        return depthwise_nchwc_kernel(spec, target)
    from backends.tvm.kernels.conv2d_nchwc import conv2d_nchwc_kernel

    return conv2d_nchwc_kernel(spec, target)
