"""`kiln compile --quantize fp16` on every shared model: an fp16 ONNX model onnxruntime runs, verified."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from compiler.cli import main
from tests.conftest import MODEL_STEMS, MODELS

SHAPES = {"ppocr_mobile_v2_cls": ["--input-shape", "x=1x3x48x192"]}


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_fp16_compile(stem: str, tmp_path: Path) -> None:
    out = tmp_path / "o"
    args = ["compile", str(MODELS / f"{stem}.onnx"), "-o", str(out), "--quantize", "fp16"]
    args += ["--inputs", str(MODELS / "data" / f"{stem}.npz"), *SHAPES.get(stem, [])]
    assert main(args) == 0
    man = json.loads((out / "manifest.json").read_text())
    art = man["verification"]["artifacts"][0]
    assert art["precision"] == "fp16" and art["passed"]
    for o in art["outputs"]:
        assert o["cosine"] >= 0.999 and o["sqnr_db"] >= 30.0, o
    model = onnx.load(out / "model.onnx")
    sizes = {onnx.TensorProto.FLOAT16: 0, onnx.TensorProto.FLOAT: 0}
    for init in model.graph.initializer:
        if init.data_type in sizes:
            n = 1
            for d in init.dims:
                n *= d
            sizes[init.data_type] += n
    assert sizes[onnx.TensorProto.FLOAT16] >= 0.9 * (
        sizes[onnx.TensorProto.FLOAT16] + sizes[onnx.TensorProto.FLOAT]
    )
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [onnx.TensorProto.FLOAT]
