"""The built wheel carries the CANN backend, frontend, generated code and schemas, and they import from it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT


def test_wheel_has_the_cann_packages(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(tmp_path),
    ]
    subprocess.run([*cmd, str(ROOT)], check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("kiln_compiler-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in (
        "backends/cann/__init__.py",
        "schemas/cann/generated/ge_ir_pb2.py",
        "schemas/cann/generated/om_pb2.py",
        "schemas/cann/generated/ge_ir_pb2.pyi",
        "frontends/cann/loader.py",
        "schemas/cann/generate.py",
        "schemas/cann/ge_ir.proto",
        "schemas/cann/om.proto",
        "schemas/cann/README.md",
    ):
        assert f in names, f
    # Import from the wheel alone (outside the source tree): the generated code and the reader load.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import schemas.cann.generated.ge_ir_pb2 as g, frontends.cann.loader as l, backends.cann.emit as e; "
        "assert g.__file__.startswith(sys.argv[1]) and l.__file__.startswith(sys.argv[1]), g.__file__"
    )
    subprocess.run([sys.executable, "-c", code, str(wheel)], check=True, cwd=tmp_path)
