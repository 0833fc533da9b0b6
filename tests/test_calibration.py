"""Calibration: observers against onnxruntime's calibrators, data loading, method parsing, progress."""

from __future__ import annotations

import io
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator
from onnxruntime.quantization.quant_utils import compute_scale_zp

from compiler.calibration import CalibMethod, Progress, load_calibration, parse_calib_method, parse_preprocess
from compiler.calibration.histogram import bin_counts, uniform_edges
from compiler.calibration.observers import HistogramObserver, Observer, channel_minmax, make_observer
from compiler.calibration.qparams import compute_scale_zero_point, qrange
from compiler.errors import InputShapeError, ModelFileError, OptionError
from compiler.ir.types import DType, TensorType
from tests.conftest import MODELS

TENSORS = ("x", "c", "y")  # Conv input, Conv output (signed), Relu output (>= 0)


@pytest.fixture(scope="module")
def conv_relu(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """A Conv + Relu model's path, and each sample's (x, c, y), with scales that grow and shrink."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "W")
    b = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "B")
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "conv_relu",
        [vi("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [vi("y", TensorProto.FLOAT, [1, 8, 32, 32])],
        [w, b],
        value_info=[vi("c", TensorProto.FLOAT, [1, 8, 32, 32])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("calib") / "conv_relu.onnx"
    onnx.save(model, path)
    model.graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as ORT's calibrator does
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    acts = []
    for scale, shift in [(0.5, 0.0), (1.0, 0.2), (2.0, -0.1), (0.3, 0.0), (3.0, 0.5), (1.0, 0.0)]:
        x = (rng.standard_normal((1, 3, 32, 32)) * scale + shift).astype(np.float32)
        y, c = sess.run(["y", "c"], {"x": x})
        acts.append({"x": x, "c": c, "y": y})
    return path, acts


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _observe(method: CalibMethod, arrays: list[np.ndarray]) -> Observer:
    obs = make_observer(method)
    for p in range(obs.passes):
        if p:
            obs.next_pass()
        for a in arrays:
            obs.update(a)
    return obs


ORT_CASES = [  # (ORT method, ORT extra_options, the same method in Kiln)
    (CalibrationMethod.MinMax, {}, CalibMethod("minmax")),
    (CalibrationMethod.MinMax, {"symmetric": True}, CalibMethod("minmax", symmetric_range=True)),
    (CalibrationMethod.MinMax, {"moving_average": True}, CalibMethod("minmax", moving_average=True)),
    (CalibrationMethod.Percentile, {}, CalibMethod("percentile")),
    (CalibrationMethod.Percentile, {"percentile": 99.9}, CalibMethod("percentile", percentile=99.9)),
    (
        CalibrationMethod.Percentile,
        {"symmetric": False, "percentile": 99.0},
        CalibMethod("percentile", percentile=99.0, symmetric_range=False),
    ),
    (CalibrationMethod.Entropy, {}, CalibMethod("entropy-ort")),
    (CalibrationMethod.Entropy, {"num_bins": 512}, CalibMethod("entropy-ort", num_bins=512)),
]


@pytest.mark.parametrize("streaming", [False, True], ids=["all-at-once", "per-sample"])
@pytest.mark.parametrize(("ort_method", "extra", "method"), ORT_CASES, ids=lambda v: str(v)[:40])
def test_ranges_equal_onnxruntime(conv_relu, tmp_path, capsys, ort_method, extra, method, streaming) -> None:
    """Bit-exact: quantize_static's single collect_data call, or one call per sample (merged histograms)."""
    path, acts = conv_relu
    cal = create_calibrator(
        path, None, str(tmp_path / "aug.onnx"), calibrate_method=ort_method, extra_options=extra
    )
    feeds = [{"x": a["x"]} for a in acts]
    for chunk in [[f] for f in feeds] if streaming else [feeds]:
        cal.collect_data(_Reader(chunk))
    expected = cal.compute_data()
    capsys.readouterr()
    for name in TENSORS:
        obs = _observe(replace(method, streaming=streaming), [a[name] for a in acts])
        want = tuple(float(np.asarray(v).reshape(-1)[0]) for v in expected[name].range_value)
        assert obs.calibrated_range() == want, name
        if isinstance(obs, HistogramObserver):  # ORT's percentile keeps only the first two counts
            got = obs.histogram()
            want_hist = (got.hist, got.edges) if method.name == "entropy-ort" else tuple(got.hist[:2])
            np.testing.assert_array_equal(want_hist[0], expected[name].hist)
            np.testing.assert_array_equal(want_hist[1], expected[name].bins)


def test_entropy_ort_defaults_are_minmax_and_streaming_differs(conv_relu) -> None:
    """With 128 bins and 128 levels the KL search has one candidate; merged histograms grow and clip."""
    arrays = [a["c"] for a in conv_relu[1]]
    minmax = _observe(CalibMethod("minmax"), arrays).calibrated_range()
    assert _observe(CalibMethod("entropy-ort"), arrays).calibrated_range() == minmax
    lo, hi = _observe(CalibMethod("entropy-ort", streaming=True), arrays).calibrated_range()
    assert minmax[0] < lo < 0 < hi < minmax[1]


@pytest.mark.parametrize(
    ("rmin", "rmax"),
    [(0.0, 0.0), (-1.5, 3.25), (0.2, 5.0), (-4.0, -1.0), (-1e-3, 2e-3), (0.0, 1e-40), (3.5, 3.5)],
)
@pytest.mark.parametrize(
    ("dtype", "symmetric"), [(DType.UINT8, False), (DType.INT8, True), (DType.INT8, False)]
)
def test_scale_zero_point_equal_onnxruntime(rmin, rmax, dtype, symmetric) -> None:
    qmin, qmax = qrange(dtype, symmetric=symmetric)
    zp, scale = compute_scale_zp(
        np.float32(rmin),
        np.float32(rmax),
        np.array(qmin, dtype.numpy),
        np.array(qmax, dtype.numpy),
        symmetric,
    )
    got_scale, got_zp = compute_scale_zero_point(rmin, rmax, qmin, qmax, symmetric=symmetric)
    assert got_scale.dtype == np.float32 and got_scale == scale and got_zp == int(zp)


ALL_METHODS = [
    CalibMethod(n, streaming=s) for n in ("minmax", "percentile", "entropy-ort", "mse") for s in (False, True)
] + [CalibMethod("entropy"), CalibMethod("auto")]


@pytest.mark.parametrize(
    "method", ALL_METHODS, ids=lambda m: f"{m.name}-{'stream' if m.streaming else 'batch'}"
)
@pytest.mark.parametrize("value", [0.0, 3.5, -2.0])
def test_zero_and_constant_tensors_give_usable_ranges(method, value) -> None:
    obs = _observe(method, [np.full((2, 3, 4), value, np.float32)] * 3)
    for symmetric, (qmin, qmax) in ((False, (0, 255)), (True, (-127, 127))):
        rmin, rmax = obs.range(symmetric=symmetric)
        assert np.isfinite([rmin, rmax]).all() and rmin <= min(value, 0) <= max(value, 0) <= rmax
        scale, zp = compute_scale_zero_point(rmin, rmax, qmin, qmax, symmetric=symmetric)
        assert scale > 0 and qmin <= zp <= qmax
        if value == 0:  # onnxruntime's fallback for an all-zero range: scale 1, zero point 0
            assert (scale, zp) == (1.0, 0)
        if symmetric:
            assert rmin == -rmax


@pytest.mark.parametrize(
    "method", ALL_METHODS, ids=lambda m: f"{m.name}-{'stream' if m.streaming else 'batch'}"
)
def test_deterministic(conv_relu, method) -> None:
    arrays = [a["c"] for a in conv_relu[1]]
    first = [_observe(method, arrays).range(symmetric=s) for s in (False, True)]
    assert first == [_observe(method, [a.copy() for a in arrays]).range(symmetric=s) for s in (False, True)]


def _quant_mse(x: np.ndarray, rng: tuple[float, float], symmetric: bool) -> float:
    qmin, qmax = (-127, 127) if symmetric else (0, 255)
    s, z = compute_scale_zero_point(*rng, qmin, qmax, symmetric=symmetric)
    q = np.clip(np.round(x / s) + z, qmin, qmax)
    return float(np.mean((s * (q - z) - x) ** 2))


@pytest.mark.parametrize("symmetric", [False, True])
def test_mse_range_is_near_the_best_clipping(symmetric) -> None:
    """The measured error of mse's range is within 5% of a brute-force scan of the upper bound."""
    rng = np.random.default_rng(3)
    samples = [rng.standard_t(4, 20000).astype(np.float32) for _ in range(4)]
    for s in samples:
        s[s < 0] *= 0.3  # skewed, heavy-tailed
    samples[1][::7] = 0.0  # exact zeros cost nothing
    data = np.concatenate(samples)
    lo, hi = _observe(CalibMethod("mse"), samples).range(symmetric=symmetric)
    minmax = _observe(CalibMethod("minmax"), samples).range(symmetric=symmetric)
    got = _quant_mse(data, (lo, hi), symmetric)
    best = min(
        _quant_mse(data, (-b if symmetric else lo, b), symmetric) for b in np.linspace(1, minmax[1], 300)
    )
    assert got <= 1.05 * best and got < _quant_mse(data, minmax, symmetric)
    assert lo == -hi if symmetric else lo < 0 < hi < minmax[1]


def test_pass_protocol_errors() -> None:
    obs = make_observer(CalibMethod("percentile"))
    assert obs.passes == 2
    with pytest.raises(RuntimeError, match="next_pass"):
        obs.next_pass()
    obs.update(np.ones(4, np.float32))
    with pytest.raises(RuntimeError, match="2 passes"):
        obs.range(symmetric=False)
    obs.next_pass()
    with pytest.raises(RuntimeError, match="different data"):
        obs.range(symmetric=False)
    with pytest.raises(RuntimeError, match="too often"):
        obs.next_pass()


def test_channel_minmax_and_per_channel_scales() -> None:
    w = np.random.default_rng(0).standard_normal((6, 3, 2, 2)).astype(np.float32)
    mins, maxs = channel_minmax(w, axis=0)
    np.testing.assert_array_equal(mins, w.reshape(6, -1).min(axis=1))
    np.testing.assert_array_equal(channel_minmax(w, axis=-3)[1], w.max(axis=(0, 2, 3)))
    scales, zps = compute_scale_zero_point(mins, maxs, -127, 127, symmetric=True)
    for c in range(6):
        zp, scale = compute_scale_zp(mins[c], maxs[c], np.array(-127, np.int8), np.array(127, np.int8), True)
        assert scales[c] == scale and zps[c] == zp == 0


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 3000), st.floats(-3, 0), st.floats(1e-3, 3), st.integers(0, 2**32 - 1), st.booleans())
def test_bin_counts_equal_numpy(n, lo, hi, seed, absolute) -> None:
    rng = np.random.default_rng(seed)
    edges = uniform_edges(np.float32(lo), np.float32(hi), n)
    x = np.concatenate(
        [
            rng.uniform(lo - 0.5, hi + 0.5, 5000),
            np.zeros(100),
            edges,
            np.nextafter(edges, np.float32(np.inf)),
            np.nextafter(edges, np.float32(-np.inf)),
            [np.nan, np.inf],
        ]
    ).astype(np.float32)
    f32_range = (np.float32(lo), np.float32(hi))  # float32 ends, as onnxruntime passes them
    want = np.histogram(np.abs(x) if absolute else x, n, range=f32_range)[0]  # type: ignore[arg-type]
    np.testing.assert_array_equal(bin_counts(x, edges, absolute=absolute), want)


