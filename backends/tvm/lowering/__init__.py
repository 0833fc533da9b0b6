"""Per-op lowering rules from Kiln IR to Relax, one module per op family.

Importing this package registers every rule in :mod:`backends.tvm.lowering.table`.
"""

from backends.tvm.lowering import (  # noqa: F401
    attention,
    control_flow,
    conv,
    data_shaped,
    dynamic,
    elementwise,
    indexing,
    linalg_extra,
    math,
    nn,
    normalization,
    random_numbers,
    recurrent,
    resize,
    runtime_topk,
    static_values,
    tensor,
    weight_only,
)
