"""Per-op lowering rules from Kiln IR to Relax, one module per op family.

Importing this package registers every rule in :mod:`backends.tvm.lowering.table`.
"""

from backends.tvm.lowering import conv, elementwise, nn, normalization, tensor  # noqa: F401
