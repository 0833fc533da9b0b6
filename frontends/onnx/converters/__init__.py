"""ONNX converters, one module per op family; importing this package registers them all."""

from frontends.onnx.converters import (  # noqa: F401  (registration side effects)
    attention,
    contrib,
    control_flow,
    conv,
    detection,
    elementwise,
    linalg,
    logic,
    normalization,
    ort_fused,
    pooling,
    quantize,
    quantized,
    recurrent,
    reduce,
    resize,
    tensor_data,
    tensor_shape,
    weight_only,
)
