"""The MNN writer on every shared model: files that MNN's runtime loads and whose outputs on
the real inputs match onnxruntime on the original model, for every weight encoding.

Acceptance (issue 5), measured in MNN's runtime (Winograd memory level 0, fp32 "high"):
fp32 max rel <= the fp32 verification tolerance (1e-4, tighter than the issue's 1e-3);
fp16 weights cosine >= 0.9995; int8 weights >= 0.999; int4 >= 0.98; each also with
external weights and with fp16 scale storage (int8/int4 are run with both at once: each
int variant measures its own weight plan, the slow part, so plain int8/int4 run on the
models where the plan is cheap, and in test_mnn_encoding / test_mnn_zoo). One optimized
graph per model is shared by all encodings (module-scoped); ``kiln compile`` runs once per model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.cli import main
from compiler.ir.graph import Graph
from compiler.metrics import agreement
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from compiler.verification import TOLERANCES
from schemas.mnn.external import side_file
from schemas.mnn.schema import fb
from tests.conftest import MODEL_STEMS, MODELS

SHAPES = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}
MIN_COSINE = {"fp16": 0.9995, "int8": 0.999, "int4": 0.98}
VARIANTS = {
    "fp32": MnnOptions(),
    "fp32_external": MnnOptions(external=True),
    "fp16": MnnOptions(weights="fp16"),
    "fp16_external": MnnOptions(weights="fp16", external=True),
    "int8_external_fp16scale": MnnOptions(weights="int8", external=True, scale="fp16"),
    "int4_external_fp16scale": MnnOptions(weights="int4", external=True, scale="fp16"),
    "int8": MnnOptions(weights="int8"),
    "int4": MnnOptions(weights="int4"),
}
# plain int8/int4 where every layer can be quantized (the plan costs one run, not one per layer)
PLAIN_INT_MODELS = {"ultraface_rfb320", "ppocr_mobile_v2_cls"}
CASES = [
    (stem, variant)
    for stem in MODEL_STEMS
    for variant in VARIANTS
    if variant not in ("int8", "int4") or stem in PLAIN_INT_MODELS
]


@dataclass
class Prepared:
    """A shared model after Kiln's default pipeline, with its real inputs and ORT's outputs."""

    stem: str
    graph: Graph
    feeds: dict[str, np.ndarray]
    ref: dict[str, np.ndarray]


@pytest.fixture(scope="module", params=MODEL_STEMS)
def prepared(request: pytest.FixtureRequest) -> Prepared:
    stem = request.param
    path = MODELS / f"{stem}.onnx"
    with np.load(MODELS / "data" / f"{stem}.npz") as z:
        feeds = {k: z[k] for k in z.files}
    graph = load_model(path, input_shapes=SHAPES.get(stem))
    PassManager(pipeline("default")).run(graph)
    return Prepared(stem, graph, feeds, run_onnxruntime(path, feeds))


def _check(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], weights: str) -> list[str]:
    assert list(got) == list(ref), f"output names {list(got)} != {list(ref)}"
    bad = []
    for name, r in ref.items():
        m = agreement(got[name], r)
        if weights == "fp32":
            ok = TOLERANCES["fp32"].accepts(m.max_rel, m.cosine)
        else:
            ok = m.cosine >= MIN_COSINE[weights]
        if not ok:
            bad.append(f"{name}: max_rel={m.max_rel:.3g} cos={m.cosine:.6f}")
    return bad


@pytest.mark.parametrize(("prepared", "variant"), CASES, indirect=["prepared"])
def test_encodings_match_onnxruntime(prepared: Prepared, variant: str, tmp_path: Path) -> None:
    opts = VARIANTS[variant]
    path = tmp_path / "model.mnn"
    written = write_mnn(prepared.graph, path, opts, prepared.stem, prepared.feeds)
    assert written[-1] == path and side_file(path).is_file() == opts.external
    got = run_mnn(path, prepared.feeds)
    bad = _check(got, prepared.ref, opts.weights)
    assert not bad, f"{prepared.stem} {variant}: " + "; ".join(bad)


def test_bytes_are_deterministic_and_names_preserved(prepared: Prepared, tmp_path: Path) -> None:
    opts = MnnOptions(weights="fp16", external=True, biz_code="kiln-test")
    a = write_mnn(prepared.graph, tmp_path / "a" / "model.mnn", opts, prepared.stem, prepared.feeds)
    b = write_mnn(prepared.graph, tmp_path / "b" / "model.mnn", opts, prepared.stem, prepared.feeds)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    net = fb.Net.GetRootAs(a[-1].read_bytes(), 0)
    names = [net.TensorName(i).decode() for i in range(net.TensorNameLength())]
    assert len(set(names)) == len(names)
    outputs = [net.OutputName(i).decode() for i in range(net.OutputNameLength())]
    assert outputs == list(prepared.ref)
    kiln_names = {nm for n in prepared.graph.nodes() for nm in n.output_names if n.op != "Constant"}
    kept = kiln_names & set(names)
    assert len(kept) >= 0.9 * len(kiln_names), sorted(kiln_names - set(names))[:10]
    assert net.BizCode() == b"kiln-test" and net.SourceType() == fb.NetSource.ONNX


def test_kiln_compile_emit_mnn(prepared: Prepared, tmp_path: Path) -> None:
    out = tmp_path / "o"
    args = ["compile", str(MODELS / f"{prepared.stem}.onnx"), "-o", str(out), "--emit", "onnx,mnn"]
    args += ["--inputs", str(MODELS / "data" / f"{prepared.stem}.npz"), "--mnn-biz-code", "acceptance"]
    for name, dims in SHAPES.get(prepared.stem, {}).items():
        args += ["--input-shape", f"{name}={'x'.join(map(str, dims))}"]
    assert main(args) == 0
    man = json.loads((out / "manifest.json").read_text())
    arts = {a["kind"]: a for a in man["verification"]["artifacts"]}
    assert set(arts) == {"onnx", "mnn"} and arts["mnn"]["precision"] == "fp32"
    assert all(a["passed"] for a in arts.values())
    assert man["options"]["mnn"]["biz_code"] == "acceptance"
    import MNN

    rt = MNN.nn.create_runtime_manager(({"backend": 0, "numThread": 1, "precision": "high"},))
    module = MNN.nn.load_module_from_file(str(out / "model.mnn"), [], [], runtime_manager=rt)
    info = module.get_info()
    assert info["bizCode"] == "acceptance"
    assert list(info["outputNames"]) == list(prepared.ref)
    assert list(info["inputNames"]) == list(prepared.feeds)
    # `kiln run` on the written file gives the verified outputs
    y = tmp_path / "y.npz"
    assert (
        main(
            [
                "run",
                str(out / "model.mnn"),
                "--inputs",
                str(MODELS / "data" / f"{prepared.stem}.npz"),
                "-o",
                str(y),
            ]
        )
        == 0
    )
    with np.load(y) as z:
        assert not _check({k: z[k] for k in z.files}, prepared.ref, "fp32")
