"""MNN's own converter, called through the ``mnn`` wheel's compiled ``_tools`` library.

The wheel's ``mnnconvert`` console script is never used: it pip-installs a logging SDK and
uploads usage logs. ``_tools.mnnconvert(argv)`` is the same C++ converter without that.
It reports failure only by not writing the output file, so that is what is checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from frontends.mnn.reader import OP_NAMES
from schemas.mnn.generated import MNN_generated as M

__all__ = ["mnn_convert", "onnx_to_mnn", "json_to_mnn", "mnn_op_types"]


def mnn_convert(argv: Sequence[str], out: Path) -> Path:
    """Run MNNConvert with ``argv`` (its usual flags); returns ``out`` (raises if it was not written)."""
    import _tools  # the mnn wheel's top-level extension module

    out.unlink(missing_ok=True)
    _tools.mnnconvert(["MNNConvert", *argv])
    if not out.is_file() or out.stat().st_size == 0:
        raise RuntimeError(f"MNNConvert did not write {out} (flags {list(argv)})")
    return out


def onnx_to_mnn(src: Path, dst: Path, *flags: str) -> Path:
    """ONNX -> .mnn, e.g. ``flags=("--weightQuantBits", "8")``."""
    return mnn_convert(
        ["-f", "ONNX", "--modelFile", str(src), "--MNNModel", str(dst), "--bizCode", "kiln", *flags], dst
    )


def json_to_mnn(src: Path, dst: Path) -> Path:
    """MNN's JSON form of a net (as ``-f MNN --JsonFile`` writes it) -> .mnn."""
    return mnn_convert(["-f", "JSON", "--modelFile", str(src), "--MNNModel", str(dst)], dst)


def mnn_op_types(path: Path) -> list[str]:
    """The op type names of an .mnn file, in file order."""
    net = M.Net.GetRootAs(path.read_bytes(), 0)
    return [OP_NAMES.get(net.Oplists(i).Type(), "?") for i in range(net.OplistsLength())]
