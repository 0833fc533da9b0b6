"""Regenerate the Python protobuf code for Kiln's CANN schemas (``om.proto``, ``ge_ir.proto``).

Usage (from the project root)::

    .venv/bin/python -m schemas.cann.generate            # writes schemas/cann/generated/
    .venv/bin/python -m schemas.cann.generate --out DIR  # anywhere else (the freshness test)

The compiler is the ``protoc`` bundled in the pinned ``grpcio-tools`` wheel (test extra,
version 1.80.0, libprotoc 31.1). Its generated code needs a protobuf runtime of at least
6.31.1 and below 7, which the ``protobuf`` dependency satisfies. protoc is run as
``python -m grpc_tools.protoc`` with the running interpreter, never from a machine path.
Output: ``om_pb2.py`` / ``ge_ir_pb2.py`` with their ``.pyi`` stubs, plus a fixed ``__init__.py``.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from schemas.codegen import generator_main

__all__ = [
    "SCHEMA_DIR",
    "DEFAULT_OUT",
    "SCHEMAS",
    "GRPCIO_TOOLS_VERSION",
    "PROTOC_VERSION",
    "protoc_version",
    "generate",
]

SCHEMA_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = SCHEMA_DIR / "generated"
SCHEMAS = ("ge_ir.proto", "om.proto")
GRPCIO_TOOLS_VERSION = "1.80.0"
PROTOC_VERSION = "libprotoc 31.1"

_INIT = '''"""Generated protobuf code for Kiln's CANN schemas (schemas/cann/*.proto).

Do not edit: regenerate with ``python -m schemas.cann.generate``.
"""
'''


def _protoc(*args: str, cwd: Path | None = None) -> str:
    cmd = [sys.executable, "-m", "grpc_tools.protoc", *args]
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"protoc failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def protoc_version() -> str:
    """The bundled protoc's ``--version`` line; raises if grpcio-tools is not the pinned one."""
    try:
        have = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            "grpcio-tools is not installed: install the test extra (pip install 'kiln-compiler[test]')"
        ) from None
    if have != GRPCIO_TOOLS_VERSION:
        raise RuntimeError(f"grpcio-tools {have} is installed, expected the pinned {GRPCIO_TOOLS_VERSION}")
    return _protoc("--version").strip()


def generate(out_dir: Path = DEFAULT_OUT) -> list[Path]:
    """Generate the code into ``out_dir`` (replacing its files); returns the files written."""
    version = protoc_version()
    if version != PROTOC_VERSION:
        raise RuntimeError(f"protoc reports {version!r}, expected {PROTOC_VERSION!r}")
    out_dir = Path(out_dir)
    written = [out_dir / "__init__.py"]
    with tempfile.TemporaryDirectory() as tmp:
        _protoc("-I.", f"--python_out={tmp}", f"--pyi_out={tmp}", *SCHEMAS, cwd=SCHEMA_DIR)
        produced = sorted(p.name for p in Path(tmp).iterdir())
        expected = sorted(f"{Path(s).stem}_pb2{ext}" for s in SCHEMAS for ext in (".py", ".pyi"))
        if produced != expected:
            raise RuntimeError(f"protoc produced {produced}, expected {expected}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in [*out_dir.glob("*.py"), *out_dir.glob("*.pyi")]:
            old.unlink()
        for name in produced:
            shutil.copyfile(Path(tmp) / name, out_dir / name)
            written.append(out_dir / name)
    (out_dir / "__init__.py").write_text(_INIT)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    return generator_main(generate, DEFAULT_OUT, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
