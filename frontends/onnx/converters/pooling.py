"""Converters of pooling ops.

MaxPool and AveragePool map 1:1 at every opset: later versions only add
attributes (storage_order, ceil_mode, dilations, count_include_pad) whose
defaults equal the older behaviour.
"""

from __future__ import annotations

from frontends.onnx.converter import register_generic

__all__: list[str] = []

register_generic(
    {
        "MaxPool": 1,
        "AveragePool": 1,
        "GlobalAveragePool": 1,
        "GlobalMaxPool": 1,
        "LpPool": 2,
        "GlobalLpPool": 2,
        "MaxRoiPool": 1,
        "MaxUnpool": 9,
    }
)
