"""The MegEngine frontend on every shared ``.mge`` fixture.

Numerics: each fixture is imported, exported to ONNX and run in onnxruntime, and
must match the outputs MegEngine itself computed (``*.expected.npy``): max abs
1e-4 for float models, one quantization step of the output (its scale) for
int8 models. The same holds after Kiln's default pipeline and in MNN's runtime.
The three fixtures without MegEngine outputs are checked against independent
numpy references. Also: structure (layouts, int8 weights), refusals of the old
and pickled formats, the CLI, and 1,000 fuzzed files that must fail cleanly.
"""

from __future__ import annotations

import json
import pickle
import signal
from collections import Counter
from pathlib import Path
from types import FrameType

import numpy as np
import pytest

from compiler.cli import main
from compiler.errors import KilnError, ModelFileError
from compiler.ir import Graph
from compiler.pipelines import pipeline
from frontends.megengine.loader import load_mge
from frontends.registry import detect_format
from tests.conftest import SHARED
from tests.helpers.numerics import assert_close
from tests.helpers.pass_check import op_counts, ort_graph, run_passes

MGE = SHARED / "reference" / "megengine" / "models"
WITH_EXPECTED = [
    "tiny_convbnrelu_v1_fbs",
    "tiny_convbnrelu_v2_nchw44",
    "tiny_convbnrelu_v2_nchw88",
    "tiny_convbnrelu_v2_noopt",
    "tiny_convbnrelu_v2_opt",
    "tiny_int8_v2",
    "tiny_int8_v2_nchw44",
]
INT8 = {"tiny_int8_v2", "tiny_int8_v2_nchw44"}
WITHOUT_EXPECTED = [
    "mgeconvert_convolution-backward-filter",
    "mgeconvert_test_model_reshape",
    "pywritten_convbias_pool_v2",
]
FLOAT_ATOL = 1e-4


def kiln(*args: str | Path) -> int:
    return main([str(a) for a in args])


def output_step(graph: Graph) -> float:
    """The quantization step of an int8 model's output: the scale of the DequantizeLinear producing it."""
    node = graph.outputs[0].producer
    assert node.op == "DequantizeLinear", node.describe()
    scale = graph.inputs_of(node)[1]
    assert scale is not None and scale.const is not None
    return float(scale.const)


def check_against_megengine(stem: str, graph: Graph) -> float:
    x = np.load(MGE / f"{stem}.input.npy")
    expected = np.load(MGE / f"{stem}.expected.npy")
    got = ort_graph(graph, {"data": x})
    assert list(got) == ["logits"]
    atol = output_step(graph) if stem in INT8 else FLOAT_ATOL
    return assert_close(got["logits"], expected, rtol=0.0, atol=atol, what=stem).max_abs


def test_fixture_set_is_covered(shared_dir: Path) -> None:
    assert MGE.is_dir(), f"{MGE} is missing"
    assert sorted(p.stem for p in MGE.glob("*.mge")) == sorted(WITH_EXPECTED + WITHOUT_EXPECTED)


@pytest.mark.parametrize("stem", WITH_EXPECTED)
def test_import_matches_megengine(stem: str) -> None:
    graph = load_mge(MGE / f"{stem}.mge")
    max_abs = check_against_megengine(stem, graph)
    if stem in INT8:
        assert max_abs == 0.0  # integer kernels emulated exactly (see frontends/megengine/quant.py)


@pytest.mark.parametrize("stem", WITH_EXPECTED)
def test_default_pipeline_matches_megengine(stem: str) -> None:
    graph = load_mge(MGE / f"{stem}.mge")
    run_passes(graph, pipeline("default"))
    check_against_megengine(stem, graph)
    assert op_counts(graph)["BatchNormalization"] == 0


@pytest.mark.parametrize("stem", WITH_EXPECTED)
def test_mnn_runtime_matches_megengine(stem: str, tmp_path: Path) -> None:
    """Float fixtures to FLOAT_ATOL; int8 fixtures (QDQ -> MNN FloatToInt8/Int8ToFloat) within one
    output quantization step (MNN may round a tie differently)."""
    from compiler.runners import run_artifact

    x = np.load(MGE / f"{stem}.input.npy")
    np.savez(tmp_path / "in.npz", data=x)
    assert (
        kiln(
            "compile",
            MGE / f"{stem}.mge",
            "-o",
            tmp_path / "o",
            "--emit",
            "mnn",
            "--inputs",
            tmp_path / "in.npz",
        )
        == 0
    )
    got = run_artifact(tmp_path / "o" / "model.mnn", {"data": x})
    atol = output_step(load_mge(MGE / f"{stem}.mge")) * 1.001 if stem in INT8 else FLOAT_ATOL
    assert_close(got["logits"], np.load(MGE / f"{stem}.expected.npy"), rtol=0.0, atol=atol, what=stem)


