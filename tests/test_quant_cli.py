"""``kiln compile --quantize int8`` flags end to end: scales round trip, determinism, keep-float, types, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from compiler.cli import main
from tests.conftest import MODELS
from tests.helpers.quant_reference import run_samples, sqnr_db

YUNET = MODELS / "yunet_n_320.onnx"
CALIB = MODELS / "data" / "yunet_n_320.calib.npz"
REAL = MODELS / "data" / "yunet_n_320.npz"
FAST = ["--calib-count", "4", "--no-verify", "--no-sensitivity"]


def kiln(*args: str | Path) -> int:
    return main([str(a) for a in args])


def compile_int8(out: Path, *extra: str | Path, fast: list[str] = FAST) -> Path:
    """yunet in int8 from 4 calibration samples; returns the output folder."""
    assert kiln("compile", YUNET, "-o", out, "--quantize", "int8", "--calib", CALIB, *fast, *extra) == 0
    return out


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def weight_dqs(path: Path) -> list[tuple[onnx.NodeProto, dict[str, np.ndarray]]]:
    """DequantizeLinear nodes of int8 constants (weights), with the initializers."""
    model = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return [
        (n, inits)
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].dtype == np.int8
    ]


def float_nodes(out: Path) -> dict[str, str]:
    return dict(json.loads((out / "manifest.json").read_text())["quantization"]["float_nodes"])


@pytest.mark.parametrize("method", ["minmax", "percentile"])
def test_scales_file_round_trip_is_byte_identical(tmp_path: Path, method: str) -> None:
    first = compile_int8(tmp_path / "a", "--calib-method", method)
    scales = first / "scales.json"
    doc = json.loads(scales.read_text())
    assert doc["format"] == "kiln-scales" and doc["activations"] and doc["weights"]
    again = tmp_path / "b"
    assert kiln("compile", YUNET, "-o", again, "--quantize", "int8", "--scales", scales, *FAST[2:]) == 0
    assert (again / "model.onnx").read_bytes() == (first / "model.onnx").read_bytes()


def test_int8_artifacts_are_byte_identical_across_runs(tmp_path: Path) -> None:
    with_report = ["--calib-count", "4", "--inputs", str(REAL)]  # verified, with the sensitivity report
    a = compile_int8(tmp_path / "a", "--calib-method", "percentile", fast=with_report)
    b = compile_int8(tmp_path / "b", "--calib-method", "percentile", fast=with_report)
    assert tree(a) == tree(b) and {"manifest.json", "model.onnx", "scales.json"} <= set(tree(a))
    for name in tree(a):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_keep_float_by_name_op_and_regex(tmp_path: Path) -> None:
    out = compile_int8(
        tmp_path / "o", "--keep-float", "Conv_0", "--keep-float", "Resize", "--keep-float", "Conv_1[0-9]"
    )
    kept = float_nodes(out)
    assert kept["Conv_0"] == "kept float by --keep-float 'Conv_0'"
    assert {k for k, v in kept.items() if "'Resize'" in v} == {"Resize_43", "Resize_49"}
    assert {k for k, v in kept.items() if "'Conv_1[0-9]'" in v} == {
        f"Conv_{i}" for i in (10, 12, 13, 15, 16, 19)
    }
    model = onnx.load(str(out / "model.onnx"))
    inits = {t.name for t in model.graph.initializer}
    convs = {n.name: n for n in model.graph.node if n.op_type == "Conv"}
    prod = {o: n for n in model.graph.node for o in n.output}
    assert convs["Conv_0"].input[1] in inits, "a kept-float conv keeps its float weight"
    assert prod[convs["Conv_2"].input[1]].op_type == "DequantizeLinear", "other convs stay int8"


def test_activation_type_int8_is_symmetric(tmp_path: Path) -> None:
    out = compile_int8(tmp_path / "o", "--activation-type", "int8")
    model = onnx.load(str(out / "model.onnx"))
    inits = initializers(out / "model.onnx")
    qs = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert qs
    for n in qs:
        zp = inits[n.input[2]]
        assert zp.dtype == np.int8 and int(zp) == 0, n.name
    feeds = [dict(np.load(REAL))]
    ref, got = run_samples(YUNET, feeds), run_samples(out / "model.onnx", feeds)
    assert sqnr_db(got["cls_8"], ref["cls_8"]) > 20.0


def test_per_tensor_weights(tmp_path: Path) -> None:
    per_channel = weight_dqs(compile_int8(tmp_path / "pc") / "model.onnx")
    assert any(inits[n.input[1]].ndim == 1 for n, inits in per_channel)
    out = compile_int8(tmp_path / "pt", "--per-tensor-weights")
    dqs = weight_dqs(out / "model.onnx")
    assert dqs
    for n, inits in dqs:
        assert inits[n.input[1]].ndim == 0 and not any(a.name == "axis" for a in n.attribute), n.name
    assert json.loads((out / "manifest.json").read_text())["quantization"]["options"]["per_channel"] is False


def _expect_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str | Path], *needles: str
) -> str:
    out = tmp_path / "out"
    before = tree(tmp_path)
    assert kiln("compile", YUNET, "-o", out, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("kiln: error:") and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    assert tree(tmp_path) == before  # nothing written, no temporary left behind
    return err


def test_quantize_without_calib_or_scales(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(tmp_path, capsys, ["--quantize", "int8"], "--calib", "--scales")


def test_corrupt_scales_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken_scales.json"
    bad.write_text('{"format": "kiln-scales", "activations": {"input": {"scale": ')
    _expect_error(tmp_path, capsys, ["--quantize", "int8", "--scales", bad], "broken_scales.json")
    bad.write_text('{"format": "kiln-scales", "activations": {"input": {"scale": 0.1}}}')
    _expect_error(tmp_path, capsys, ["--quantize", "int8", "--scales", bad], "broken_scales.json")


def test_scales_file_missing_an_activation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    partial = tmp_path / "partial.json"
    partial.write_text('{"format": "kiln-scales", "version": 1, "activations": {}, "weights": {}}')
    _expect_error(tmp_path, capsys, ["--quantize", "int8", "--scales", partial], "partial.json", "input")


def test_calib_with_wrong_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = tmp_path / "wrong_key.npz"
    with np.load(CALIB) as z:
        np.savez(wrong, image=z["input"][:2])
    _expect_error(tmp_path, capsys, ["--quantize", "int8", "--calib", wrong], "wrong_key.npz", "'input'")


def test_calib_without_quantize(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(tmp_path, capsys, ["--calib", CALIB], "--calib", "--quantize")