@pytest.mark.parametrize(
    ("text", "name", "pct"),
    [
        ("minmax", "minmax", 99.999),
        (" Entropy ", "entropy", 99.999),
        ("entropy-ORT", "entropy-ort", 99.999),
        ("auto", "auto", 99.999),
        ("mse", "mse", 99.999),
        ("percentile", "percentile", 99.999),
        ("percentile=99.99", "percentile", 99.99),
    ],
)
def test_parse_calib_method(text, name, pct) -> None:
    m = parse_calib_method(text)
    assert (m.name, m.percentile) == (name, pct) and parse_calib_method(m.spec()) == m


@pytest.mark.parametrize(
    "text",
    [
        "",
        "kl",
        "percentile=",
        "percentile=abc",
        "percentile=0",
        "percentile=101",
        "percentile=nan",
        "minmax=3",
        "entropy=1",
        "auto=mse",
    ],
)
def test_parse_calib_method_rejects(text) -> None:
    with pytest.raises(OptionError, match=r"--calib-method"):
        parse_calib_method(text)


F32 = TensorType(DType.FLOAT32, (1, 3, 4, 5))


def test_load_shared_calibration_npz() -> None:
    path = MODELS / "data" / "ppocr_mobile_v2_cls.calib.npz"
    types = {"x": TensorType(DType.FLOAT32, ("N", 3, "H", "W"))}  # symbolic dims accept any size
    samples = load_calibration(path, types)
    assert len(samples) == 16 and samples[0]["x"].shape == (1, 3, 48, 192)
    np.testing.assert_array_equal(samples[15]["x"], np.load(path)["x"][15])
    few = load_calibration(path, types, count=5)
    assert len(few) == 5 and all(np.array_equal(a["x"], b["x"]) for a, b in zip(few, samples, strict=False))


