"""The op registry and the op families that register into it.

Importing this package registers every op; ask :func:`get_op` for an OpDef.
"""

from compiler.ops import (  # noqa: F401  (registration side effects)
    attention,
    cast,
    control_flow,
    conv,
    core,
    detection,
    einsum,
    elementwise,
    fused,
    grid_sample,
    layout_transform,
    linalg,
    logic,
    matmul_nbits,
    normalization,
    pooling,
    qconv,
    qgemm,
    quantize,
    random,
    recurrent,
    reduce,
    resize,
    scans_and_masks,
    scatter,
    space_depth,
    tensor_data,
    tensor_index,
    tensor_shape,
    weight_only,
    weight_only_gather,
)
from compiler.ops.registry import OpDef, all_ops, get_op, has_op, register

__all__ = ["OpDef", "all_ops", "get_op", "has_op", "register"]
