"""MegEngine converters, one module per operator family; importing the package registers them."""

from frontends.megengine.converters import (  # noqa: F401  (registration side effects)
    conv,
    elemwise,
    io,
    linalg,
    normalization,
    padding,
    pooling,
    reduce,
    resize,
    subtensor,
    tensor_shape,
)

__all__: list[str] = []
