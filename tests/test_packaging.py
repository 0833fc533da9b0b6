"""The built wheel holds every top-level package and the schemas; the console script is declared."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT


def test_wheel_contents(tmp_path: Path) -> None:
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
        str(ROOT),
    ]
    subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path)
    wheels = list(tmp_path.glob("kiln_compiler-*.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    packages = sorted(
        str(init.parent.relative_to(ROOT))
        for top in ("compiler", "passes", "frontends", "backends", "schemas", "examples")
        for init in (ROOT / top).rglob("__init__.py")
    )
    assert "backends/tvm/kernels" in packages and "frontends/mnn" in packages
    for pkg in packages:
        assert f"{pkg}/__init__.py" in names, pkg
    for mod in (
        "passes/fold_batchnorm.py",
        "passes/fuse_conv_bias_act.py",
        "compiler/cli.py",
        "schemas/megengine/generated/schema_v2_generated.py",
        "schemas/megengine/generated/schema_v2_generated.pyi",
        "schemas/mnn/generated/MNN_generated.py",
        "schemas/cann/generated/om_pb2.py",
        "compiler/onnx_export.py",
        "schemas/megengine/schema_v2.fbs",
        "schemas/megengine/generate.py",
    ):
        assert mod in names, mod
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "kiln = compiler.cli:main" in zipfile.ZipFile(wheels[0]).read(entry).decode()
    assert not any(n.startswith("tests/") for n in names)
