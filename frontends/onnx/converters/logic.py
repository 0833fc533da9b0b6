"""Converters of comparison, boolean and selection ops (1:1)."""

from __future__ import annotations

from frontends.onnx.converter import register_generic

__all__: list[str] = []

register_generic(
    {
        "Equal": 7,
        "Less": 7,
        "Greater": 7,
        "LessOrEqual": 12,
        "GreaterOrEqual": 12,
        "Not": 1,
        "And": 7,
        "Or": 7,
        "Xor": 7,
        "Where": 9,
        "IsNaN": 9,
        "IsInf": 10,
    }
)
