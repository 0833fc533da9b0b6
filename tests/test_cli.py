"""The kiln CLI end to end: compile, inspect, run, passes, opt; errors exit 2 and leave nothing behind."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.api import Pass, PassContext, PassResult, Rewriter, register_pass
from compiler.cli import main
from compiler.ir import Graph
from tests.conftest import MODELS
from tests.helpers.onnx_text import rand, text_model

ULTRA = MODELS / "ultraface_rfb320.onnx"
PPOCR = MODELS / "ppocr_mobile_v2_cls.onnx"


def kiln(*args: str | Path) -> int:
    return main([str(a) for a in args])


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_compile_writes_model_and_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    inputs = MODELS / "data" / "ultraface_rfb320.npz"
    assert kiln("compile", ULTRA, "-o", out, "--inputs", inputs) == 0
    assert tree(out) == ["manifest.json", "model.onnx"]
    man = json.loads((out / "manifest.json").read_text())
    assert man["inputs"] == [{"name": "input", "shape": [1, 3, 240, 320], "dtype": "float32"}]
    assert [o["name"] for o in man["outputs"]] == ["scores", "boxes"]
    art = man["artifacts"][0]
    assert art["kind"] == "onnx" and art["path"] == "model.onnx" and len(art["sha256"]) == 64
    ver = man["verification"]
    assert ver["reference"] == "onnxruntime" and ver["passed"]
    for o in ver["artifacts"][0]["outputs"]:
        assert o["max_rel"] <= 1e-4 and o["cosine"] >= 0.9999
    assert "fold-batchnorm" in json.dumps(man["options"]) or man["options"]["pipeline"] == "default"
    text = capsys.readouterr().out
    assert "scores" in text and "boxes" in text
    onnx.checker.check_model(str(out / "model.onnx"), full_check=True)


def test_compile_is_byte_identical(tmp_path: Path) -> None:
    args = ["--input-shape", "x=1x3x48x192"]
    assert kiln("compile", PPOCR, "-o", tmp_path / "a", *args) == 0
    assert kiln("compile", PPOCR, "-o", tmp_path / "b", *args) == 0
    for name in ("model.onnx", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def _expect_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str | Path], needle: str
) -> None:
    out = tmp_path / "out"
    before = tree(tmp_path)
    assert kiln(*args, "-o", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("kiln: error:") and needle in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert tree(tmp_path) == before  # nothing created, no temporary left behind


def test_truncated_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "trunc.onnx"
    bad.write_bytes(ULTRA.read_bytes()[: ULTRA.stat().st_size // 2])
    _expect_error(tmp_path, capsys, ["compile", bad], "trunc.onnx")


def test_random_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "noise.onnx"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _expect_error(tmp_path, capsys, ["compile", bad], "noise.onnx")


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(tmp_path, capsys, ["compile", tmp_path / "nope.onnx"], "nope.onnx")


def _unknown_op_model(path: Path) -> None:
    h = onnx.helper
    nodes = [
        h.make_node("Relu", ["x"], ["a"], name="relu"),
        h.make_node("FooBar", ["a"], ["b"], name="foo1"),
        h.make_node("FooBar", ["b"], ["c"], name="foo2"),
        h.make_node("Bazz", ["c"], ["y"], name="baz"),
    ]
    vi = [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in ("x", "y")]
    onnx.save(h.make_model(h.make_graph(nodes, "g", [vi[0]], [vi[1]])), path)


def test_unknown_op_lists_every_op_and_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "unk.onnx"
    _unknown_op_model(path)
    _expect_error(tmp_path, capsys, ["compile", path], "unk.onnx")
    assert kiln("compile", path, "-o", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert "FooBar" in err and "'foo1'" in err and "'foo2'" in err and "Bazz" in err and "'baz'" in err


@pytest.mark.parametrize("shape", ["x=1x3x48", "x=1x4x48x192", "y=1x3x48x192", "x=1x3x1x1", "x=1xAx2"])
def test_impossible_input_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: str) -> None:
    _expect_error(
        tmp_path, capsys, ["compile", PPOCR, "--input-shape", shape], "x" if shape[0] == "x" else "y"
    )


def test_bad_flags_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(tmp_path, capsys, ["compile", ULTRA, "--emit", "bogus"], "bogus")
    _expect_error(tmp_path, capsys, ["compile", ULTRA, "--passes", "no-such-pass"], "no-such-pass")
    with pytest.raises(SystemExit) as info:
        kiln("compile", ULTRA, "--no-such-flag")
    assert info.value.code == 2


@register_pass
@dataclasses.dataclass(frozen=True)
class _Scale2(Pass):
    """test-only: doubles the first output (a numerics bug verification must catch)."""

    name = "test-cli-scale2"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        with Rewriter(graph) as rw:
            out = graph.outputs[0]
            rw.replace(out, rw.op("Add", [out, out]))
        return rw.result


def test_verification_failure_exits_1_and_names_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = text_model("""g (float[4] x) => (float[4] y) { y = Relu(x) }""")
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    assert kiln("compile", path, "-o", tmp_path / "o", "--passes", "test-cli-scale2") == 1
    assert "output 'y'" in capsys.readouterr().err
    man = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert man["verification"]["passed"] is False


def test_inspect(capsys: pytest.CaptureFixture[str]) -> None:
    assert kiln("inspect", ULTRA) == 0
    text = capsys.readouterr().out
    assert "input: f32[1,3,240,320]" in text
    assert "BatchNormalization" in text and "Conv" in text
    assert "parameters:" in text


def test_run_artifact(tmp_path: Path) -> None:
    m = text_model("""g (float[4] x) => (float[4] y) { y = Relu(x) }""")
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    x = rand(4, seed=3)
    np.savez(tmp_path / "in.npz", x=x)
    assert kiln("run", path, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "y.npz") == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npz")["y"], np.maximum(x, 0))


def test_passes_and_opt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kiln("passes") == 0
    listing = capsys.readouterr().out
    for name in ("fold-constants", "fold-batchnorm", "fuse-conv-bias-act", "default"):
        assert name in listing
    dump = tmp_path / "ir"
    out = tmp_path / "o.onnx"
    assert (
        kiln(
            "opt",
            ULTRA,
            "--passes",
            "fold-batchnorm,eliminate-dead-nodes",
            "-o",
            out,
            "--dump-ir",
            dump,
            "--timing",
        )
        == 0
    )
    assert "fold-batchnorm" in capsys.readouterr().out
    assert sorted(p.name for p in dump.iterdir()) == [
        "00-input.txt",
        "01-fold-batchnorm.txt",
        "02-eliminate-dead-nodes.txt",
    ]
    model = onnx.load(out)
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)


def test_inspect_and_onnx_compile_do_not_import_tvm(tmp_path: Path) -> None:
    code = (
        "import sys; from compiler.cli import main; "
        f"assert main(['inspect', {str(ULTRA)!r}]) == 0; "
        f"assert main(['compile', {str(ULTRA)!r}, '-o', {str(tmp_path / 'o')!r}]) == 0; "
        "assert 'tvm' not in sys.modules, 'tvm was imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, cwd=Path(__file__).parents[1]
    )


def test_compile_dump_ir_and_timing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "ir"
    assert kiln("compile", ULTRA, "-o", tmp_path / "o", "--dump-ir", dump, "--timing", "--no-verify") == 0
    out = capsys.readouterr().out
    assert "fold-batchnorm" in out and "total" in out
    files = sorted(p.name for p in dump.iterdir())
    assert files[0] == "00-input.txt" and any("fuse-conv-bias-act" in f for f in files)
    assert "BatchNormalization" in (dump / files[0]).read_text()
    assert "BatchNormalization" not in (dump / files[-1]).read_text()
