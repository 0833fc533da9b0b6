"""Acceptance of int8 quantization: Kiln against onnxruntime's ``quantize_static`` on hold-out data.

For every model in ../shared/models and for the digits example, ``kiln compile MODEL --quantize
int8 --calib DATA --calib-method M --emit onnx`` (verified on the model's real input; without
the sensitivity report, which does not change the model) must give a QDQ ONNX model that
onnxruntime runs, and on the hold-out samples (never the calibration ones)

    SQNR_kiln(o) >= SQNR_ort(o) - 0.2 dB     for every output o and M in {minmax, entropy, percentile}

with ``SQNR(o) = 10 log10( sum_s sum_i ref_s,i^2 / sum_s sum_i (q_s,i - ref_s,i)^2 )``, the sums
running over all hold-out samples s and elements i of output o, ``ref`` the fp32 model's output
(onnxruntime) and ``q`` the int8 model's. The criterion holds per output, not for the worst one
only: a detector's box and score heads are different quantities.

onnxruntime's side: ``quantize_static`` in QDQ format, QUInt8 activations, QInt8 per-channel
weights, the same calibration samples and the matching ``CalibrationMethod`` with its defaults
(Percentile 99.999; Entropy 128 bins), on the model raised to opset 13 and with ppocr's dynamic
input fixed to 1x3x48x192 (Kiln gets the same shape with ``--input-shape``). Both int8 models
are built once per session; a table of both SQNRs is printed at the end of the module.

Task-level checks: the digits example loses at most 0.5 points of test accuracy, ppocr cls gives
the same class on its real input, and UltraFace finds the same faces after NMS (score > 0.7,
IoU 0.3; each fp32 face matched by an int8 face with IoU >= 0.9). Entropy's manifest records, per
shared model, KL clips that change a grid and a measured reason for every tensor it puts back to
full range (entropy differs from minmax in effect, not only on paper).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from examples.digits import train
from examples.digits.accuracy import evaluate
from tests.conftest import MODEL_STEMS
from tests.helpers.detection import match_boxes, ultraface_faces
from tests.helpers.quant_reference import FUSED_INT8_EXACT, ModelCase, QuantBench, SqnrRow, run_samples

METHODS = ["minmax", "entropy", "percentile"]
STEMS = [*MODEL_STEMS, "digits"]
MARGIN_DB = 0.2
MAX_ACCURACY_DROP = 0.005
SHAPES = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}

# Ops that a real int8 backend runs quantized; each data input must come from a DequantizeLinear,
# or (for the epilogue of a fused conv: bias, residual Add, activation) straight from a Conv.
_DATA_PORTS = {"Conv": (0, 1), "Gemm": (0, 1), "MatMul": (0, 1), "Concat": None, "Resize": (0,)}
_DATA_PORTS |= {"GlobalAveragePool": (0,), "AveragePool": (0,)}
_EPILOGUE_PORTS = {"Add": (0, 1), "Mul": (0, 1), "Relu": (0,), "Clip": (0,), "MaxPool": (0,)}
_EPILOGUE_OPS = {"Conv", "Add", "Relu", "Clip", "HardSwish", "HardSigmoid", "LeakyRelu"}


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits example, trained once: digits_cnn.onnx and its data files."""
    out = tmp_path_factory.mktemp("digits")
    train.main(out)
    return out


