"""The MegEngine frontend: :func:`load_mge` reads ``.mge`` models (FBS V2 and V1) into a Kiln Graph.

Modules, one concern each: ``container`` (recognise the file), ``reader_v2`` /
``reader_v1`` (flatbuffers -> :mod:`model`), ``type_ids`` (hashed class names),
``dtypes`` and ``quant`` (quantized types as QDQ), ``layouts`` (NCHW44/88 and
filter layouts), ``converter`` (the converter table) with ``converters/`` per
operator family, ``importer`` (model -> Graph) and ``loader`` (the entry point).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_mge"]


def __getattr__(name: str) -> Any:
    # Lazy, so that sniffing a file (frontends.megengine.container) imports nothing heavy.
    if name == "load_mge":
        from frontends.megengine.loader import load_mge

        return load_mge
    raise AttributeError(name)
