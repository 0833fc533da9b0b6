"""The MNN reader (issue 5): ``.mnn`` files written by MNN's converter and by Kiln, back into the IR.

* ultraface_rfb320.mnn (upstream, converter-written) imported and exported to ONNX matches
  ultraface_rfb320.onnx in onnxruntime on the real input (max rel <= 1e-4). The upstream file
  stops before the ONNX model's box decoding (the Slice/Exp/Mul/Add tail, which upstream's C++
  demo does with the priors): its ``boxes`` is the ONNX model's tensor ``460``, the raw
  regression concat, and is checked against that tensor; ``scores`` against ``scores``.
* Every weight encoding Kiln writes (fp32, fp16, int8, int4, asymmetric, block-wise, fp16
  scales, external weights) reads back to exactly the weights MNN decodes
  (``decoded_weights``), and the imported graph runs in onnxruntime.
* A Kiln ``.mnn`` read and written again (with the storage each layer had) is byte-identical,
  side file included.
* A missing or short ``.weight`` side file, a truncated file and a corrupt file are one clean
  ModelFileError (exit 2 in the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from backends.mnn.options import MnnOptions
from backends.mnn.weights import WeightStorage, decoded_weights
from backends.mnn.writer import mnn_bytes, write_mnn
from compiler.api import PassManager, load_model
from compiler.cli import main
from compiler.errors import ModelFileError, UnsupportedOpsError
from compiler.ir.graph import Graph
from compiler.metrics import agreement
from compiler.onnx_export import export_onnx
from compiler.pipelines import pipeline
from frontends.mnn.loader import load_mnn
from schemas.mnn.external import side_file
from tests.conftest import MODELS

STEM = "ultraface_rfb320"
CONVERTER_MNN = MODELS / f"{STEM}.mnn"


def _feeds() -> dict[str, np.ndarray]:
    with np.load(MODELS / "data" / f"{STEM}.npz") as z:
        return {k: z[k] for k in z.files}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run_graph(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = _session(export_onnx(graph))
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds), strict=True))


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    """ORT on the original ONNX model, with the raw box regression ``460`` as an extra output."""
    model = onnx.load(str(MODELS / f"{STEM}.onnx"))
    model.graph.output.append(onnx.ValueInfoProto(name="460"))
    s = _session(model)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, _feeds()), strict=True))


@pytest.fixture(scope="module")
def optimized() -> Graph:
    graph = load_model(MODELS / f"{STEM}.onnx")
    PassManager(pipeline("default")).run(graph)
    return graph


def _max_rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


# ----------------------------------------------------------------------- converter-written
def test_converter_file_matches_onnx(reference: dict[str, np.ndarray]) -> None:
    graph = load_model(CONVERTER_MNN)
    assert [v.name for v in graph.inputs] == ["input"]
    ops = {n.qualified_op for n in graph.ops()}
    assert "kiln::FusedConv" in ops and "Transpose" in ops and "Softmax" in ops
    got = _run_graph(graph, _feeds())
    assert sorted(got) == ["boxes", "scores"]
    assert got["scores"].shape == reference["scores"].shape == (1, 4420, 2)
    assert _max_rel(got["scores"], reference["scores"]) <= 1e-4
    assert got["boxes"].shape == reference["460"].shape == (1, 4420, 4)
    assert _max_rel(got["boxes"], reference["460"]) <= 1e-4


def test_converter_file_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert main(["compile", str(CONVERTER_MNN), "--emit", "onnx", "-o", str(out)]) == 0
    assert (out / "model.onnx").is_file()


# ---------------------------------------------------------------------------- Kiln-written
@dataclass(frozen=True)
class Variant:
    options: MnnOptions
    kind: str
    min_cosine: float


VARIANTS = {
    "fp32": Variant(MnnOptions(), "fp32", 1.0),
    "fp32_external": Variant(MnnOptions(external=True), "fp32", 1.0),
    "fp16": Variant(MnnOptions(weights="fp16"), "fp16", 0.9995),
    "fp16_external": Variant(MnnOptions(weights="fp16", external=True), "fp16", 0.9995),
    "int8": Variant(MnnOptions(weights="int8"), "int8", 0.999),
    "int8_asym_fp16scale_external": Variant(
        MnnOptions(weights="int8", asymmetric=True, scale="fp16", external=True), "int8", 0.999
    ),
    "int4": Variant(MnnOptions(weights="int4"), "int4", 0.9),
    "int4_block_asym_fp16scale": Variant(
        MnnOptions(weights="int4", block_size=8, asymmetric=True, scale="fp16"), "int4", 0.9
    ),
    "int4_external_fp16scale": Variant(MnnOptions(weights="int4", external=True, scale="fp16"), "int4", 0.9),
}


CONV_OPS = ("Conv", "kiln::FusedConv")


def _storage(graph: Graph, v: Variant) -> dict[int, WeightStorage]:
    st = WeightStorage(v.kind, v.options.asymmetric, v.options.scale == "fp16")
    return {n.id: st for n in graph.nodes() if n.qualified_op in CONV_OPS}


def _conv_weights(graph: Graph) -> dict[str, np.ndarray]:
    out = {}
    for n in graph.nodes():
        if n.qualified_op in CONV_OPS:
            wv = graph.inputs_of(n)[1]
            assert wv is not None
            w = graph.const_value(wv)
            assert w is not None
            out[n.output_names[0]] = w
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kiln_file_reads_back(
    optimized: Graph, reference: dict[str, np.ndarray], variant: str, tmp_path: Path
) -> None:
    v = VARIANTS[variant]
    path = tmp_path / "model.mnn"
    storage = _storage(optimized, v)
    write_mnn(optimized, path, v.options, STEM, storage=storage)
    assert side_file(path).is_file() == v.options.external
    graph = load_mnn(path)

    # the weights are exactly what MNN decodes from the stored encoding
    original, read = _conv_weights(optimized), _conv_weights(graph)
    assert set(read) == set(original) and len(read) == 52
    for name, w in original.items():
        block = v.options.block_size * w.shape[2] * w.shape[3] if v.options.block_size else None
        st = WeightStorage(v.kind, v.options.asymmetric, v.options.scale == "fp16")
        expect = decoded_weights(w.reshape(w.shape[0], -1), st, block).reshape(w.shape)
        np.testing.assert_array_equal(read[name], expect, err_msg=name)

    # the imported graph runs: fp32 matches the original model, the others keep the cosines
    got = _run_graph(graph, _feeds())
    assert sorted(got) == ["boxes", "scores"]
    for name in got:
        m = agreement(got[name], reference[name])
        if v.kind == "fp32":
            assert m.max_rel <= 1e-4, f"{name}: {m.max_rel}"
        else:
            assert m.cosine >= v.min_cosine, f"{name}: cos {m.cosine}"

    # read and written again with the storage each layer had: byte-identical
    again = _storage(graph, v)
    data, side = mnn_bytes(graph, v.options, STEM, storage=again)
    assert data == path.read_bytes()
    assert side == (side_file(path).read_bytes() if v.options.external else None)


def test_kiln_compile_output_round_trips(tmp_path: Path) -> None:
    """``kiln compile --emit mnn`` output (planned int8 weights, external, fp16 scales) reads back."""
    out = tmp_path / "o"
    args = ["compile", str(MODELS / f"{STEM}.onnx"), "--emit", "mnn", "-o", str(out)]
    args += ["--mnn-weights", "int8", "--mnn-scale", "fp16", "--external-weights"]
    args += ["--inputs", str(MODELS / "data" / f"{STEM}.npz")]
    assert main(args) == 0
    graph = load_model(out / "model.mnn")
    ref = _run_graph(load_model(MODELS / f"{STEM}.onnx"), _feeds())
    got = _run_graph(graph, _feeds())
    for name in ref:
        assert agreement(got[name], ref[name]).cosine >= 0.999


# ------------------------------------------------------------------------------ bad files
@pytest.fixture(scope="module")
def external_file(optimized: Graph, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ext") / "model.mnn"
    write_mnn(optimized, path, MnnOptions(weights="fp16", external=True), STEM, storage={})
    return path


def _copy(src: Path, dst: Path, side: bytes | None) -> Path:
    dst.write_bytes(src.read_bytes())
    if side is not None:
        side_file(dst).write_bytes(side)
    return dst


def test_missing_side_file_is_refused(external_file: Path, tmp_path: Path) -> None:
    path = _copy(external_file, tmp_path / "nw.mnn", None)
    with pytest.raises(ModelFileError, match=r"nw\.mnn\.weight.*missing"):
        load_mnn(path)
    assert main(["compile", str(path), "--emit", "onnx", "-o", str(tmp_path / "o")]) == 2


def test_short_side_file_is_refused(external_file: Path, tmp_path: Path) -> None:
    side = side_file(external_file).read_bytes()
    path = _copy(external_file, tmp_path / "short.mnn", side[: len(side) // 2])
    with pytest.raises(ModelFileError, match=r"short\.mnn\.weight has \d+ bytes"):
        load_mnn(path)
    assert main(["compile", str(path), "--emit", "onnx", "-o", str(tmp_path / "o")]) == 2


@pytest.mark.parametrize("keep", [0, 3, 7, 100, 5000, -1000])
def test_truncated_file_is_refused(keep: int, tmp_path: Path) -> None:
    data = CONVERTER_MNN.read_bytes()
    path = tmp_path / "t.mnn"
    path.write_bytes(data[:keep])
    with pytest.raises(ModelFileError, match=r"t\.mnn"):
        load_mnn(path)


@pytest.mark.parametrize("seed", range(12))
def test_corrupt_file_is_refused_or_read(seed: int, tmp_path: Path) -> None:
    data = bytearray(CONVERTER_MNN.read_bytes())
    rng = np.random.default_rng(seed)
    for i in rng.choice(4096, size=64, replace=False):  # the tables, not only the weight arrays
        data[int(i)] = int(rng.integers(256))
    path = tmp_path / "c.mnn"
    path.write_bytes(bytes(data))
    try:
        load_mnn(path)  # a flip may land in a float array: still a valid model
    except (ModelFileError, UnsupportedOpsError) as exc:  # a flipped op type may name another op
        assert "c.mnn" in str(exc)


def test_not_a_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.mnn"
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(ModelFileError, match=r"x\.mnn"):
        load_mnn(path)
    assert main(["compile", str(path), "--emit", "onnx", "-o", str(tmp_path / "o")]) == 2
