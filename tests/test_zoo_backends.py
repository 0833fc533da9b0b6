"""A representative handful of ../shared/zoo architectures through every file backend (issue 14).

Each family exercises the shared legalization: bert (LayerNormalization decomposed for MNN and
CANN, the attention mask's And and Where rewritten, Gather), whisper_encoder (1-D convs as 2-D
convs with H = 1, Gelu in Erf form), mobilevit_xs (multi-output Split into Slices for CANN,
MatMul attention) and resnet18 (the CNN path, untouched). ``kiln compile --emit onnx,mnn,cann``
verifies every artifact in its own runtime: ONNX and the .om read-back in onnxruntime at fp32
max rel 1e-4, the .mnn in MNN's runtime; the test also holds MNN to the zoo bar of worst-output
max rel 1e-3 against onnxruntime. The full 36-model sweep is benchmarks/zoo_matrix.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler.cli import main
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

MODELS = ["bert", "whisper_encoder", "mobilevit_xs", "resnet18"]
MNN_ZOO_BAR = 1e-3


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_writes_every_file_backend(name: str, zoo: ZooCache, tmp_path: Path) -> None:  # noqa: F811
    m = zoo.get(name)
    out = tmp_path / "out"
    args = ["compile", str(m.model), "-o", str(out), "--emit", "onnx,mnn,cann", "--inputs", str(m.inputs)]
    assert main(args) == 0
    ver = json.loads((out / "manifest.json").read_text())["verification"]
    assert ver["passed"]
    by_path = {a["path"]: a for a in ver["artifacts"]}
    assert sorted(by_path) == ["model.mnn", "model.om", "model.onnx"]
    worst = max(o["max_rel"] for o in by_path["model.mnn"]["outputs"])
    assert worst <= MNN_ZOO_BAR, worst
