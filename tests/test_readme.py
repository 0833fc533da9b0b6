"""The README's Python API example runs as written (from a temporary working directory)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import onnx

from tests.conftest import ROOT, SHARED


def test_readme_custom_pass_example(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    code = blocks[0].replace("../shared/", str(SHARED) + "/")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    finally:
        os.chdir(cwd)
    model = onnx.load(tmp_path / "yunet_hard.onnx")
    ops = [n.op_type for n in model.graph.node]
    assert "HardSigmoid" in ops and "Sigmoid" not in ops
