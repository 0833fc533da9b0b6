"""The committed MegEngine readers are exactly what schemas/megengine/generate.py produces now."""

from __future__ import annotations

from pathlib import Path

from schemas.megengine.generate import DEFAULT_OUT, SCHEMAS, codegen_text, generate
from tests.conftest import ROOT


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    fresh = generate(tmp_path / "generated")
    names = sorted(p.name for p in fresh)
    committed = sorted(p.name for p in DEFAULT_OUT.iterdir() if p.suffix in (".py", ".pyi"))
    assert names == committed, "stale or missing generated files: run python -m schemas.megengine.generate"
    for path in fresh:
        assert path.read_bytes() == (DEFAULT_OUT / path.name).read_bytes(), (
            f"{path.name} is stale: run python -m schemas.megengine.generate"
        )


def test_generator_lives_next_to_the_schemas() -> None:
    assert DEFAULT_OUT == ROOT / "schemas" / "megengine" / "generated"
    for name in SCHEMAS:
        assert (ROOT / "schemas" / "megengine" / name).is_file(), name


def test_union_vector_workaround_keeps_the_slots() -> None:
    """additional_params:[OperatorParam] becomes a [ubyte] type vector plus a vector of tables."""
    src = (ROOT / "schemas" / "megengine" / "schema_v2.fbs").read_text()
    assert "additional_params:[OperatorParam];" in src  # the schema itself stays faithful
    out = codegen_text("schema_v2.fbs", src)
    assert "additional_params:[OperatorParam];" not in out
    assert "additional_params_type:[ubyte];\n    additional_params:[AnyParam];" in out
    assert "table AnyParam {}" in out
    assert codegen_text("dtype.fbs", "table X {}") == "table X {}"
