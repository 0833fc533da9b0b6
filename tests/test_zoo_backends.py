"""A representative handful of ../shared/zoo architectures through every file backend (issue 14, 18).

Each family exercises the shared legalization: bert (LayerNormalization, the attention mask's And
and Where rewritten, Gather), whisper_encoder (1-D convs as 2-D convs with H = 1, Gelu in Erf
form), mobilevit_xs (multi-output Split, MatMul attention), resnet18 (the CNN path, untouched) and
crnn (convs into a bidirectional LSTM: CANN's DynamicRNN, MNN's LSTM). ``kiln compile --emit
onnx,mnn,cann`` verifies every artifact in its own runtime: ONNX and the .om read-back in
onnxruntime at fp32 max rel 1e-4, the .mnn in MNN's runtime; the test also holds MNN to the zoo
bar of worst-output max rel 1e-3 against onnxruntime. The ``.om`` must pass Kiln's strict reader
and read back exactly (the lifted graph, run in onnxruntime, equals Kiln's ONNX artifact bit for
bit), and Netron's own ``.om`` reader (headless, under Node) must accept it and show every op and
every weight as Kiln wrote them. The full 36-model sweep is benchmarks/zoo_matrix.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compiler.api import load_model
from compiler.cli import main
from compiler.onnx_export import export_onnx, model_bytes
from compiler.runners import run_onnxruntime
from tests.helpers.cann import assert_netron_shows, netron_check
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

MODELS = ["bert", "whisper_encoder", "mobilevit_xs", "resnet18", "crnn"]
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

    # The .om reads back exactly (load_model goes through the strict reader).
    with np.load(m.inputs) as z:
        feeds = {k: z[k] for k in z.files}
    got = run_onnxruntime(model_bytes(export_onnx(load_model(out / "model.om"))), feeds)
    want = run_onnxruntime(out / "model.onnx", feeds)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert np.array_equal(got[k], v), f"{name}:{k}: the .om read back differs from model.onnx"

    (res,) = netron_check([out / "model.om"])
    assert_netron_shows(out / "model.om", res)