def test_load_npy_folder_order_and_cast(tmp_path) -> None:
    data = np.arange(5 * 60, dtype=np.float64).reshape(5, 1, 3, 4, 5)
    np.save(tmp_path / "b.npy", data[2:])  # a stack of 3
    np.savez(tmp_path / "a.npz", inp=data[:2])  # a stack of 2
    (tmp_path / "notes.txt").write_text("ignored")
    samples = load_calibration(tmp_path, {"inp": F32})
    assert [s["inp"].dtype for s in samples] == [np.float32] * 5
    np.testing.assert_array_equal(np.stack([s["inp"] for s in samples]), data.astype(np.float32))
    np.save(tmp_path / "c.npy", data[0])  # one sample, no stack axis
    assert len(load_calibration(tmp_path, {"inp": F32})) == 6
    assert len(load_calibration(tmp_path / "b.npy", {"inp": F32}, count=2)) == 2


STACK = np.zeros((2, 1, 3, 4, 5))


@pytest.mark.parametrize(
    ("files", "error", "match"),
    [
        ({"s.npz": {"inp": STACK, "other": np.zeros(2)}}, InputShapeError, "other"),
        ({"s.npz": {"wrong": STACK}}, InputShapeError, "wrong"),
        ({"s.npz": {"inp": np.zeros((2, 1, 3, 4, 6))}}, InputShapeError, "s.npz: input 'inp'"),
        ({"s.npz": {"inp": np.zeros((3, 4, 5))}}, InputShapeError, "s.npz: input 'inp'"),
        ({"s.npz": b"PK\x03\x04 corrupt"}, ModelFileError, "s.npz"),
        ({"s.npy": b"\x93NUMPY garbage"}, ModelFileError, "s.npy"),
        ({}, ModelFileError, "empty"),
        ({"a.npz": {"inp": STACK}, "b.png": b"x"}, ModelFileError, "mixes"),
    ],
)
def test_load_errors(tmp_path, files, error, match) -> None:
    for name, content in files.items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            np.savez(tmp_path / name, **content)
    with pytest.raises(error, match=match):
        load_calibration(tmp_path, {"inp": F32})


