"""tests.helpers.cnn_models: valid opset-13 models that onnxruntime runs to finite, O(1) outputs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.runners import run_onnxruntime
from tests.helpers.cnn_models import CNN_MODELS, INPUT_SHAPE, mobilenet_v2, resnet18, save_cnn_models


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return save_cnn_models(tmp_path_factory.mktemp("cnn"))


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal(INPUT_SHAPE).astype(np.float32)}


def test_saved_models_pass_full_check(saved: dict[str, Path]) -> None:
    assert set(saved) == set(CNN_MODELS)
    for path in saved.values():
        onnx.checker.check_model(str(path), full_check=True)
        m = onnx.load(str(path))
        assert m.opset_import[0].version == 13
        assert [i.name for i in m.graph.input] == ["input"] and [o.name for o in m.graph.output] == ["logits"]


def test_resnet18_structure() -> None:
    ops = Counter(n.op_type for n in resnet18().graph.node)
    # 1 stem + 16 block convs + 3 downsample 1x1 convs, each with its BN; 8 residual adds
    assert ops["Conv"] == 20 and ops["BatchNormalization"] == 20 and ops["Add"] == 8
    assert ops["MaxPool"] == 1 and ops["GlobalAveragePool"] == 1 and ops["Gemm"] == 1


def test_mobilenet_v2_structure() -> None:
    m = mobilenet_v2()
    ops = Counter(n.op_type for n in m.graph.node)
    # stem + 17 blocks (16 with an expansion conv) x (dw + project) + expand convs + last 1x1
    assert ops["Conv"] == 1 + 16 + 17 * 2 + 1 and ops["Add"] == 10
    depthwise = [n for n in m.graph.node if n.op_type == "Conv" and any(a.i > 1 for a in n.attribute)]
    assert len(depthwise) == 17
    params = sum(int(np.prod(t.dims)) for t in m.graph.initializer)
    assert 3.4e6 < params < 3.6e6  # MobileNetV2 1.0 has 3.5 M parameters


@pytest.mark.parametrize("name", sorted(CNN_MODELS))
def test_onnxruntime_runs_with_o1_activations(saved: dict[str, Path], name: str) -> None:
    out = run_onnxruntime(saved[name], _feeds())["logits"]
    assert out.shape == (1, 1000) and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert 0.05 < float(out.std()) < 20.0, out.std()
    # deterministic: the same seed builds the same weights
    assert onnx.load(str(saved[name])).SerializeToString() == CNN_MODELS[name]().SerializeToString()
