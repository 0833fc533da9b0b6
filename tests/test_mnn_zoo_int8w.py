"""MNN weight-only int8 on zoo architectures (issue 18): cosine >= 0.999 in MNN's runtime.

``kiln compile --emit mnn --mnn-weights int8 --inputs inputs.npz`` on a transformer (bert: every
layer int8), an RNN (crnn: convs into a native bidirectional LSTM whose W and R are int8 constants
too), a CNN whose depthwise layers
need the fp16 fallback (mobilenetv3_large_100) and one that fp16 alone cannot hold at 0.999
(efficientvit_m0: cosine 0.98 with every layer fp16, so the plan keeps its fewest layers fp32
first). The .mnn runs in MNN's runtime and every output must reach cosine 0.999 against
onnxruntime fp32 on the source model; the file's weight storage must be the plan the manifest
records. The sweep over the whole zoo is ``benchmarks/zoo_matrix.py --paths mnn-int8w``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler.cli import main
from schemas.mnn.schema import fb
from tests.helpers.mnn_convert import mnn_op_types
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

MIN_COSINE = 0.999
# model -> (fp16 layers expected, fp32 layers expected)
MODELS = {
    "bert": (False, False),
    "crnn": (False, False),
    "mobilenetv3_large_100": (True, False),
    "efficientvit_m0": (True, True),
}


def _storage_kinds(path: Path) -> list[int]:
    """IDSTQuan type of every Convolution2D op (0: plain fp32 weights, 1: int table, 3: fp16)."""
    net = fb.Net.GetRootAs(path.read_bytes(), 0)
    kinds = []
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.MainType() == fb.OpParameter.Convolution2D:
            conv = fb.Convolution2D()
            conv.Init(op.Main().Bytes, op.Main().Pos)
            quan = conv.QuanParameter()
            kinds.append(0 if quan is None else quan.Type())
    return kinds


@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_int8_weights_hold_cosine(name: str, zoo: ZooCache, tmp_path: Path) -> None:  # noqa: F811
    m = zoo.get(name)
    out = tmp_path / "out"
    args = ["compile", str(m.model), "-o", str(out), "--emit", "mnn", "--mnn-weights", "int8"]
    assert main([*args, "--inputs", str(m.inputs)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verification"]["passed"]
    (art,) = manifest["verification"]["artifacts"]
    worst = min(o["cosine"] for o in art["outputs"])
    assert worst >= MIN_COSINE, f"{name}: cosine {worst:.6f} in MNN"
    (desc,) = manifest["artifacts"]
    assert desc["precision"] == "int8w"
    plan = desc["details"]["weight_plan"]
    assert plan["cosine"] >= MIN_COSINE
    want_fp16, want_fp32 = MODELS[name]
    assert bool(plan["kept"]) == want_fp16 and bool(plan["kept_fp32"]) == want_fp32, plan
    kinds = _storage_kinds(out / "model.mnn")
    types = mnn_op_types(out / "model.mnn")
    recurrent = types.count("LSTM") + types.count("RNN")  # W, R as int8 constants + Cast, no IDSTQuan
    fp16, fp32 = len(plan["kept"]), len(plan["kept_fp32"])
    want = (plan["layers"] - fp16 - fp32 - recurrent, fp16, fp32)
    assert (kinds.count(1), kinds.count(3), kinds.count(0)) == want
    assert types.count("Cast") >= 2 * recurrent
