"""Reading a model file's bytes with one clear error for every way it can fail."""

from __future__ import annotations

import os
from pathlib import Path

from compiler.errors import ModelFileError

__all__ = ["read_model_bytes"]


def read_model_bytes(source: str | os.PathLike[str]) -> tuple[Path, bytes]:
    """The path and bytes of a model file; ModelFileError names the file if missing or unreadable."""
    p = Path(source)
    if not p.is_file():
        raise ModelFileError(f"{p}: model file not found")
    try:
        return p, p.read_bytes()
    except OSError as exc:
        raise ModelFileError(f"{p}: cannot read the model file ({exc})") from None
