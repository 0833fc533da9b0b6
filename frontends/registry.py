"""The table of frontends: pick one by file suffix or magic bytes, then load a Graph.

Each entry names a format, its suffixes, a sniffing function over the first
bytes of the file and a lazily imported ``"module:function"`` loader with the
signature ``load(path, *, input_shapes=None) -> Graph``. ONNX and MegEngine are
registered here (CANN ``.om`` and MNN ``.mnn`` too); other frontends register
through :func:`register_frontend`.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compiler.errors import ModelFileError

if TYPE_CHECKING:
    from compiler.ir.graph import Graph

__all__ = ["Frontend", "register_frontend", "frontend_formats", "detect_format", "load_model"]

logger = logging.getLogger(__name__)

_SNIFF_BYTES = 64


@dataclass(frozen=True)
class Frontend:
    """One model format Kiln can read."""

    name: str
    suffixes: tuple[str, ...]
    sniff: Callable[[bytes], bool]
    loader: str  # "module:function"


_FRONTENDS: dict[str, Frontend] = {}


def register_frontend(frontend: Frontend) -> None:
    """Add a frontend; names are unique."""
    if frontend.name in _FRONTENDS:
        raise ValueError(f"frontend {frontend.name!r} registered twice")
    _FRONTENDS[frontend.name] = frontend


def frontend_formats() -> list[str]:
    """Every registered format name."""
    return sorted(_FRONTENDS)


def _sniff_onnx(head: bytes) -> bool:
    # A ModelProto starts with field 1 (ir_version, varint: 0x08) or, rarely, another
    # top-level field: 0x12 producer_name, 0x1a producer_version, 0x3a graph, 0x42 opset_import.
    return bool(head) and head[0] in (0x08, 0x12, 0x1A, 0x22, 0x3A, 0x42) and b"\x00" * 8 not in head[:16]


def _sniff_megengine(head: bytes) -> bool:
    # Lazy: the container module imports nothing heavy. It also claims the refused
    # 'mgb0001' files, so that they get the frontend's clear message.
    from frontends.megengine.container import sniff

    return sniff(head)


register_frontend(Frontend("onnx", (".onnx",), _sniff_onnx, "frontends.onnx.loader:load_onnx"))
register_frontend(
    Frontend("megengine", (".mge", ".mdl"), _sniff_megengine, "frontends.megengine.loader:load_mge")
)


def _sniff_om(head: bytes) -> bool:
    # An Ascend .om file starts with the ModelFileHeader magic 0x444F4D49 ("IMOD" on disk).
    return head[:4] == b"IMOD"


register_frontend(Frontend("cann", (".om",), _sniff_om, "frontends.cann.loader:load_om"))


def _sniff_mnn(head: bytes) -> bool:
    # An .mnn file is a bare FlatBuffer (no identifier): claimed by its suffix only.
    return False


register_frontend(Frontend("mnn", (".mnn",), _sniff_mnn, "frontends.mnn.loader:load_mnn"))


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format name of a model file, by suffix first and then by magic bytes."""
    p = Path(path)
    if not p.is_file():
        raise ModelFileError(f"{p}: model file not found")
    suffix = p.suffix.lower()
    for fe in _FRONTENDS.values():
        if suffix in fe.suffixes:
            return fe.name
    try:
        with p.open("rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as exc:
        raise ModelFileError(f"{p}: cannot read the model file ({exc})") from None
    for fe in _FRONTENDS.values():
        if fe.sniff(head):
            logger.info("%s: detected format %s from its content", p, fe.name)
            return fe.name
    raise ModelFileError(
        f"{p}: unknown model format (suffix {suffix or 'none'!r}; known: {', '.join(frontend_formats())})"
    )


def load_model(
    path: str | os.PathLike[str], *, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Load a model file of any registered format into a Kiln Graph."""
    fe = _FRONTENDS[detect_format(path)]
    module, func = fe.loader.split(":")
    load: Callable[..., Graph] = getattr(importlib.import_module(module), func)
    return load(path, input_shapes=input_shapes)
