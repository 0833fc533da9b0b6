"""Per-op lowering rules from Kiln IR to Relax, one module per op family.

Importing this package registers every rule in :mod:`backends.tvm.lowering.table`.
"""

from backends.tvm.lowering import (  # noqa: F401
    control_flow,
    conv,
    elementwise,
    indexing,
    math,
    nn,
    normalization,
    recurrent,
    static_values,
    tensor,
    weight_only,
)
