"""The bundled digits example: trains for real, reaches >= 90% test accuracy, and is reproducible."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from examples.digits import train
from examples.digits.accuracy import evaluate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """Train once for the module: (output folder, float accuracy that main() reported)."""
    out = tmp_path_factory.mktemp("digits")
    return out, train.main(out)


def test_writes_the_example_files(trained: tuple[Path, float]) -> None:
    out, _ = trained
    with np.load(out / train.INPUTS_FILE) as d:
        assert d["image"].shape == (1, 1, 8, 8) and d["image"].dtype == np.float32
    with np.load(out / train.CALIB_FILE) as d:
        assert d["image"].shape == (64, 1, 1, 8, 8) and d["image"].dtype == np.float32
    with np.load(out / train.HOLDOUT_FILE) as d:
        s = d["label"].shape[0]
        assert s >= 300 and d["image"].shape == (s, 1, 1, 8, 8) and d["label"].dtype == np.int64


def test_model_keeps_batchnorm_nodes(trained: tuple[Path, float]) -> None:
    model = onnx.load(trained[0] / train.MODEL_FILE)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8 and [o.version for o in model.opset_import if o.domain == ""] == [13]
    assert [i.name for i in model.graph.input] == ["image"]
    assert [o.name for o in model.graph.output] == ["logits"]
    ops = [n.op_type for n in model.graph.node]
    block = ["Conv", "BatchNormalization", "Relu"]
    assert ops == [*block, *block, "Flatten", "Gemm"]


def test_float_accuracy_at_least_90_percent(trained: tuple[Path, float]) -> None:
    out, reported = trained
    accuracy = evaluate(out / train.MODEL_FILE, out / train.HOLDOUT_FILE)
    assert accuracy == reported
    assert accuracy >= 0.9


def test_cli_retrains_byte_identical_model(trained: tuple[Path, float], tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "examples.digits.train", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    first = (trained[0] / train.MODEL_FILE).read_bytes()
    assert (tmp_path / train.MODEL_FILE).read_bytes() == first
    with np.load(trained[0] / train.HOLDOUT_FILE) as a, np.load(tmp_path / train.HOLDOUT_FILE) as b:
        assert np.array_equal(a["image"], b["image"]) and np.array_equal(a["label"], b["label"])
