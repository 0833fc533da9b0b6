"""The CLI never shows a traceback: internal errors are one line + a log file (exit 3); repeated
single-value flags exit 2; dynamic input dims come from --inputs / --calib samples."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest

import compiler.driver
import passes.fold_batchnorm
from backends.onnx.backend import OnnxBackend
from compiler.cli import main
from tests.conftest import MODELS

ULTRA = MODELS / "ultraface_rfb320.onnx"
PPOCR = MODELS / "ppocr_mobile_v2_cls.onnx"
LINE = re.compile(r"^kiln: internal error in (\w+) \((.*)\): (.*) \[traceback in (\S+\.log)\]$")


def kiln(*args: str | Path) -> int:
    return main([str(a) for a in args])


def _internal_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> re.Match[str]:
    """Compile ULTRA expecting exit 3; returns the parsed stderr line after checking the log and that
    nothing was written (the output dir stays absent, no temporary is left, the log is elsewhere)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    work = tmp_path / "work"
    work.mkdir()
    assert kiln("compile", ULTRA, "-o", work / "out") == 3
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    m = LINE.match(lines[0])
    assert m, lines[0]
    log = Path(m.group(4))
    assert log.parent == logs and log.is_file()
    text = log.read_text()
    assert (
        "Traceback (most recent call last)" in text
        and lines[0][len("kiln: ") : m.start(4) - len(" [traceback in ")] in text
    )
    assert list(work.iterdir()) == []  # no OUTDIR, no temporary sibling
    return m


def test_exception_in_a_pass_names_stage_pass_and_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(self: object, rw: object, m: object) -> None:
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(passes.fold_batchnorm.ConvBN, "rewrite", boom)
    m = _internal_error(tmp_path, capsys, monkeypatch)
    assert m.group(1) == "optimize"
    assert m.group(2).startswith("pass 'fold-batchnorm', node BatchNormalization")
    assert m.group(3) == "ZeroDivisionError: injected"
    assert "in boom" in Path(m.group(4)).read_text()


def test_exception_in_an_emit_names_the_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise KeyError("no such tensor")

    monkeypatch.setattr(OnnxBackend, "emit", broken)
    m = _internal_error(tmp_path, capsys, monkeypatch)
    assert (m.group(1), m.group(2), m.group(3)) == ("emit", "backend onnx", "KeyError: 'no such tensor'")


def test_exception_in_the_import_verifier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(graph: object) -> None:
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(compiler.driver, "verify", broken)
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    assert kiln("compile", ULTRA, "-o", tmp_path / "out") == 3
    err = capsys.readouterr().err
    assert err.startswith("kiln: internal error in verify: RuntimeError: first line [traceback in "), err
    assert len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "name"),
    [
        (["--seed", "1", "--seed", "2"], "--seed"),
        (["-o", "{out}", "--output", "{out}2"], "-o/--output"),
        (["--quantize", "int8", "--quantize", "fp16"], "--quantize"),
        (["--pipeline", "default", "--pipeline", "exact"], "--pipeline"),
        (["--inputs", "a.npz", "--inputs", "b.npz"], "--inputs"),
    ],
)
def test_repeated_single_value_flag_exits_2(
    flags: list[str], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [f.format(out=tmp_path / "o") for f in flags]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as info:
        kiln("compile", ULTRA, *args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"kiln: error: kiln compile: {name} is given more than once (it takes one value)\n"
    assert list(tmp_path.iterdir()) == []


def test_repeatable_flags_still_accumulate(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert (
        kiln("compile", PPOCR, "-o", out, "--input-shape", "x=1x3x48x192", "--input-shape", "x=1x3x48x192")
        == 0
    )
    assert kiln("opt", ULTRA, "-o", tmp_path / "m.onnx", "--passes", "fold-constants") == 0


def test_dynamic_input_shape_comes_from_inputs(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert kiln("compile", PPOCR, "-o", out, "--inputs", MODELS / "data" / "ppocr_mobile_v2_cls.npz") == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["inputs"][0]["shape"] == [1, 3, 48, 192]
    assert man["input_shapes_from"] == {"file": "ppocr_mobile_v2_cls.npz", "shapes": {"x": [1, 3, 48, 192]}}
    assert man["verification"]["passed"]


def test_dynamic_input_shape_comes_from_calibration_samples(tmp_path: Path) -> None:
    out = tmp_path / "o"
    calib = MODELS / "data" / "ppocr_mobile_v2_cls.calib.npz"  # [16, 1, 3, 48, 192]: a stack of samples
    args: list[str | Path] = [
        "--quantize",
        "int8",
        "--calib",
        calib,
        "--calib-count",
        "2",
        "--no-sensitivity",
    ]
    assert kiln("compile", PPOCR, "-o", out, *args) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["inputs"][0]["shape"] == [1, 3, 48, 192]
    assert man["input_shapes_from"]["file"] == "ppocr_mobile_v2_cls.calib.npz"


def test_dynamic_input_without_samples_still_asks_for_a_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kiln("compile", PPOCR, "-o", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert "--input-shape x=" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_constant_gather_out_of_range_is_a_model_error_naming_the_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Constant indices outside the table (a broken model; onnxruntime refuses it at run time) are
    exit 2 naming the node, not an internal error from constant folding; nothing is written."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.zeros((32, 4), np.float32), "table")
    idx = numpy_helper.from_array(np.array([3, 40], np.int64), "idx")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "idx"], ["g"], name="bias_gather"),
            helper.make_node("Add", ["x", "g"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [table, idx],
    )
    path = tmp_path / "broken.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    out = tmp_path / "o"
    assert kiln("compile", path, "-o", out, "--no-verify") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1]
        == "kiln: error: node 'bias_gather' (Gather): indices out of range [-32, 31] on its constant inputs"
    )
    assert not out.exists()


def test_source_model_that_onnxruntime_cannot_run_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reference run failing on the source (here an index past the table in --inputs) is the
    model's or the inputs' fault: one line naming the file and onnxruntime's reason, exit 2."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"])],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.zeros((8, 4), np.float32), "table")],
    )
    path = tmp_path / "lookup.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    np.savez(tmp_path / "ids.npz", ids=np.array([1, 40], np.int64))
    out = tmp_path / "o"
    assert kiln("compile", path, "-o", out, "--inputs", tmp_path / "ids.npz") == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "kiln: error: lookup.onnx: onnxruntime cannot run the source model on the verification inputs ("
    )
    assert err.endswith("; --no-verify skips the check\n") and err.count("\n") == 1
    assert not out.exists()
