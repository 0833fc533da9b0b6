"""Converters of the opset-23 transformer ops RotaryEmbedding and Attention (1:1).

Attention-24 adds an optional ``nonpad_kv_seqlen`` input, which Kiln's Attention
does not take: such a node fails conversion with the arity named.
"""

from __future__ import annotations

from frontends.onnx.converter import register_generic

__all__: list[str] = []

register_generic({"RotaryEmbedding": 23, "Attention": 23})
