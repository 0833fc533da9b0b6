"""The MNN writer on generated models: every op family against onnxruntime, weight encodings,
the weight plan, unsupported ops, CLI flags and the side-file checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from backends.mnn.backend import BACKEND as MNN
from backends.mnn.options import MnnOptions
from backends.mnn.precision import plan_weights
from backends.mnn.runtime import run_mnn
from backends.mnn.weights import WeightStorage
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.cli import main
from compiler.errors import ModelFileError, UnsupportedOpsError
from compiler.ir.graph import Graph
from compiler.metrics import agreement
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from compiler.verification import TOLERANCES
from schemas.mnn.external import side_file
from schemas.mnn.schema import fb
from tests.helpers.mnn_zoo import ZOO, zoo_feeds
from tests.helpers.models import ROUND_TRIP, opset9_upgrades, random_feeds
from tests.helpers.onnx_text import text_model

MODELS = {name: (build, zoo_feeds) for name, build in ZOO.items()}
MODELS |= {
    f"models.{name}": (build, random_feeds) for name, build in ROUND_TRIP.items() if name != "opset9_upgrades"
}


def _prepare(name: str, tmp_path: Path) -> tuple[Graph, dict[str, np.ndarray], dict[str, np.ndarray]]:
    build, feeder = MODELS[name]
    model = build()
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    feeds = feeder(model)
    graph = load_model(path, input_shapes={k: v.shape for k, v in feeds.items()})
    # the default pipeline, then MNN's legalization (normalize-gemm, decompositions), as a compile runs
    PassManager(pipeline("default") + MNN.legalization("mnn", None)).run(graph)
    return graph, feeds, run_onnxruntime(path, feeds)


def _worst(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> tuple[float, float]:
    assert list(got) == list(ref)
    ms = [agreement(got[k], r) for k, r in ref.items()]
    return max(m.max_rel for m in ms), min(m.cosine for m in ms)


@pytest.mark.parametrize("name", list(MODELS))
def test_fp32_matches_onnxruntime(name: str, tmp_path: Path) -> None:
    graph, feeds, ref = _prepare(name, tmp_path)
    path = tmp_path / "model.mnn"
    write_mnn(graph, path, MnnOptions())
    max_rel, cos = _worst(run_mnn(path, feeds), ref)
    assert TOLERANCES["fp32"].accepts(max_rel, cos), f"{name}: max_rel={max_rel:.3g} cos={cos:.7f}"


ENCODINGS = {
    "fp16": (MnnOptions(weights="fp16", external=True), 0.9995),
    "int8": (MnnOptions(weights="int8"), 0.999),
    "int8_asym_fp16scale_external": (
        MnnOptions(weights="int8", asymmetric=True, scale="fp16", external=True),
        0.999,
    ),
    "int4": (MnnOptions(weights="int4"), 0.98),
    "int4_asym_block2_external": (
        MnnOptions(weights="int4", asymmetric=True, block_size=2, external=True),
        0.98,
    ),
}


@pytest.mark.parametrize("encoding", list(ENCODINGS))
@pytest.mark.parametrize("name", ["conv_family", "deconv", "gemm_matmul", "elementwise"])
def test_weight_encodings(name: str, encoding: str, tmp_path: Path) -> None:
    graph, feeds, ref = _prepare(name, tmp_path)
    opts, floor = ENCODINGS[encoding]
    path = tmp_path / "model.mnn"
    write_mnn(graph, path, opts, name, feeds)
    _, cos = _worst(run_mnn(path, feeds), ref)
    assert cos >= floor, f"{name} {encoding}: cosine {cos:.6f} < {floor}"


def _storage_types(data: bytes) -> list[int]:
    net = fb.Net.GetRootAs(data, 0)
    kinds = []
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.MainType() == fb.OpParameter.Convolution2D:
            conv = fb.Convolution2D()
            conv.Init(op.Main().Bytes, op.Main().Pos)
            quan = conv.QuanParameter()
            kinds.append(0 if quan is None else quan.Type())
    return kinds


def test_weight_plan_keeps_sensitive_layers_fp16(tmp_path: Path) -> None:
    graph, feeds, ref = _prepare("conv_family", tmp_path)
    opts = MnnOptions(weights="int4", min_cosine=0.9999)
    plan = plan_weights(graph, opts, feeds)
    assert plan.cosine_all_quantized < 0.9999 <= plan.cosine
    assert 0 < len(plan.kept) < plan.layers
    a = write_mnn(graph, tmp_path / "a.mnn", opts, "conv_family", feeds)[-1].read_bytes()
    b = write_mnn(graph, tmp_path / "b.mnn", opts, "conv_family", feeds)[-1].read_bytes()
    assert a == b
    kinds = _storage_types(a)
    assert kinds.count(3) == len(plan.kept) and kinds.count(1) == len(kinds) - len(plan.kept)
    _, cos = _worst(run_mnn(tmp_path / "a.mnn", feeds), ref)
    assert cos >= 0.9999
    # an explicit per-node storage replaces the plan (a reader re-writing a model uses this)
    first = next(n for n in graph.ops() if n.op in ("Conv", "FusedConv"))
    write_mnn(graph, tmp_path / "d.mnn", opts, storage={first.id: WeightStorage("fp32")})
    assert _storage_types((tmp_path / "d.mnn").read_bytes())[0] == 0
    # --mnn-min-cosine 0: every layer table-coded, no plan
    none = MnnOptions(weights="int4", min_cosine=0.0)
    assert plan_weights(graph, none, feeds).kept == []
    write_mnn(graph, tmp_path / "c.mnn", none)
    assert set(_storage_types((tmp_path / "c.mnn").read_bytes())) == {1}


def test_unsupported_ops_listed(tmp_path: Path) -> None:
    onnx.save(opset9_upgrades(), tmp_path / "m.onnx")
    graph = load_model(tmp_path / "m.onnx")
    with pytest.raises(UnsupportedOpsError, match="TopK") as err:
        write_mnn(graph, tmp_path / "m.mnn", MnnOptions(), "m.onnx")
    assert any("TopK" in op and names == ["topk_7"] for op, names in err.value.ops.items())
    assert "m.onnx" in str(err.value)
    # the CLI's legalization writes that TopK as topk-stable-indices; an op MNN lacks exits 2
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "ok"), "--emit", "mnn"]) == 0
    onnx.save(
        text_model("g (float[2, 3, 3] x) => (float[2] y) { y = Det (x) }", opset=17), tmp_path / "d.onnx"
    )
    out = tmp_path / "o"
    assert main(["compile", str(tmp_path / "d.onnx"), "-o", str(out), "--emit", "mnn", "--no-verify"]) == 2
    assert not out.exists() and not (tmp_path / "m.mnn").exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--mnn-weights", "int8"],  # without --emit mnn
        ["--emit", "mnn", "--mnn-scale", "fp16"],  # scale without int weights
        ["--emit", "mnn", "--mnn-weights", "fp16", "--mnn-asymmetric"],
        ["--emit", "mnn", "--mnn-weights", "int8", "--mnn-block-size", "0"],
        ["--emit", "mnn", "--mnn-weights", "int4", "--mnn-min-cosine", "1.5"],
        ["--emit", "mnn", "--quantize", "fp16"],
    ],
)
def test_cli_flag_errors(flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(ZOO["concat_softmax"](), model)
    assert main(["compile", str(model), "-o", str(tmp_path / "o"), "--no-verify", *flags]) == 2
    assert "kiln: error:" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_missing_or_short_side_file_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(ZOO["conv_family"](), model)
    out = tmp_path / "o"
    args = [
        "compile",
        str(model),
        "-o",
        str(out),
        "--emit",
        "mnn",
        "--external-weights",
        "--mnn-weights",
        "fp16",
    ]
    assert main(args) == 0
    mnn = out / "model.mnn"
    weight = side_file(mnn)
    data = weight.read_bytes()
    feeds = zoo_feeds(ZOO["conv_family"]())
    assert run_mnn(mnn, feeds)
    weight.write_bytes(data[:-4])
    with pytest.raises(ModelFileError, match="has .* bytes, the model needs"):
        run_mnn(mnn, feeds)
    weight.unlink()
    with pytest.raises(ModelFileError, match="missing"):
        run_mnn(mnn, feeds)
    np.savez(tmp_path / "x.npz", **feeds)  # type: ignore[arg-type]
    assert main(["run", str(mnn), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")]) == 2


def test_output_names_edge_cases(tmp_path: Path) -> None:
    """An output consumed inside the graph, one value under two output names, an input as output."""
    from compiler.ir.types import DType, TensorType

    g = Graph("edges")
    x = g.add_input("x", TensorType(DType.FLOAT32, (1, 2, 5, 5)))
    w = g.add_constant(np.random.default_rng(0).standard_normal((3, 2, 3, 3)).astype(np.float32), "w")
    y = g.value(g.add_node("Conv", [x, w], {"pads": (1, 1, 1, 1)}, name="conv", output_names=["y"]))
    z = g.value(g.add_node("Relu", [y], name="relu", output_names=["z"]))
    g.set_outputs([y, z, y, x], names=["y", "z", "y_again", "x_out"])
    path = tmp_path / "m.mnn"
    write_mnn(g, path, MnnOptions())
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)}
    got = run_mnn(path, feeds)
    assert list(got) == ["y", "z", "y_again", "x_out"]
    np.testing.assert_allclose(got["z"], np.maximum(got["y"], 0), rtol=0, atol=0)
    np.testing.assert_array_equal(got["y_again"], got["y"])
    np.testing.assert_array_equal(got["x_out"], feeds["x"])
    net = fb.Net.GetRootAs(path.read_bytes(), 0)
    names = [net.TensorName(i).decode() for i in range(net.TensorNameLength())]
    assert len(set(names)) == len(names) and "y__before_tr" in names