@pytest.fixture(scope="module")
def bench(shared_dir: Path, digits_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> QuantBench:
    """Every case's Kiln and onnxruntime int8 models, built on first use and kept for the module."""
    data = shared_dir / "models" / "data"
    cases = {
        stem: ModelCase(
            stem,
            shared_dir / "models" / f"{stem}.onnx",
            data / f"{stem}.calib.npz",
            data / f"{stem}.holdout.npz",
            data / f"{stem}.npz",
            SHAPES.get(stem, {}),
        )
        for stem in MODEL_STEMS
    }
    cases["digits"] = ModelCase(
        "digits",
        digits_dir / train.MODEL_FILE,
        digits_dir / train.CALIB_FILE,
        digits_dir / train.HOLDOUT_FILE,
        digits_dir / train.INPUTS_FILE,
    )
    for case in cases.values():
        for f in (case.model, case.calib, case.holdout, case.real):
            assert f.is_file(), f"missing {f}"
    return QuantBench(cases, tmp_path_factory.mktemp("quant"))


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[SqnrRow]]:
    """Rows collected by the SQNR tests, printed as one table when the module ends."""
    rows: list[SqnrRow] = []
    yield rows
    lines = [f"{'model':<28} {'method':<10} {'output':<32} {'kiln dB':>8} {'ort dB':>8} {'diff':>7}"]
    for r in rows:
        lines.append(
            f"{r.stem:<28} {r.method:<10} {r.output:<32} {r.kiln:8.2f} {r.ort:8.2f} {r.kiln - r.ort:+7.2f}"
        )
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("-", "int8 hold-out SQNR: Kiln vs onnxruntime quantize_static")
        for line in lines:
            reporter.write_line(line)
    else:
        print("\n".join(lines))


# Known shortfalls, as strict xfails: (stem, method) -> reason. Empty now. yunet entropy was one
# (issue 16): the raw KL search clips backbone tensors whose tails carry the sparse obj heads'
# signal (obj_8 -5.25 dB, obj_16 -2.19 against onnxruntime). Kiln's entropy now keeps a KL clip only
# where it lowers no output's SQNR on the calibration samples, also with any one sample left out
# (compiler/quant/clip_check.py); the tensors put back to full range are in the manifest.
_SHORT: dict[tuple[str, str], str] = {}
_CASES = [
    pytest.param(stem, method, marks=pytest.mark.xfail(strict=True, reason=_SHORT[(stem, method)]))
    if (stem, method) in _SHORT
    else pytest.param(stem, method)
    for stem in STEMS
    for method in METHODS
]


@pytest.mark.parametrize(("stem", "method"), _CASES)
def test_sqnr_at_least_onnxruntime(bench: QuantBench, table: list[SqnrRow], stem: str, method: str) -> None:
    rows = bench.sqnr(stem, method)
    table.extend(rows)
    for r in rows:
        print(f"{stem} {method} {r.output}: kiln {r.kiln:.2f} dB, onnxruntime {r.ort:.2f} dB")
    worse = [
        f"{r.output} ({r.kiln:.2f} < {r.ort:.2f} - {MARGIN_DB})" for r in rows if r.kiln < r.ort - MARGIN_DB
    ]
    assert not worse, f"{stem} {method}: Kiln's hold-out SQNR is below onnxruntime's for {worse}"


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_entropy_keeps_clips_that_no_output_pays_for(bench: QuantBench, stem: str) -> None:
    """The manifest's entropy check: clips kept (that change a grid) and each full-range tensor's reason."""
    doc = json.loads((bench.kiln_dir(stem, "entropy") / "manifest.json").read_text())
    check = doc["quantization"]["calibration"]["entropy_check"]
    print(f"{stem}: {check['clipped_kept']} clips kept ({check['clipped_without_effect']} without effect),")
    print(f"  {check['full_range']} back to full range")
    assert check["evaluation_samples"] >= 4
    assert check["clipped_kept"] > check["clipped_without_effect"], check  # differs from minmax in effect
    assert len(check["kept"]) == check["clipped_kept"]
    assert len(check["full_range_why"]) == check["full_range"] > 0
    outputs = {o.name for o in onnx.load(str(bench.cases[stem].model), load_external_data=False).graph.output}
    for name, why in check["full_range_why"].items():
        assert any(f"'{o}'" in why for o in outputs), f"{name}: {why}"


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


