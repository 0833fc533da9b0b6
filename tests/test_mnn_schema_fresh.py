"""The generated MNN flatbuffers code is fresh: regenerating it from schemas/mnn gives the same bytes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from schemas.mnn.generate import DEFAULT_OUT, FLATC_VERSION, find_flatc, generate


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    written = generate(tmp_path / "gen")
    assert sorted(p.name for p in written) == ["MNN_generated.py", "__init__.py"]
    committed = sorted(p.name for p in DEFAULT_OUT.glob("*.py"))
    assert committed == ["MNN_generated.py", "__init__.py"]
    for p in written:
        assert p.read_bytes() == (DEFAULT_OUT / p.name).read_bytes(), (
            f"schemas/mnn/generated/{p.name} is stale: run python -m schemas.mnn.generate"
        )


def test_flatc_is_the_pinned_one() -> None:
    out = subprocess.run([str(find_flatc()), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"flatc version {FLATC_VERSION}"


def test_generated_package_is_declared() -> None:
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"schemas.mnn.generated"' in pyproject and '"schemas.mnn"' in pyproject
