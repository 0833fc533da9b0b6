"""Acceptance of weight-only int4/int8 on a zoo transformer whose weights are MatMul/Gemm weights.

ViT-Tiny (``vit_tiny_patch16_224``: 48 MatMuls with constant weights and the classifier Gemm hold
5.5 M of its 5.7 M parameters), compiled with ``kiln compile --quantize int4w|int8w --emit onnx,mnn``
and judged on the zoo inputs against onnxruntime running the fp32 source:

* int4w, GPTQ levels from the zoo calibration samples (``--calib``): the ONNX file (MatMulNBits)
  is <= 0.35x the fp32 file (measured 0.188x) and keeps output cosine >= 0.99 in onnxruntime
  (measured 0.9942; nearest rounding alone gives 0.9747); the MNN file keeps cosine >= 0.99 in
  MNN's runtime (the same levels: it equals the ONNX artifact to 1e-5).
* int8w, nearest rounding: cosine >= 0.999 in MNN and onnxruntime (measured 0.99991).
* int4w, nearest rounding (no ``--calib``): every layer at int4 gives cosine 0.9747 on the zoo
  inputs, under the 0.98 floor; the fallback plan keeps blocks.0's fc1 and fc2 and the head at int8
  (measured 0.9846), the compile passes and the manifest and the printed line name them.

The NLP models (``bert``, ``gpt2``, ``llama``: token embeddings of 1000 x 128 hold a quarter of the
weights) with ``--quantize int4w --calib --weight-min-cosine 0.99``: the embedding tables become
GatherBlockQuantized, the MatMuls MatMulNBits (GPTQ), and the ONNX file is <= 0.35x the fp32 one
(measured 0.170x, 0.193x, 0.228x) with cosine >= 0.99 in onnxruntime and MNN (measured 0.99834,
0.99294, 0.99336; gpt2 keeps its token embedding at int8, llama its embedding and lm_head).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from backends.mnn.runtime import run_mnn
from compiler.cli import main
from compiler.input_spec import load_inputs
from compiler.runners import run_onnxruntime
from tests.helpers.numerics import agreement, assert_close
from tests.helpers.zoo import ZooCache, ZooModel, zoo  # noqa: F401 - the session fixture

MODEL = "vit_tiny_patch16_224"
MAX_SIZE_RATIO = 0.35
QUANTIZED_LAYERS = 49  # 4 MatMuls per block x 12 and the head; the 24 attention MatMuls stay float


@pytest.fixture(scope="module")
def vit(zoo: ZooCache) -> ZooModel:  # noqa: F811 - the fixture above
    return zoo.get(MODEL)


def _compile(m: ZooModel, out: Path, mode: str, *extra: str) -> dict[str, Any]:
    args = ["compile", str(m.model), "-o", str(out), "--quantize", mode, "--emit", "onnx,mnn"]
    assert main([*args, "--inputs", str(m.inputs), *extra]) == 0
    manifest: dict[str, Any] = json.loads((out / "manifest.json").read_text())
    assert manifest["verification"]["passed"]
    assert {a["path"]: a["precision"] for a in manifest["artifacts"]} == {
        "model.onnx": mode,
        "model.mnn": mode,
    }
    assert len(manifest["quantization"]["layers"]) == QUANTIZED_LAYERS
    return manifest


def _cosines(m: ZooModel, out: Path) -> tuple[float, float, dict[str, np.ndarray], dict[str, np.ndarray]]:
    feeds = load_inputs(m.inputs)
    ref = run_onnxruntime(m.model, feeds)
    got_onnx = run_onnxruntime(out / "model.onnx", feeds)
    got_mnn = run_mnn(out / "model.mnn", feeds)
    cos_onnx = min(agreement(got_onnx[k], r).cosine for k, r in ref.items())
    cos_mnn = min(agreement(got_mnn[k], r).cosine for k, r in ref.items())
    return cos_onnx, cos_mnn, got_onnx, got_mnn


def test_int4w_gptq_onnx_and_mnn(vit: ZooModel, tmp_path: Path) -> None:
    out = tmp_path / "int4w"
    # the exact GELU: the two files then differ only where their integer levels would
    manifest = _compile(vit, out, "int4w", "--calib", str(vit.calib), "--mnn-gelu", "exact")
    assert manifest["quantization"]["rounding"] == "gptq"
    ratio = (out / "model.onnx").stat().st_size / vit.model.stat().st_size
    assert ratio <= MAX_SIZE_RATIO, ratio
    nodes = onnx.load(str(out / "model.onnx")).graph.node
    assert sum(n.op_type == "MatMulNBits" and n.domain == "com.microsoft" for n in nodes) == QUANTIZED_LAYERS
    cos_onnx, cos_mnn, got_onnx, got_mnn = _cosines(vit, out)
    assert cos_onnx >= 0.99, cos_onnx
    assert cos_mnn >= 0.99, cos_mnn
    for k, e in got_onnx.items():  # the same levels in both runtimes
        assert_close(got_mnn[k], e, rtol=0.0, atol=1e-5 * max(1.0, float(np.abs(e).max())), what=k)


def test_int8w_onnx_and_mnn(vit: ZooModel, tmp_path: Path) -> None:
    out = tmp_path / "int8w"
    manifest = _compile(vit, out, "int8w")
    assert manifest["quantization"]["rounding"] == "nearest"
    assert (out / "model.onnx").stat().st_size / vit.model.stat().st_size <= MAX_SIZE_RATIO
    cos_onnx, cos_mnn, _, _ = _cosines(vit, out)
    assert cos_onnx >= 0.999, cos_onnx
    assert cos_mnn >= 0.999, cos_mnn


def test_int4w_nearest_falls_back_to_int8(
    vit: ZooModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "int4w-nearest"
    manifest = _compile(vit, out, "int4w")
    q = manifest["quantization"]
    assert q["rounding"] == "nearest"
    fb = q["fallback"]
    int8 = ["/blocks/blocks.0/mlp/fc1/MatMul", "/blocks/blocks.0/mlp/fc2/MatMul", "/head/Gemm"]
    assert [e["node"] for e in fb["int8"]] == int8 and fb["float"] == []
    assert fb["cosine_all_quantized"] < 0.98 <= fb["cosine"]  # measured 0.97471 -> 0.98461
    assert sorted(layer["node"] for layer in q["layers"] if layer["bits"] == 8) == sorted(int8)
    assert "weight-only fallback: 3 int8 (/blocks/blocks.0/mlp/fc1/MatMul" in capsys.readouterr().out
    cos_onnx, cos_mnn, _, _ = _cosines(vit, out)
    assert min(cos_onnx, cos_mnn) >= 0.98, (cos_onnx, cos_mnn)


NLP = ("bert", "gpt2", "llama")


@pytest.mark.parametrize("name", NLP)
def test_int4w_nlp_with_quantized_embeddings(zoo: ZooCache, tmp_path: Path, name: str) -> None:  # noqa: F811
    m = zoo.get(name)
    out = tmp_path / name
    args = ["compile", str(m.model), "-o", str(out), "--quantize", "int4w", "--emit", "onnx,mnn"]
    extra = ["--calib", str(m.calib), "--weight-min-cosine", "0.99"]
    assert main([*args, "--inputs", str(m.inputs), *extra]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verification"]["passed"]
    ops = [n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node]
    assert ops.count("GatherBlockQuantized") == 1 and ops.count("MatMulNBits") >= 9
    ratio = (out / "model.onnx").stat().st_size / m.model.stat().st_size
    assert ratio <= MAX_SIZE_RATIO, ratio
    cos_onnx, cos_mnn, _, _ = _cosines(m, out)
    assert min(cos_onnx, cos_mnn) >= 0.99, (cos_onnx, cos_mnn)
