"""The README's Python API example runs as written (from a temporary working directory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import onnx

from tests.conftest import ROOT, SHARED


def test_readme_custom_pass_example(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    code = blocks[0].replace("../shared/", str(SHARED) + "/")
    (tmp_path / "example.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, check=True)
    model = onnx.load(tmp_path / "yunet_hard.onnx")
    ops = [n.op_type for n in model.graph.node]
    assert "HardSigmoid" in ops and "Sigmoid" not in ops
