"""The README's "adding an op to every backend" example, run: Sign through every backend.

The README shows the whole change: one registry entry and one row in each backend's table. This
test checks that every line it shows is in the file it names, that the support matrix lists the
op as native in every backend, and that a model using it (with Sin and Cos, added the same way)
compiles to ONNX, MNN, CANN and a TVM CPU library that each match onnxruntime.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.cli import main
from compiler.support_matrix import support_matrix
from tests.conftest import ROOT
from tests.helpers.onnx_text import text_model

EXAMPLE_OPS = ("Sign", "Sin", "Cos")


def _readme_example() -> list[tuple[str, str]]:
    """(file, line) pairs of the README section's code blocks (each block starts with ``# FILE``)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Adding an op to every backend", 1)[1].split("\n## ", 1)[0]
    pairs = []
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.S):
        lines = block.strip("\n").splitlines()
        assert lines[0].startswith("# "), "each example block starts with '# <file>'"
        path = lines[0][2:].strip()
        pairs += [(path, ln.strip()) for ln in lines[1:] if ln.strip() and not ln.strip().startswith("#")]
    return pairs


def test_readme_example_is_the_code() -> None:
    pairs = _readme_example()
    assert {p for p, _ in pairs} >= {
        "compiler/ops/elementwise.py",
        "backends/mnn/lower/activation.py",
        "schemas/cann/op_table.py",
        "backends/tvm/lowering/elementwise.py",
    }
    for path, line in pairs:
        assert line in (ROOT / path).read_text(), f"README example line not in {path}: {line}"


def test_matrix_lists_the_example_ops_as_native() -> None:
    rows = support_matrix().rows
    for op in EXAMPLE_OPS:
        assert {b: s.status for b, s in rows[op].items()} == dict.fromkeys(("onnx", "mnn", "cann", "tvm"), "native")


@pytest.mark.parametrize("flags", [("--emit", "onnx,mnn,cann"), ("--target", "cpu")], ids=["files", "tvm"])
def test_example_ops_compile_and_match_everywhere(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    model = tmp_path / "sign.onnx"
    onnx.save(
        text_model(
            """
            g (float[1,4,6,6] x) => (float[1,4,6,6] y) {
                s = Sign (x)
                a = Sin (x)
                c = Cos (x)
                t = Mul (s, a)
                y = Add (t, c)
            }
            """,
            opset=17,
        ),
        model,
    )
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype(np.float32)
    x[0, 0, 0, :3] = 0.0  # sign(0) = 0
    np.savez(tmp_path / "x.npz", x=x)
    args = ["compile", str(model), "-o", str(tmp_path / "out"), *flags, "--inputs", str(tmp_path / "x.npz")]
    assert main(args) == 0
    ver = json.loads((tmp_path / "out" / "manifest.json").read_text())["verification"]
    checked = sorted(a["path"] for a in ver["artifacts"])
    assert checked == (["model.mnn", "model.om", "model.onnx"] if flags[0] == "--emit" else ["cpu/model.so"])
    assert ver["passed"]
