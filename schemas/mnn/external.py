"""External weights: the ``<model>.mnn.weight`` side file and its integrity check.

With external data, big arrays leave the flatbuffer and are appended to the side
file; the op keeps byte offsets (MNN's layout, see NOTES.md section 3):

* ``Convolution2D.external`` = ``[offset, weight_bytes, bias_bytes]`` for float weights, or
  ``[offset, buffer_bytes, alpha_bytes, bias_bytes, index_bytes]`` with ``quanParameter``
  (int table coding and fp16 weights alike; alpha bytes are fp16 under ``scaleStorage FP16``);
  the pieces lie back to back from ``offset`` in that order.
* ``Blob.external`` = ``[offset, bytes]`` for large constants.

MNN looks for ``<model path> + ".weight"``. If that file is missing or short it prints a
warning and runs with garbage, so :func:`check_side_file` refuses such a model instead.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compiler.errors import ModelFileError
from schemas.mnn.schema import fb

__all__ = ["SIDE_SUFFIX", "ExternalData", "side_file", "external_extent", "check_side_file"]

SIDE_SUFFIX = ".weight"


def side_file(model: Path) -> Path:
    """Where MNN looks for the external data of ``model``."""
    return Path(str(model) + SIDE_SUFFIX)


class ExternalData:
    """The side file's bytes, built by appending arrays in emission order."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0

    @property
    def size(self) -> int:
        """Bytes so far."""
        return self._size

    def append(self, *arrays: np.ndarray) -> list[int]:
        """Append arrays back to back; returns ``[offset, bytes of each array...]``."""
        offset = self._size
        sizes = []
        for a in arrays:
            data = np.ascontiguousarray(a).tobytes()
            self._chunks.append(data)
            self._size += len(data)
            sizes.append(len(data))
        return [offset, *sizes]

    def getvalue(self) -> bytes:
        """All bytes."""
        return b"".join(self._chunks)


def _extent(ext: np.ndarray | int) -> int:
    if isinstance(ext, int) or len(ext) < 2:
        return 0
    return int(ext[0]) + int(np.sum(ext[1:]))


def external_extent(data: bytes) -> int:
    """Bytes of side file that the ``.mnn`` flatbuffer ``data`` refers to (0: none)."""
    net = fb.Net.GetRootAs(data, 0)
    need = 0
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        tab = op.Main()
        if tab is None:
            continue
        kind = op.MainType()
        if kind == fb.OpParameter.Convolution2D:
            conv = fb.Convolution2D()
            conv.Init(tab.Bytes, tab.Pos)
            need = max(need, _extent(conv.ExternalAsNumpy()))
        elif kind == fb.OpParameter.Blob:
            blob = fb.Blob()
            blob.Init(tab.Bytes, tab.Pos)
            need = max(need, _extent(blob.ExternalAsNumpy()))
        elif kind == fb.OpParameter.Scale:
            scale = fb.Scale()
            scale.Init(tab.Bytes, tab.Pos)
            need = max(need, _extent(scale.ExternalAsNumpy()))
    return need


def check_side_file(model: Path, data: bytes | None = None) -> None:
    """Raise ModelFileError if ``model`` uses external data whose side file is missing or short."""
    model = Path(model)
    need = external_extent(model.read_bytes() if data is None else data)
    if need == 0:
        return
    side = side_file(model)
    if not side.is_file():
        raise ModelFileError(f"{model}: its weights live in {side.name}, which is missing")
    have = side.stat().st_size
    if have < need:
        raise ModelFileError(f"{model}: {side.name} has {have} bytes, the model needs {need}")
