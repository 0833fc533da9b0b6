"""Tensor layouts in an ``.mnn`` graph and the policy that places them.

MNN's CPU kernels for convolution, pooling, resize and PReLU work on NC4HW4 (channels
packed by 4); everything shape-sensitive (reshape, permute, softmax, slicing, matmul)
works on the ONNX order NCHW. Kiln mirrors the placement of MNN's own converter
(``AddTensorFormatConverter``, NOTES.md section 4):

* :data:`PACKED` ops take input 0 in NC4HW4 and produce NC4HW4;
* :data:`FOLLOW` ops (unary activations, casts) keep the layout of input 0;
* :data:`SHARED` ops (binary ops, concat) use NC4HW4 when every non-constant input is a
  4-D tensor already in NC4HW4 (constants are converted to match), else NCHW;
* every other op works on NCHW; graph inputs and outputs are NCHW.

A ``ConvertTensor`` op is inserted where a producer's layout differs from what a
consumer needs (one per tensor and layout, shared by all consumers).
"""

from __future__ import annotations

import enum

from schemas.mnn.schema import fb

__all__ = ["Format", "PACKED", "FOLLOW", "SHARED"]


class Format(enum.IntEnum):
    """The layouts Kiln uses (values are ``MNN_DATA_FORMAT``)."""

    NCHW = fb.MNN_DATA_FORMAT.NCHW
    NC4HW4 = fb.MNN_DATA_FORMAT.NC4HW4

    @property
    def suffix(self) -> str:
        """Tensor-name suffix of a converted copy."""
        return "__nc4hw4" if self is Format.NC4HW4 else "__nchw"


# MNN op types by layout behaviour (documentation of the policy; lowerings apply it).
PACKED = frozenset(
    {
        "Convolution",
        "ConvolutionDepthwise",
        "Deconvolution",
        "DeconvolutionDepthwise",
        "Pooling",
        "Interp",
        "PReLU",
    }
)
FOLLOW = frozenset({"ReLU", "ReLU6", "UnaryOp", "ELU", "Cast"})
SHARED = frozenset({"BinaryOp", "Concat"})
