"""The MegEngine frontend's entry point: read a ``.mge`` file into a Kiln Graph.

``load_mge`` reads the bytes, recognises the container (refusing the old
``mgb0001`` format and pickled checkpoints), parses the flatbuffer with the
generated readers and hands the neutral model to :class:`MgeImporter`. A file
that cannot be parsed, whatever the reason, is one ModelFileError naming it.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Mapping, Sequence

from compiler.errors import ModelFileError
from compiler.ir.graph import Graph
from frontends.megengine.container import Kind, open_container
from frontends.megengine.importer import MgeImporter
from frontends.megengine.model import MgeModel
from frontends.megengine.reader_v1 import read_v1
from frontends.megengine.reader_v2 import read_v2
from frontends.model_file import read_model_bytes

__all__ = ["load_mge", "read_mge"]

logger = logging.getLogger(__name__)

_DECODE_ERRORS = (
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    struct.error,
    OverflowError,
    MemoryError,
    AttributeError,
    RecursionError,
    UnicodeError,
)


def read_mge(data: bytes, source: str) -> MgeModel:
    """Parse a file's bytes into the neutral model; ModelFileError for anything unreadable."""
    box = open_container(data, source)
    try:
        if box.kind is Kind.FBS_V2:
            return read_v2(box.flatbuffer)
        return read_v1(box.flatbuffer, box.blob, "MGBC" if box.kind is Kind.FBS_V1_MGBC else "MGBS")
    except _DECODE_ERRORS as exc:
        why = "an offset points outside the file" if isinstance(exc, struct.error | IndexError) else str(exc)
        raise ModelFileError(f"{source}: corrupt or truncated {box.kind.value} model ({why})") from None


def load_mge(
    source: str | os.PathLike[str], *, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Import a MegEngine ``.mge`` model into a Kiln Graph.

    Args:
        source: path of an FBS V2 (``mgv2``) or FBS V1 (``MGBC``/``MGBS``) file.
        input_shapes: shapes for named graph inputs, replacing the dumped ones (same rank).

    Raises:
        ModelFileError: missing, unreadable, truncated or corrupt file, or a refused format.
        UnsupportedOpsError: some operators have no converter (every one is listed).
        InputShapeError: ``input_shapes`` names an unknown input or changes a rank.
        ConversionError: an operator could not be converted (names it).
    """
    p, data = read_model_bytes(source)
    model = read_mge(data, str(p))
    graph = MgeImporter(model, str(p), input_shapes or {}).run()
    graph.name = p.stem
    return graph
