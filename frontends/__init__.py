"""Model frontends: each reads one file format into a Kiln Graph (see :mod:`frontends.registry`)."""

from frontends.registry import detect_format, load_model

__all__ = ["detect_format", "load_model"]
