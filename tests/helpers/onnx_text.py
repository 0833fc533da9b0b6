"""Build small ONNX models from ONNX's text syntax plus numpy initializers."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser

__all__ = ["text_model", "rand"]


def text_model(
    graph_text: str, opset: int = 17, ir_version: int = 8, **initializers: np.ndarray
) -> onnx.ModelProto:
    """Parse ``graph_text`` (an ONNX text-format graph) and add numpy initializers by name."""
    header = f'<ir_version: {ir_version}, opset_import: ["" : {opset}]>\n'
    model = onnx.parser.parse_model(header + graph_text)
    for name, arr in initializers.items():
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(arr), name))
    onnx.checker.check_model(model, full_check=True)
    return model


def rand(*shape: int, seed: int = 0, scale: float = 1.0, positive: bool = False) -> np.ndarray:
    """Seeded float32 test data."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
    return np.abs(a) + np.float32(0.1) if positive else a
