"""Mutation test of Kiln's .om reader: damaged files give a clean error or a valid graph.

1,000 seeded mutations of four valid files (a small model, fp32 and int8, ge and domi):
random truncations (raw, and of MODEL_DEF with the header and table patched to agree), bit
flips (anywhere, and inside MODEL_DEF) and edits of header and partition-table fields. Each mutated file must either raise a KilnError (the CLI's clean
one-line error, exit 2) or read into a graph that is not wrong: it passes Kiln's verifier,
every constant has the dtype and shape its node declares, and no constant holds more bytes
than the file. Any other exception is a crash; any read slower than a second is a hang.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from compiler.errors import KilnError
from compiler.ir.graph import CONSTANT_OP
from compiler.ir.types import TensorType
from compiler.ir.verifier import verify
from frontends.cann.lift import lift_graph
from frontends.cann.loader import read_om_graph
from tests.helpers.cann import compile_tiny, tiny_net

MUTATIONS = 1000
# (offset, struct format) of the header fields and the first table entries a mutation may edit.
_FIELDS = [(0, "<I"), (4, "<I"), (8, "<I"), (76, "<I"), (80, "<B"), (156, "<I"), (184, "<Q")]
_FIELDS += [(256, "<I"), (264, "<I"), (272, "<Q"), (280, "<Q"), (288, "<I"), (296, "<Q"), (304, "<Q")]


@dataclass
class Outcome:
    rejected: int = 0
    accepted: int = 0
    failures: list[str] | None = None


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("cann-mutation")
    files = {}
    for precision in ("fp32", "int8"):
        for schema in ("ge", "domi"):
            out = compile_tiny(tiny_net(), root / f"{precision}-{schema}", precision, schema)
            files[f"{precision}-{schema}"] = (out / "model.om").read_bytes()
    return files


def _model_def_span(data: bytes) -> tuple[int, int]:
    (num,) = struct.unpack_from("<I", data, 256)
    _, _, size = struct.unpack_from("<I4xQQ", data, 264)
    start = 256 + 8 + 24 * num
    return start, start + size


def _cut_model_def(data: bytes, k: int) -> bytes:
    """MODEL_DEF shortened by k bytes, with the table and header lengths patched to agree."""
    lo, hi = _model_def_span(data)
    buf = bytearray(data[: hi - k] + data[hi:])
    struct.pack_into("<Q", buf, 280, hi - k - lo)
    struct.pack_into("<Q", buf, 296, struct.unpack_from("<Q", data, 296)[0] - k)
    struct.pack_into("<Q", buf, 184, len(buf) - 256)
    return bytes(buf)


def _mutate(data: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    kind = int(rng.integers(5))
    buf = bytearray(data)
    if kind == 0:
        n = int(rng.integers(len(data)))
        return f"truncate to {n}", bytes(buf[:n])
    if kind == 4:
        lo, hi = _model_def_span(data)
        k = int(rng.integers(1, hi - lo))
        return f"cut {k} bytes off MODEL_DEF (lengths patched)", _cut_model_def(data, k)
    if kind in (1, 2):
        lo, hi = _model_def_span(data) if kind == 2 else (0, len(data))
        bits = [int(b) for b in rng.integers(lo * 8, hi * 8, size=int(rng.integers(1, 5)))]
        for b in bits:
            buf[b // 8] ^= 1 << (b % 8)
        return f"flip bits {bits}", bytes(buf)
    off, fmt = _FIELDS[int(rng.integers(len(_FIELDS)))]
    size = struct.calcsize(fmt)
    old = struct.unpack_from(fmt, data, off)[0]
    top = 2 ** (8 * size) - 1
    choices = [0, 1, 2, 8, 9, 256, top, old + 1, max(old - 1, 0), int(rng.integers(0, min(top, 2**40)))]
    new = min(int(choices[int(rng.integers(len(choices)))]), top)
    struct.pack_into(fmt, buf, off, new)
    return f"set {fmt} at {off}: {old} -> {new}", bytes(buf)


def _check_graph(data: bytes, what: str) -> None:
    schema, om = read_om_graph(data, what)
    graph = lift_graph(om, what)
    verify(graph)
    for node in graph.nodes():
        if node.op == CONSTANT_OP and not node.domain:
            arr = node.attrs.value
            assert TensorType.of(arr) == node.output_types[0], f"{node.describe()}: constant type"
            assert arr.nbytes <= len(data), (
                f"{node.describe()}: {arr.nbytes} bytes from a {len(data)}-byte file"
            )


def test_valid_files_read(valid_files: dict[str, bytes]) -> None:
    for name, data in valid_files.items():
        _check_graph(data, name)


def test_mutations_give_clean_errors(valid_files: dict[str, bytes]) -> None:
    rng = np.random.default_rng(20261129)
    names = sorted(valid_files)
    out = Outcome(failures=[])
    assert out.failures is not None
    for i in range(MUTATIONS):
        name = names[i % len(names)]
        desc, data = _mutate(valid_files[name], rng)
        what = f"{name} #{i} ({desc})"
        try:
            _check_graph(data, what)
        except KilnError:
            out.rejected += 1
        except Exception as exc:  # noqa: BLE001 - any other exception is the bug this test hunts
            out.failures.append(f"{what}: {type(exc).__name__}: {exc}")
        else:
            out.accepted += 1
    assert not out.failures, f"{len(out.failures)} bad outcomes:\n" + "\n".join(out.failures[:20])
    assert out.rejected + out.accepted == MUTATIONS
    assert out.rejected > MUTATIONS // 2, f"only {out.rejected} of {MUTATIONS} mutations were rejected"


def test_rejections_are_one_clear_line(tmp_path: Path, valid_files: dict[str, bytes]) -> None:
    from compiler.cli import main as kiln

    bad = tmp_path / "cut.om"
    bad.write_bytes(valid_files["fp32-ge"][:1000])
    assert kiln(["inspect", str(bad)]) == 2
