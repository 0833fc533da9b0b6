"""Converters of Conv and ConvTranspose (1:1; auto_pad, pads, strides... map to ConvAttrs)."""

from __future__ import annotations

from frontends.onnx.converter import register_generic

__all__: list[str] = []

register_generic({"Conv": 1, "ConvTranspose": 1})
