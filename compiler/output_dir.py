"""Atomic output directories: build in a temporary sibling, then rename into place.

Nothing partial is ever left at the destination: on any exception the
temporary directory is removed and the destination is untouched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_output_dir", "atomic_output_file"]


@contextlib.contextmanager
def atomic_output_dir(dest: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``dest`` when the block succeeds."""
    dest = Path(dest)
    created: list[Path] = []
    parent = dest.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in created:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    os.chmod(tmp, 0o755)
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        os.rmdir(old)
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)


@contextlib.contextmanager
def atomic_output_file(dest: Path) -> Iterator[Path]:
    """Yield a temporary path (same suffix) that replaces ``dest`` when the block succeeds."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dest.stem}.tmp-", suffix=dest.suffix, dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
