"""The ``.om`` runner: Kiln's own reader plus onnxruntime.

There is no Ascend runtime here, so ``kiln run`` and ``kiln compile --emit cann``
verification read the ``.om`` back with Kiln's CANN frontend (through the frontend registry,
:func:`compiler.plugins.load_model`, so that no backend imports a frontend), export that graph
to ONNX and run it in onnxruntime. This checks the serialization round trip (every op, attribute,
weight and quantization parameter the file holds), not execution on an Ascend NPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from compiler.onnx_export import export_onnx, model_bytes
from compiler.plugins import load_model
from compiler.runners import run_onnxruntime

__all__ = ["run_om"]


def run_om(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of an .om file on ``feeds`` (read back by Kiln, run by onnxruntime)."""
    graph = load_model(path)
    return run_onnxruntime(model_bytes(export_onnx(graph)), feeds)
