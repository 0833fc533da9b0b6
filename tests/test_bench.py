"""compiler.bench: interleaved statistics and the ``kiln bench`` report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from compiler.bench import BenchReport, Stats, bench_artifact, interleaved, random_feeds_for, runner_callable
from compiler.errors import OptionError
from tests.test_tvm_runtime import build_small_artifact

JSON_KEYS = {
    "artifact",
    "threads",
    "rounds",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "vs",
    "ort_median_ms",
    "ratio_vs",
    "kernel_report",
}


def test_interleaved_orders_cheap_functions() -> None:
    calls = {"a": 0, "b": 0}

    def count(k: str) -> Callable[[], None]:
        def fn() -> None:
            calls[k] += 1
            time.sleep(0.001 if k == "a" else 0.004)

        return fn

    stats = interleaved({"a": count("a"), "b": count("b")}, rounds=5, min_batch_s=0.01)
    a, b = stats["a"], stats["b"]
    assert isinstance(a, Stats) and a.rounds == 5
    assert a.p10_s <= a.median_s <= a.p90_s
    # time.sleep oversleeps a little, never undersleeps
    assert 0.001 <= a.median_s < 0.003 and 0.004 <= b.median_s < 0.007
    assert b.median_s > 2 * a.median_s
    # a sleeping thread uses (almost) no CPU
    assert a.cpu_median_s < 0.5 * a.median_s
    # each sample is a batch lasting >= min_batch_s: a needs several calls per sample, b fewer
    assert a.calls_per_sample * 0.001 >= 0.01 * 0.5 and a.calls_per_sample > b.calls_per_sample
    # warm-up/calibration calls plus rounds * batch
    assert calls["a"] >= 5 * a.calls_per_sample and calls["b"] >= 5 * b.calls_per_sample


def test_interleaved_cpu_time_tracks_busy_work() -> None:
    x = np.random.default_rng(0).standard_normal((200, 200)).astype(np.float32)

    def busy() -> object:
        return sum(float(np.sum(x * i)) for i in range(20))

    s = interleaved({"busy": busy}, rounds=5, min_batch_s=0.005)["busy"]
    assert 0.3 * s.median_s < s.cpu_median_s < 1.5 * s.median_s


def test_interleaved_rejects_zero_rounds() -> None:
    with pytest.raises(OptionError, match="rounds 0"):
        interleaved({"a": lambda: None}, rounds=0)


def _twin_onnx(path: Path) -> Path:
    """The ONNX twin of the small TVM artifact: (relu(x + z), 2 x)."""
    vi = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 4, 5])
        for n in ("x", "z", "sum_relu", "twice")
    ]
    nodes = [
        helper.make_node("Add", ["x", "z"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["sum_relu"], name="relu"),
        helper.make_node("Mul", ["x", "two"], ["twice"], name="mul"),
    ]
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    g = helper.make_graph(nodes, "twin", vi[:2], vi[2:], initializer=[two])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    out = tmp_path_factory.mktemp("bench")
    so = build_small_artifact(out / "cpu")
    rng = np.random.default_rng(3)
    feeds = {k: rng.standard_normal((1, 3, 4, 5)).astype(np.float32) for k in ("x", "z")}
    return so, _twin_onnx(out / "twin.onnx"), feeds


def test_bench_artifact_vs_onnx(tiny: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    so, twin, feeds = tiny
    rep = bench_artifact(so, feeds, threads=1, vs=twin, rounds=3, min_batch_s=0.005)
    assert isinstance(rep, BenchReport)
    d = rep.as_json()
    assert set(d) == JSON_KEYS
    assert d["artifact"] == str(so) and d["vs"] == str(twin) and d["threads"] == 1 and d["rounds"] == 3
    assert 0 < d["p10_ms"] <= d["median_ms"] <= d["p90_ms"]
    assert d["ort_median_ms"] > 0
    assert d["ratio_vs"] == pytest.approx(d["median_ms"] / d["ort_median_ms"], rel=2e-3)


def test_bench_artifact_alone_and_two_threads(tiny: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    so, twin, feeds = tiny
    d = bench_artifact(so, feeds, threads=2, rounds=2, min_batch_s=0.002).as_json()
    assert set(d) == JSON_KEYS
    assert d["vs"] is None and d["ort_median_ms"] is None and d["ratio_vs"] is None and d["median_ms"] > 0
    # ONNX artifacts are timed in onnxruntime
    assert bench_artifact(twin, feeds, threads=1, vs=twin, rounds=2, min_batch_s=0.002).ratio_vs is not None


def test_runner_callables_compute_the_same(tiny: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    so, twin, feeds = tiny
    tvm_out = runner_callable(so, feeds, 1)()
    ort_out = runner_callable(twin, feeds, 1)()
    np.testing.assert_allclose(tvm_out[0].numpy(), ort_out[0], rtol=0, atol=1e-6)  # type: ignore[index]
    np.testing.assert_allclose(tvm_out[1].numpy(), ort_out[1], rtol=0, atol=0)  # type: ignore[index]


def test_bench_rejects_bad_options(tiny: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    so, _, feeds = tiny
    with pytest.raises(OptionError, match="--vs .*compare against an ONNX model"):
        bench_artifact(so, feeds, threads=1, vs=so, rounds=1)
    with pytest.raises(OptionError, match="--threads 0"):
        bench_artifact(so, feeds, threads=0, rounds=1)
    with pytest.raises(OptionError, match="times .so"):
        bench_artifact(so.with_suffix(".mnn"), feeds, threads=1, rounds=1)


def test_random_feeds_and_summary(tiny: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    so, twin, _ = tiny
    for artifact in (so, twin):
        feeds = random_feeds_for(artifact)
        assert sorted(feeds) == ["x", "z"]
        assert all(v.shape == (1, 3, 4, 5) and v.dtype == np.float32 for v in feeds.values())
        np.testing.assert_array_equal(feeds["x"], random_feeds_for(artifact)["x"])  # seeded
    rep = bench_artifact(so, None, threads=1, vs=twin, rounds=2, min_batch_s=0.002)
    text = rep.summary()
    assert text.startswith(f"{so}: median ") and "2 rounds, 1 thread)" in text
    assert f"{twin} (onnxruntime): median " in text and f"ratio {rep.ratio_vs:.3f}" in text