def test_load_errors_for_paths_and_options(tmp_path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        load_calibration(tmp_path / "missing.npz", {"inp": F32})
    np.save(tmp_path / "s.npy", np.zeros((2, 1, 3, 4, 5), np.float32))
    with pytest.raises(InputShapeError, match="unnamed"):
        load_calibration(tmp_path / "s.npy", {"a": F32, "b": F32})
    with pytest.raises(OptionError, match="--preprocess"):
        load_calibration(tmp_path / "s.npy", {"inp": F32}, preprocess="scale=1/255")
    with pytest.raises(OptionError, match=">= 1"):
        load_calibration(tmp_path / "s.npy", {"inp": F32}, count=0)


def test_parse_preprocess() -> None:
    p = parse_preprocess("resize=224x320, mean=0.485;0.456:0.406, std=0.5, scale=1/255, layout=nhwc, bgr")
    assert (p.resize, p.mean, p.std, p.layout, p.bgr) == (
        (224, 320),
        (0.485, 0.456, 0.406),
        (0.5,),
        "NHWC",
        True,
    )
    assert p.scale == pytest.approx(1 / 255, rel=1e-15)
    for bad in ("resize=224", "mean=a", "std=0", "scale=1/0", "layout=CHW", "flip"):
        with pytest.raises(OptionError, match="--preprocess"):
            parse_preprocess(bad)


def test_load_images(tmp_path) -> None:
    from PIL import Image

    rgb = np.random.default_rng(0).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "b.png")
    Image.fromarray(255 - rgb).save(tmp_path / "a.bmp")
    samples = load_calibration(
        tmp_path,
        {"img": TensorType(DType.FLOAT32, (1, 3, 6, 8))},
        preprocess="mean=0.5;0.25;0,std=0.5,scale=1/255,bgr",
    )
    want = (
        (rgb[:, :, ::-1].astype(np.float32) * np.float32(1 / 255) - np.array([0.5, 0.25, 0], np.float32))
        / np.float32(0.5)
    ).transpose(2, 0, 1)[None]
    np.testing.assert_allclose(samples[1]["img"], want, rtol=0, atol=1e-6)  # names sort: a.bmp first
    nhwc = load_calibration(
        tmp_path / "b.png", {"img": TensorType(DType.FLOAT32, ("N", 5, 4, 3))}, preprocess="resize=5x4"
    )  # NHWC, seen from the shape
    assert nhwc[0]["img"].shape == (1, 5, 4, 3)
    chw = load_calibration(
        tmp_path / "b.png", {"img": TensorType(DType.FLOAT32, (3, 3, 4))}, preprocess="resize=3x4,layout=NCHW"
    )
    assert chw[0]["img"].shape == (3, 3, 4)
    gray = load_calibration(tmp_path / "b.png", {"img": TensorType(DType.FLOAT32, (1, 1, 6, 8))})
    assert gray[0]["img"].shape == (1, 1, 6, 8)
    with pytest.raises(InputShapeError, match="resize"):
        load_calibration(tmp_path / "b.png", {"img": TensorType(DType.FLOAT32, (1, 3, 5, 5))})
    (tmp_path / "c.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ModelFileError, match="c.jpg"):
        load_calibration(tmp_path, {"img": TensorType(DType.FLOAT32, (1, 3, 6, 8))})


def test_images_need_pillow(tmp_path, monkeypatch) -> None:
    (tmp_path / "a.png").write_bytes(b"\x89PNG")
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(OptionError, match=r"pip install kiln-compiler\[images\]"):
        load_calibration(tmp_path, {"img": F32})


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_plain_and_tty() -> None:
    now = [0.0]
    plain = io.StringIO()
    with Progress(8, "calibrating", stream=plain, clock=lambda: now[0]) as bar:
        for _ in range(8):
            now[0] += 1.0
            bar.step()
    lines = plain.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in plain.getvalue() and lines[0].startswith("calibrating: 2/8 (25%)")
    assert "ETA 0:06" in lines[0] and "8/8 (100%)" in lines[-1]
    tty, now[0] = _Tty(), 0.0
    with Progress(1000, "calibrating", stream=tty, clock=lambda: now[0]) as bar:
        for _ in range(1000):
            now[0] += 0.001  # 1 s in all: at most ~10 redraws
            bar.step()
    assert 5 <= tty.getvalue().count("\r") <= 13 and tty.getvalue().endswith("\n")
    with Progress(3, "x", stream=(quiet := io.StringIO()), enabled=False) as bar:
        bar.step(3)
    assert quiet.getvalue() == ""


@pytest.mark.slow
def test_observers_cover_every_tensor_of_pan_mnv3s() -> None:
    """Every float input/output of pan_mnv3s's nodes, 16 samples: each method gives finite ranges.

    The histogram methods see two passes (range, then histogram); on this real model Kiln's own
    methods must disagree with minmax somewhere (onnxruntime's entropy, ``entropy-ort``, has one
    candidate threshold, the full range, and so may not). Their cost against onnxruntime's collectors is measured by
    ``benchmarks/observer_cost.py``, not here.
    """
    from benchmarks.observer_cost import METHODS, kiln_ranges, record

    acts = record("pan_mnv3s_skin_clothes_hair")
    ranges = {name: kiln_ranges(name, acts) for name in METHODS}
    for name, rs in ranges.items():
        assert all(np.isfinite(r).all() for r in rs), name
    assert len(acts[0]) > 200
    for name in ("percentile", "entropy", "mse"):  # entropy-ort is onnxruntime's: minmax here
        differ = sum(not np.array_equal(a, b) for a, b in zip(ranges[name], ranges["minmax"], strict=True))
        assert differ > 0, f"{name} gives minmax's ranges on every tensor"
