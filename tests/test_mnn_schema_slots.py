"""Kiln's MNN schema (schemas/mnn/*.fbs) agrees with upstream MNN's on every format fact.

Upstream = ../shared/reference/mnn/schema (MNN.fbs at tag 3.6.1, the runtime Kiln targets;
the other files are identical at that tag). For every table, enum and union Kiln declares:
same field names, types and vtable slots; same enum values; same union tags. Key slots are
also pinned against NOTES.md's list, and against the generated code Kiln actually uses.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from schemas.mnn.schema import camel, fb
from tests.conftest import SHARED
from tests.helpers.fbs_schema import Schema, parse_schema

ROOT = Path(__file__).resolve().parents[1]
OURS = sorted((ROOT / "schemas" / "mnn").glob("*.fbs"))
UPSTREAM_DIR = SHARED / "reference" / "mnn" / "schema"


@pytest.fixture(scope="module")
def ours() -> Schema:
    return parse_schema(OURS)


@pytest.fixture(scope="module")
def upstream() -> Schema:
    assert UPSTREAM_DIR.is_dir(), f"upstream MNN schema missing at {UPSTREAM_DIR}"
    files = [p for p in sorted(UPSTREAM_DIR.glob("*.fbs")) if p.name != "MNN.fbs"]
    return parse_schema([*files, UPSTREAM_DIR / "at-tag-3.6.1" / "MNN.fbs"])


def test_every_table_matches_upstream_slots(ours: Schema, upstream: Schema) -> None:
    assert len(ours.tables) > 60
    for name, fields in ours.tables.items():
        assert name in upstream.tables, f"table {name} is not in upstream MNN"
        theirs = upstream.tables[name]
        assert len(fields) == len(theirs), f"{name}: {len(fields)} fields, upstream {len(theirs)}"
        for a, b in zip(fields, theirs, strict=True):
            assert (a.slot, a.name, a.type) == (b.slot, b.name, b.type), f"{name}: {a} != upstream {b}"


def test_every_enum_matches_upstream_values(ours: Schema, upstream: Schema) -> None:
    for name, members in ours.enums.items():
        assert upstream.enums.get(name) == members, f"enum {name} differs from upstream"


def test_union_tags_match_upstream(ours: Schema, upstream: Schema) -> None:
    mine, theirs = ours.unions["OpParameter"], upstream.unions["OpParameter"]
    assert len(mine) >= 50
    for member, tag in mine.items():
        assert theirs.get(member) == tag, f"OpParameter.{member}: tag {tag}, upstream {theirs.get(member)}"


def _slot(schema: Schema, table: str, name: str) -> int:
    return next(f.slot for f in schema.tables[table] if f.name == name)


@pytest.mark.parametrize(
    ("table", "field", "slot"),
    [
        # NOTES.md section 1 and 2
        ("Net", "bizCode", 0),
        ("Net", "oplists", 3),
        ("Net", "outputName", 4),
        ("Net", "sourceType", 6),
        ("Net", "tensorName", 7),
        ("Net", "mnn_uuid", 11),
        ("Op", "inputIndexes", 0),
        ("Op", "main", 2),
        ("Op", "name", 3),
        ("Op", "type", 5),
        ("Op", "externalPath", 7),
        ("Convolution2D", "quanParameter", 3),
        ("Convolution2D", "external", 6),
        ("Convolution2DCommon", "relu6", 13),
        ("Convolution2DCommon", "pads", 14),
        ("IDSTQuan", "quantScale", 4),
        ("IDSTQuan", "aMaxOrBits", 7),
        ("IDSTQuan", "readType", 9),
        ("IDSTQuan", "alphaFp16", 14),
        ("IDSTQuan", "scaleStorage", 15),
        ("Input", "dformat", 2),
        ("Pool", "ceilModel", 10),
        ("Pool", "countType", 12),
        ("Blob", "external", 9),
    ],
)
def test_key_slots(ours: Schema, table: str, field: str, slot: int) -> None:
    assert _slot(ours, table, field) == slot
    # the generated code Kiln builds with writes the same vtable offset (4 + 2 * slot)
    src = inspect.getsource(getattr(getattr(fb, table), camel(field)))
    assert f"self._tab.Offset({4 + 2 * slot})" in src


def test_key_enum_values() -> None:
    assert fb.OpType.Convolution == 12 and fb.OpType.ConvertTensor == 129 and fb.OpType.Raster == 128
    assert fb.OpParameter.Convolution2D == 9 and fb.OpParameter.Input == 21
    assert fb.OpParameter.TensorConvertInfo == 66 and fb.OpParameter.Extra == 78
    assert fb.MNN_DATA_FORMAT.NC4HW4 == 2 and fb.NetSource.ONNX == 3
    assert fb.ScaleStorageType.FP16 == 1 and fb.DataType.DT_INT8 == 6
