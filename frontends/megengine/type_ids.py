"""Operator type ids: MegEngine names an operator class by a hash of its C++ class name.

``type_id = XXH64(seed 20160701)`` of the class name in one of two variants:

* with a trailing NUL, e.g. ``"ConvBiasForwardV4\\0"``: FBS V1 ``MGBC`` files and
  V2 operators registered at ``opr_version`` 2;
* without the NUL and without a trailing ``V<digit>``, e.g. ``"MatrixMul"`` for
  ``MatrixMulV2``: V2 operators at ``opr_version`` 1 and V1 ``MGBS`` files.

V2 files also carry the class name as a string; V1 files carry only the hash,
so :func:`class_of` maps both hash variants of every known class name back.
:func:`family_of` strips the version and a ``Forward`` suffix to get the key
of the converter table (``ConvBiasForwardV4`` -> ``ConvBias``).
"""

from __future__ import annotations

import re
from functools import cache

from frontends.megengine.xxh64 import xxh64

__all__ = ["SEED", "CLASS_NAMES", "type_id", "class_of", "family_of"]

SEED = 20160701

CLASS_NAMES: tuple[str, ...] = (
    # graph inputs and constants
    "Host2DeviceCopy",
    "ImmutableTensor",
    "SharedDeviceTensor",
    "SharedDeviceTensorWithFormat",
    "VolatileSharedDeviceTensor",
    "MultipleDeviceTensorHolder",
    "MultipleDeviceTensorWithFormatHolder",
    # convolution and pooling
    "Convolution",
    "ConvolutionV2",
    "ConvBiasForward",
    "ConvBiasForwardV4",
    "ConvolutionBackwardData",
    "ConvolutionBackwardDataV2",
    "ConvolutionBackwardFilter",
    "ConvolutionBackwardFilterV2",
    "Convolution3D",
    "BatchConvBiasForward",
    "BatchConvBiasForwardV1",
    "DeformableConvForward",
    "DeformableConvForwardV1",
    "LocalShareForwardV1",
    "Pooling",
    "PoolingV1",
    "AdaptivePooling",
    "AdaptivePoolingV1",
    "ROIAlign",
    "ROIAlignV1",
    "ROIPooling",
    # elementwise and linear algebra
    "Elemwise",
    "ElemwiseMultiType",
    "PowC",
    "TypeCvt",
    "TypeCvtV2",
    "MatrixMul",
    "MatrixMulV2",
    "BatchedMatrixMul",
    "BatchedMatrixMulV2",
    "Dot",
    "MatrixInverse",
    "SVD",
    # normalization and softmax
    "BatchNorm",
    "BatchNormV1",
    "LayerNorm",
    "GroupNorm",
    "InstanceNorm",
    "GeneralNorm",
    "LRN",
    "Softmax",
    # shapes, indexing and data movement
    "Reshape",
    "ReshapeV1",
    "GetVarShape",
    "GetVarShapeV1",
    "Broadcast",
    "Dimshuffle",
    "AxisAddRemove",
    "Concat",
    "Split",
    "Subtensor",
    "SetSubtensor",
    "IncrSubtensor",
    "IndexingOneHot",
    "IndexingMultiAxisVec",
    "IndexingSetMultiAxisVec",
    "Padding",
    "Copy",
    "Identity",
    "MarkNoBroadcastElemwise",
    "RelayoutFormat",
    "RelayoutFormatV1",
    "Reduce",
    "ReduceV2",
    "Argmax",
    "Argmin",
    "Argsort",
    "TopK",
    "Cumsum",
    "CumsumV1",
    "CondTake",
    "NonZero",
    "Where",
    "Linspace",
    "Eye",
    "Diag",
    "Flip",
    "Rotate",
    # vision
    "Resize",
    "ResizeV2",
    "WarpPerspective",
    "WarpPerspectiveV2",
    "WarpAffine",
    "WarpAffineV2",
    "Remap",
    "RemapV1",
    "CvtColor",
    "GaussianBlur",
    "Images2Neibs",
    "NMSKeepMGB",
    # random and training
    "UniformRNG",
    "UniformRNGV1",
    "GaussianRNG",
    "GaussianRNGV1",
    "DropoutForward",
    "FakeQuant",
    "TQT",
    "LSQ",
    "LSTMForward",
    "RNNForward",
    "MultiHeadAttn",
    "CheckNonFinite",
    "AssertEqual",
    "AddUpdate",
    "VirtualDep",
    "SetGrad",
)

_VERSION = re.compile(r"V\d+$")


def type_id(name: str, with_nul: bool) -> int:
    """The type id of class ``name`` in one of the two hash variants."""
    if with_nul:
        return xxh64(name.encode() + b"\0", SEED)
    return xxh64(_VERSION.sub("", name).encode(), SEED)


@cache
def _table() -> dict[int, str]:
    table: dict[int, str] = {}
    for name in CLASS_NAMES:
        table.setdefault(type_id(name, with_nul=False), _VERSION.sub("", name))
        table[type_id(name, with_nul=True)] = name
    return table


def class_of(tid: int) -> str | None:
    """The class name a type id hashes, or None when it is not a known class."""
    return _table().get(tid)


def family_of(class_name: str) -> str:
    """The converter key of a class name: version and ``Forward`` suffixes removed."""
    base = _VERSION.sub("", class_name)
    return base.removesuffix("Forward") or base
