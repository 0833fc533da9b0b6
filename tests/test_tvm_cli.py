"""`kiln compile --target`, `kiln run` on a library and `kiln bench`: results, JSON and errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.cli import main
from compiler.runners import run_onnxruntime
from tests.helpers.models import conv_bn_relu
from tests.helpers.numerics import assert_close


def kiln(*args: str | Path) -> int:
    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("tvm_cli")
    model = d / "m.onnx"
    onnx.save(conv_bn_relu(), model)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.savez(d / "x.npz", x=x)
    assert kiln("compile", model, "--target", "cpu", "-o", d / "out", "--inputs", d / "x.npz") == 0
    return model, d / "x.npz", d / "out"


def test_compile_target_writes_library_metadata_and_manifest(built: tuple[Path, Path, Path]) -> None:
    _, _, out = built
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "cpu",
        "cpu/model.json",
        "cpu/model.so",
        "manifest.json",
    ]
    man = json.loads((out / "manifest.json").read_text())
    (art,) = man["artifacts"]
    assert (art["kind"], art["target"], art["path"]) == ("tvm", "cpu", "cpu/model.so")
    assert man["options"]["targets"] == ["cpu"] and man["verification"]["passed"]
    assert art["details"]["layouts"][0]["data_layout"] == "NCHW3c"


def test_run_library_matches_onnxruntime(built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    model, x, out = built
    assert kiln("run", out / "cpu" / "model.so", "--inputs", x, "-o", tmp_path / "y.npz") == 0
    got = dict(np.load(tmp_path / "y.npz"))
    ref = run_onnxruntime(model, dict(np.load(x)))
    assert_close(got["y"], ref["y"], rtol=1e-4, atol=1e-5)


def test_bench_json_with_vs(built: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    model, x, out = built
    capsys.readouterr()
    lib = out / "cpu" / "model.so"
    assert kiln("bench", lib, "--inputs", x, "--vs", model, "--rounds", "3", "--threads", "1", "--json") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["threads"] == 1 and rep["rounds"] == 3 and rep["median_ms"] > 0
    assert rep["ratio_vs"] == pytest.approx(rep["median_ms"] / rep["ort_median_ms"], rel=1e-6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "sparc"], "--target 'sparc': unknown target"),
        (["--target", "cuda:sm_5x"], "CUDA arch must look like sm_80"),
    ],
)
def test_bad_target_exits_2_and_writes_nothing(
    built: tuple[Path, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    model, _, _ = built
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(kiln("compile", model, "-o", tmp_path / "o", *args))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "o").exists()


def test_wrong_input_shape_to_library_exits_2(
    built: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, out = built
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 3, 8, 8), np.float32))
    code = kiln("run", out / "cpu" / "model.so", "--inputs", tmp_path / "bad.npz", "-o", tmp_path / "y.npz")
    assert code == 2
    assert "input 'x' has shape 1x3x8x8" in capsys.readouterr().err
    assert not (tmp_path / "y.npz").exists()
