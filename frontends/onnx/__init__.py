"""The ONNX frontend: :func:`load_onnx` reads an ONNX model into a Kiln Graph."""

from frontends.onnx.loader import load_onnx

__all__ = ["load_onnx"]