@pytest.mark.parametrize("stem", STEMS)
def test_int8_model_is_qdq_and_quantizes_every_candidate(bench: QuantBench, stem: str) -> None:
    out = bench.kiln_dir(stem, "minmax")
    model = onnx.load(str(out / "model.onnx"))
    floats = json.loads((out / "manifest.json").read_text())["quantization"]["float_nodes"]
    tail = "float post-processing after the last weighted layer"
    assert all(why == tail for why in floats.values()), (
        f"{stem}: quantizable nodes were left in float: {floats}"
    )
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    prod = _producers(model)
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops

    def from_dq(name: str, epilogue: bool) -> bool:
        p = prod.get(name)
        if p is None:
            return False
        if p.op_type == "DequantizeLinear":
            return True
        return epilogue and p.op_type in _EPILOGUE_OPS and (p.op_type == "Conv" or from_dq(p.input[0], True))

    for n in model.graph.node:
        if n.name in floats or (n.output and n.output[0] in floats):
            continue  # the float tail after the last weighted layer
        ports = _DATA_PORTS.get(n.op_type, _EPILOGUE_PORTS.get(n.op_type, ()))
        epilogue = n.op_type in _EPILOGUE_PORTS
        for port in range(len(n.input)) if ports is None else ports:
            assert from_dq(n.input[port], epilogue), f"{stem}: {n.op_type} {n.name} input {port} is not int8"
        if n.op_type in ("Conv", "Gemm", "MatMul"):
            dq = prod[n.input[1]]
            assert inits[dq.input[0]].dtype == np.int8, f"{stem}: {n.name} weight is not int8"
            if len(n.input) > 2 and n.input[2]:
                assert inits[prod[n.input[2]].input[0]].dtype == np.int32, f"{stem}: {n.name} bias"


@pytest.mark.parametrize("method", METHODS)
def test_digits_accuracy_drop_at_most_half_a_point(bench: QuantBench, digits_dir: Path, method: str) -> None:
    holdout = digits_dir / train.HOLDOUT_FILE
    fp32 = evaluate(digits_dir / train.MODEL_FILE, holdout)
    int8 = evaluate(bench.kiln_dir("digits", method) / "model.onnx", holdout, exact=not FUSED_INT8_EXACT)
    print(f"digits {method}: fp32 accuracy {fp32:.4f}, int8 {int8:.4f}")
    assert int8 >= fp32 - MAX_ACCURACY_DROP, f"{method}: int8 accuracy {int8:.4f} vs fp32 {fp32:.4f}"


def _real(bench: QuantBench, stem: str) -> dict[str, np.ndarray]:
    with np.load(bench.cases[stem].real) as z:
        return {k: np.asarray(z[k]) for k in z.files}


@pytest.mark.parametrize("method", METHODS)
def test_ppocr_cls_same_class_on_real_input(bench: QuantBench, method: str) -> None:
    stem = "ppocr_mobile_v2_cls"
    feeds = [_real(bench, stem)]
    (ref,) = run_samples(bench.cases[stem].model, feeds).values()
    (got,) = run_samples(bench.kiln_dir(stem, method) / "model.onnx", feeds, not FUSED_INT8_EXACT).values()
    assert int(np.argmax(ref[0])) == 1, "fp32: the real input is an upside-down line (class 180)"
    assert int(np.argmax(got[0])) == int(np.argmax(ref[0])), f"{method}: int8 probs {got[0][0]}"


@pytest.mark.parametrize("method", METHODS)
def test_ultraface_same_faces_after_nms(bench: QuantBench, method: str) -> None:
    stem = "ultraface_rfb320"
    feeds = [_real(bench, stem)]
    ref = run_samples(bench.cases[stem].model, feeds)
    got = run_samples(bench.kiln_dir(stem, method) / "model.onnx", feeds, not FUSED_INT8_EXACT)
    ref_boxes, _ = ultraface_faces(ref["scores"][0], ref["boxes"][0])
    got_boxes, _ = ultraface_faces(got["scores"][0], got["boxes"][0])
    assert len(ref_boxes) == 5, f"fp32 finds {len(ref_boxes)} faces (MANIFEST: 5)"
    ious = match_boxes(ref_boxes, got_boxes, 0.9)
    print(f"ultraface {method}: {len(got_boxes)} int8 faces, IoU with fp32 {[round(i, 3) for i in ious]}")
    assert len(got_boxes) == len(ref_boxes) and min(ious) >= 0.9, f"{method}: IoUs {ious}"