# ---------------------------------------------------------------- fixtures without MegEngine outputs
def conv2d(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """Cross-correlation in float64 (the reference for conv fixtures)."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride : i * stride + kh, j * stride : j * stride + kw]
            out[:, :, i, j] = np.tensordot(patch, w.astype(np.float64), axes=([1, 2, 3], [1, 2, 3]))
    return out


def test_pywritten_convbias_pool() -> None:
    """ConvBias(RELU) + max pool, written without MegEngine; weights in .W/.B.npy."""
    w, b = (
        np.load(MGE / "pywritten_convbias_pool_v2.W.npy"),
        np.load(MGE / "pywritten_convbias_pool_v2.B.npy"),
    )
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    y = np.maximum(conv2d(x, w, 1, 1) + b.reshape(1, -1, 1, 1), 0)
    expected = y.reshape(1, 8, 4, 2, 4, 2).max(axis=(3, 5))
    graph = load_mge(MGE / "pywritten_convbias_pool_v2.mge")
    got = ort_graph(graph, {"data": x})
    assert_close(next(iter(got.values())), expected, rtol=0.0, atol=FLOAT_ATOL)


def test_mgeconvert_reshape_chain() -> None:
    x = np.random.default_rng(1).standard_normal((1, 2, 3, 4)).astype(np.float32)
    graph = load_mge(MGE / "mgeconvert_test_model_reshape.mge")
    assert graph.metadata["megengine.format"] == "FBS_V1 (MGBS)"
    got = ort_graph(graph, {"data": x})
    np.testing.assert_array_equal(next(iter(got.values())), x.reshape(1, 2, 12))


def test_mgeconvert_convolution_backward_filter() -> None:
    """dW of sum(conv(x, W, stride 2, pad 1) + b) = correlation of x with an all-ones output gradient."""
    x = np.random.default_rng(2).standard_normal((8, 1, 32, 32)).astype(np.float32)
    graph = load_mge(MGE / "mgeconvert_convolution-backward-filter.mge")
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    dw = np.array([[xp[:, 0, i : i + 31 : 2, j : j + 31 : 2].sum() for j in range(3)] for i in range(3)])
    expected = np.broadcast_to(dw, (5, 1, 3, 3))
    got = next(iter(ort_graph(graph, {"arg_0": x}).values()))
    # Sums of 2048 products: tolerance relative to the output's magnitude.
    assert_close(got, expected, rtol=0.0, atol=FLOAT_ATOL * max(1.0, float(np.abs(expected).max())))


# ---------------------------------------------------------------- structure
def const_inputs(graph: Graph, op: str) -> list[np.ndarray]:
    """The weight (input 1) of every ``op`` node, through a DequantizeLinear if there is one."""
    out = []
    for node in graph.ops():
        if node.op != op:
            continue
        w = graph.inputs_of(node)[1]
        assert w is not None
        if w.producer.op == "DequantizeLinear":
            w = graph.inputs_of(w.producer)[0]
            assert w is not None
        assert w.const is not None
        out.append(w.const)
    return out


def test_op_counts() -> None:
    golden = {
        "tiny_convbnrelu_v2_noopt": {
            "Add": 2,
            "BatchNormalization": 1,
            "Conv": 1,
            "MatMul": 1,
            "MaxPool": 1,
            "Relu": 1,
            "Reshape": 1,
        },
        "tiny_convbnrelu_v2_opt": {"Add": 1, "MatMul": 1, "MaxPool": 1, "Reshape": 1, "kiln::FusedConv": 1},
        "tiny_convbnrelu_v1_fbs": {"Add": 1, "MatMul": 1, "MaxPool": 1, "Reshape": 1, "kiln::FusedConv": 1},
    }
    for stem, counts in golden.items():
        assert dict(op_counts(load_mge(MGE / f"{stem}.mge"))) == counts, stem


@pytest.mark.parametrize("blocked", ["tiny_convbnrelu_v2_nchw44", "tiny_convbnrelu_v2_nchw88"])
def test_blocked_weights_become_oihw(blocked: str) -> None:
    (plain,) = const_inputs(load_mge(MGE / "tiny_convbnrelu_v2_opt.mge"), "FusedConv")
    (conv,) = const_inputs(load_mge(MGE / f"{blocked}.mge"), "FusedConv")
    assert conv.shape == (8, 3, 3, 3)
    np.testing.assert_array_equal(conv, plain)


def test_int8_weights_stay_int8_constants() -> None:
    plain = const_inputs(load_mge(MGE / "tiny_int8_v2.mge"), "FusedConv")
    blocked = const_inputs(load_mge(MGE / "tiny_int8_v2_nchw44.mge"), "FusedConv")
    assert [w.shape for w in blocked] == [(8, 4, 3, 3), (8, 8, 3, 3)]
    for a, b in zip(plain, blocked, strict=True):
        assert a.dtype == b.dtype == np.int8
        np.testing.assert_array_equal(a, b)
    (fc,) = const_inputs(load_mge(MGE / "tiny_int8_v2.mge"), "MatMul")
    assert fc.dtype == np.int8 and fc.shape == (32, 10)  # MegEngine's [10, 32] with transposeB


def test_int8_scales_come_from_the_file() -> None:
    graph = load_mge(MGE / "tiny_int8_v2.mge")
    assert output_step(graph) == pytest.approx(0.0124632, rel=1e-5)
    scales = sorted(
        round(float(graph.inputs_of(n)[1].const), 7)  # type: ignore[union-attr, arg-type]
        for n in graph.ops()
        if n.op == "QuantizeLinear"
    )
    assert 0.023897 in [round(s, 6) for s in scales]  # TypeCvt of the input
    assert 0.0336221 in [round(s, 7) for s in scales]  # cbr1 ConvBias output dtype


def test_v1_and_v2_hold_the_same_model() -> None:
    v1, v2 = load_mge(MGE / "tiny_convbnrelu_v1_fbs.mge"), load_mge(MGE / "tiny_convbnrelu_v2_opt.mge")
    for op in ("FusedConv", "MatMul"):
        for a, b in zip(const_inputs(v1, op), const_inputs(v2, op), strict=True):
            np.testing.assert_array_equal(a, b)


def test_sniffed_without_suffix(tmp_path: Path) -> None:
    for stem in ("tiny_int8_v2", "tiny_convbnrelu_v1_fbs", "mgeconvert_test_model_reshape"):
        copy = tmp_path / f"{stem}.bin"
        copy.write_bytes((MGE / f"{stem}.mge").read_bytes())
        assert detect_format(copy) == "megengine"
        assert len(load_mge(copy).ops()) > 0


# ---------------------------------------------------------------- refusals and corrupt files
def refused(path: Path) -> str:
    with pytest.raises(ModelFileError) as info:
        load_mge(path)
    msg = str(info.value)
    assert path.name in msg
    return msg


def test_refuses_old_megbrain_format(tmp_path: Path) -> None:
    path = tmp_path / "old.mge"
    path.write_bytes(b"mgb0001" + bytes(range(256)) * 4)
    assert detect_format(path) == "megengine"
    assert "mgb0001" in refused(path) and "MegBrain" in refused(path)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_refuses_pickled_checkpoints(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "ckpt.mge"
    state = {"state_dict": {"conv.weight": np.zeros((8, 3, 3, 3), np.float32)}, "epoch": 3}
    path.write_bytes(pickle.dumps(state, protocol=protocol))
    assert "pickled MegEngine checkpoint" in refused(path)


@pytest.mark.parametrize("stem", ["tiny_int8_v2", "tiny_convbnrelu_v1_fbs", "mgeconvert_test_model_reshape"])
def test_truncated_files(tmp_path: Path, stem: str) -> None:
    data = (MGE / f"{stem}.mge").read_bytes()
    for cut in (0, 7, 20, len(data) // 2, len(data) - 1):
        path = tmp_path / f"cut{cut}.mge"
        path.write_bytes(data[:cut])
        msg = refused(path)
        assert "truncated" in msg or "not a MegEngine model" in msg, msg


def test_not_a_megengine_file(tmp_path: Path) -> None:
    path = tmp_path / "noise.mge"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert "not a MegEngine model" in refused(path)


# ---------------------------------------------------------------- CLI
def test_cli_inspect(capsys: pytest.CaptureFixture[str]) -> None:
    assert kiln("inspect", MGE / "tiny_int8_v2_nchw44.mge") == 0
    text = capsys.readouterr().out
    for needle in (
        "data: f32[1,4,8,8]",
        "logits: f32[1,10]",
        "kiln::FusedConv",
        "QuantizeLinear",
        "parameters:",
    ):
        assert needle in text, needle


@pytest.mark.parametrize("stem", ["tiny_convbnrelu_v2_noopt", "tiny_int8_v2"])
def test_cli_compile(tmp_path: Path, capsys: pytest.CaptureFixture[str], stem: str) -> None:
    x = np.load(MGE / f"{stem}.input.npy")
    np.savez(tmp_path / "in.npz", data=x)
    assert (
        kiln(
            "compile",
            MGE / f"{stem}.mge",
            "-o",
            tmp_path / "o",
            "--emit",
            "onnx",
            "--inputs",
            tmp_path / "in.npz",
        )
        == 0
    )
    man = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert man["source"]["format"] == "megengine"
    assert man["verification"]["reference"] == "onnxruntime (unoptimized import)"
    assert man["verification"]["passed"]
    assert "logits" in capsys.readouterr().out
    assert (
        kiln("run", tmp_path / "o" / "model.onnx", "--inputs", tmp_path / "in.npz", "-o", tmp_path / "y.npz")
        == 0
    )
    graph = load_mge(MGE / f"{stem}.mge")
    atol = output_step(graph) if stem in INT8 else FLOAT_ATOL
    assert_close(
        np.load(tmp_path / "y.npz")["logits"], np.load(MGE / f"{stem}.expected.npy"), rtol=0.0, atol=atol
    )


def test_cli_compile_is_byte_identical(tmp_path: Path) -> None:
    model = MGE / "tiny_int8_v2_nchw44.mge"
    for out in ("a", "b"):
        assert kiln("compile", model, "-o", tmp_path / out, "--emit", "onnx") == 0
    for name in ("model.onnx", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_cli_refusal_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ckpt.mge"
    path.write_bytes(pickle.dumps({"w": [1, 2, 3]}, protocol=4))
    assert kiln("compile", path, "-o", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert err.startswith("kiln: error:") and "ckpt.mge" in err and "checkpoint" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    assert kiln("inspect", path) == 2


# ---------------------------------------------------------------- fuzzing
FUZZ_CASES = 1000
CASE_LIMIT_S = 20.0  # a hang guard (SIGALRM), not a speed limit: a case takes milliseconds


class _Timeout(BaseException):
    """Raised by the per-case alarm; a BaseException so that no converter can swallow it."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Timeout


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """A byte flip, a truncation, an insertion or a 4-byte overwrite (offsets, sizes, enums)."""
    d = bytearray(data)
    kind = int(rng.integers(0, 4))
    if kind == 0:
        for _ in range(int(rng.integers(1, 9))):
            d[int(rng.integers(0, len(d)))] = int(rng.integers(0, 256))
    elif kind == 1:
        del d[int(rng.integers(0, len(d))) :]
    elif kind == 2:
        at = int(rng.integers(0, len(d) + 1))
        d[at:at] = rng.integers(0, 256, int(rng.integers(1, 17)), dtype=np.uint8).tobytes()
    else:
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, len(d) - 4))
            d[at : at + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
    return bytes(d)


def test_fuzzed_files_fail_cleanly(tmp_path: Path) -> None:
    """1,000 mutations of the fixtures: each a clean import or a KilnError, none hanging (alarm guard)."""
    seeds = [(MGE / f"{s}.mge").read_bytes() for s in sorted(WITH_EXPECTED + WITHOUT_EXPECTED)]
    rng = np.random.default_rng(20160701)
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for case in range(FUZZ_CASES):
            path = tmp_path / f"case{case % 8}.mge"
            path.write_bytes(mutate(seeds[case % len(seeds)], rng))
            signal.setitimer(signal.ITIMER_REAL, CASE_LIMIT_S)
            try:
                load_mge(path)
                outcomes["imported"] += 1
            except KilnError as exc:
                outcomes[type(exc).__name__] += 1
                assert str(exc), f"case {case}: empty message"
            except _Timeout:
                failures.append(f"case {case}: no result within {CASE_LIMIT_S} s")
            except Exception as exc:  # noqa: BLE001 - the point of the test
                failures.append(f"case {case}: {type(exc).__name__}: {exc}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert not failures, "\n".join(failures[:10])
    assert sum(outcomes.values()) == FUZZ_CASES
    # The mutations reach both the container checks and the converters.
    assert outcomes["imported"] > 50 and outcomes["ModelFileError"] > 300, outcomes
    assert outcomes["ConversionError"] + outcomes["UnsupportedOpsError"] > 10, outcomes
