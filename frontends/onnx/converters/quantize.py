"""Converters of QuantizeLinear / DequantizeLinear (1:1; later opsets only add attributes).

DynamicQuantizeLinear and the QOperator / integer ops are in :mod:`.quantized`.
"""

from __future__ import annotations

from frontends.onnx.converter import register_generic

__all__: list[str] = []

register_generic({"QuantizeLinear": 10, "DequantizeLinear": 10})
