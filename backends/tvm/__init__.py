"""Apache TVM backend: Kiln IR -> Relax (Kiln's own scheduled kernels) -> shared library."""
