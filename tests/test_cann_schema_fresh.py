"""The generated CANN protobuf code is fresh, made by the pinned protoc, and wire-compatible with GE.

* Regenerating from schemas/cann gives the committed bytes.
* protoc is the one in the pinned grpcio-tools (libprotoc 31.1).
* Every message, field and enum value of Kiln's ``ge_ir.proto`` has the number, type and
  label of the verbatim upstream copy in ../shared/reference/cann (both the 2026 CANN-licensed
  file and the 2021 Apache-2.0 one), compared as compiled descriptors.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from schemas.cann.generate import DEFAULT_OUT, PROTOC_VERSION, SCHEMA_DIR, generate, protoc_version
from tests.conftest import ROOT, SHARED

_FILES = ["__init__.py", "ge_ir_pb2.py", "ge_ir_pb2.pyi", "om_pb2.py", "om_pb2.pyi"]


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    written = generate(tmp_path / "gen")
    assert sorted(p.name for p in written) == _FILES
    committed = sorted(p.name for p in [*DEFAULT_OUT.glob("*.py"), *DEFAULT_OUT.glob("*.pyi")])
    assert committed == _FILES
    for p in written:
        assert p.read_bytes() == (DEFAULT_OUT / p.name).read_bytes(), (
            f"schemas/cann/generated/{p.name} is stale: run python -m schemas.cann.generate"
        )


def test_protoc_is_the_pinned_one() -> None:
    assert protoc_version() == PROTOC_VERSION


def test_generated_packages_are_declared() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    for pkg in ("backends.cann", "frontends.cann", "schemas.cann", "schemas.cann.generated"):
        assert f'"{pkg}"' in pyproject, pkg
    assert '"grpcio-tools==1.80.0"' in pyproject and '"netron==9.3.3"' in pyproject


def _descriptors(folder: Path, name: str, out: Path) -> descriptor_pb2.FileDescriptorProto:
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{folder}", f"--descriptor_set_out={out}", name]
    subprocess.run(cmd, check=True, capture_output=True)
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return fds.file[0]


def _flatten(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, tuple[int, int, int, str]]:
    out: dict[str, tuple[int, int, int, str]] = {}

    def walk(prefix: str, msgs: list[descriptor_pb2.DescriptorProto]) -> None:
        for m in msgs:
            for f in m.field:
                out[f"{prefix}{m.name}.{f.name}"] = (f.number, f.type, f.label, f.type_name)
            for e in m.enum_type:
                for v in e.value:
                    out[f"{prefix}{m.name}.{e.name}.{v.name}"] = (v.number, 0, 0, "")
            walk(f"{prefix}{m.name}.", list(m.nested_type))

    walk("", list(fd.message_type))
    for e in fd.enum_type:
        for v in e.value:
            out[f"{e.name}.{v.name}"] = (v.number, 0, 0, "")
    return out


def test_ge_ir_matches_the_upstream_schemas(tmp_path: Path) -> None:
    ours = _flatten(_descriptors(SCHEMA_DIR, "ge_ir.proto", tmp_path / "ours.pb"))
    ref_dir = SHARED / "reference" / "cann"
    assert ref_dir.is_dir(), f"{ref_dir} is missing; CI must provide ../shared"
    for i, name in enumerate(("ge_ir.proto", "ge_ir.apache2-2021.proto")):
        theirs = _flatten(_descriptors(ref_dir, name, tmp_path / f"ref{i}.pb"))
        common = sorted(set(ours) & set(theirs))
        assert len(common) > 100, name
        diff = [(k, ours[k], theirs[k]) for k in common if ours[k] != theirs[k]]
        assert not diff, f"{name}: fields differ: {diff[:5]}"
        # Kiln leaves out only the attr_groups family; everything else upstream is here.
        missing = sorted(k for k in set(theirs) - set(ours) if "attr_groups" not in k)
        upstream_only = {
            "AttributeDef", "OtherGroupDef", "TensorDescAttrGroupsDef", "InputSourceDef", "ReplacementDef",
            "SymbolCheckInfoDef", "ShapeEnvSettingDef", "SymbolInfoDef", "ShapeEnvAttrGroupsDef", "SchedInfoDef",
            "ApiInfoDef", "MemAttrDef", "MemQueueAttrDef", "MemBufAttrDef", "MemOptAttrDef", "AxisDef",
            "AttrGroupDef", "AttrGroups",
        }  # fmt: skip
        assert [k for k in missing if k.split(".")[0] not in upstream_only] == [], name
