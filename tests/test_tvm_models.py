"""`--target cpu` on every shared model: the compiled library against onnxruntime.

fp32: max rel 1e-4 against onnxruntime on the original model (real inputs).
int8: the library against Kiln's own QDQ ONNX model (written by the same compile)
in onnxruntime, cosine >= 0.999 on every output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from backends.tvm.runtime import run_tvm
from compiler.driver import compile_model
from compiler.options import CompileOptions
from compiler.runners import run_onnxruntime
from tests.conftest import MODEL_STEMS, MODELS
from tests.helpers.models import yolo_split_concat_head
from tests.helpers.numerics import agreement
from tests.helpers.shared_compile import compile_shared, real_feeds

FP32_MAX_REL = 1e-4
SMALL_FP32_MAX_REL = 1e-5  # generated models: few ops, float noise only
INT8_MIN_COSINE = 0.999


def _compile(stem: str, out: Path, *, int8: bool, emit: tuple[str, ...] = ()) -> dict:
    return compile_shared(stem, out, ("cpu",), int8=int8, emit=emit, verify=True)


_feeds = real_feeds


@pytest.fixture(scope="module", params=MODEL_STEMS)
def fp32_build(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, dict]:
    stem = request.param
    out = tmp_path_factory.mktemp(f"{stem}_fp32") / "out"
    return stem, out, _compile(stem, out, int8=False)


def test_fp32_matches_onnxruntime(fp32_build: tuple[str, Path, dict]) -> None:
    stem, out, manifest = fp32_build
    assert manifest["verification"]["passed"]
    (art,) = manifest["artifacts"]
    assert art["kind"] == "tvm" and art["path"] == "cpu/model.so" and art["target"] == "cpu"
    feeds = _feeds(stem)
    got = run_tvm(out / "cpu" / "model.so", feeds)
    ref = run_onnxruntime(MODELS / f"{stem}.onnx", feeds)
    assert list(got) == list(ref)
    for name in ref:
        m = agreement(got[name], ref[name])
        assert m.max_rel <= FP32_MAX_REL, f"{stem} {name}: max_rel {m.max_rel:.3g}"


def test_yolo_split_concat_head_matches_onnxruntime(tmp_path: Path) -> None:
    """Split/Concat heads fuse into PrimFuncs where one buffer has a reader per branch; the
    generic schedule used to reverse-inline the first reader and drop that buffer ("Buffer
    unpack_intermediate is used before its definition" inside TVM)."""
    model = tmp_path / "yolo_head.onnx"
    onnx.save(yolo_split_concat_head(), model)
    feeds = {"x": np.random.default_rng(7).standard_normal((1, 8, 16, 16)).astype(np.float32)}
    opts = CompileOptions(
        model=model, out_dir=tmp_path / "out", emit=(), targets=("cpu",), verify=False, progress=False
    )
    compile_model(opts)
    got = run_tvm(tmp_path / "out" / "cpu" / "model.so", feeds)
    ref = run_onnxruntime(model, feeds)
    assert list(got) == ["y"]
    m = agreement(got["y"], ref["y"])
    assert m.max_rel <= SMALL_FP32_MAX_REL, f"max_rel {m.max_rel:.3g}"


def test_fp32_records_layouts_and_kernels(fp32_build: tuple[str, Path, dict]) -> None:
    stem, out, manifest = fp32_build
    details = manifest["artifacts"][0]["details"]
    assert details["target"]["name"] == "cpu"
    assert details["layouts"], "choose-layout decisions are recorded"
    rules = {k["rule"] for k in details["kernels"]}
    assert any(r.startswith("conv2d") for r in rules), rules
    meta = json.loads((out / "cpu" / "model.json").read_text())
    assert [i["name"] for i in meta["inputs"]] == list(_feeds(stem))


# Here even exact QDQ arithmetic differs from onnxruntime: float32 noise in ORT's float convs
# lands values on the other side of .5 requantization ties, and these nets amplify the flips
# (pan: ORT itself is at cosine 0.996 from a float64 evaluation of its own QDQ model; yunet, at
# 0.9990 with the float32 requantize, passes since kiln::QConv requantizes none/relu convs with one
# float64 multiplier). test_int8_equals_kiln_reference below holds for all models,
# and tests/test_quant_ort_parity.py shows every op bit-exact with ORT on ORT's own inputs.
_DIVERGES = {"pan_mnv3s_skin_clothes_hair"}
INT8_CASES = [
    pytest.param(
        s, marks=pytest.mark.xfail(strict=True, reason="tie flips amplified; ORT is no closer to exact")
    )
    if s in _DIVERGES
    else s
    for s in MODEL_STEMS
]


@pytest.mark.parametrize("stem", INT8_CASES)
def test_int8_matches_kiln_qdq_model(stem: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    manifest = _compile(stem, out, int8=True, emit=("onnx",))
    kinds = {a["kind"]: a for a in manifest["artifacts"]}
    assert kinds["tvm"]["precision"] == "int8"
    rules = {k["rule"] for k in kinds["tvm"]["details"]["kernels"]}
    assert any(r.startswith("qconv2d") for r in rules), rules
    feeds = _feeds(stem)
    got = run_tvm(out / "cpu" / "model.so", feeds)
    ref = run_onnxruntime(out / kinds["onnx"]["path"], feeds)
    for name in ref:
        m = agreement(got[name], ref[name])
        assert m.cosine >= INT8_MIN_COSINE, f"{stem} {name}: cosine {m.cosine:.6f}"


def test_same_input_gives_identical_library(tmp_path: Path) -> None:
    stem = "yunet_n_320"
    a = _compile(stem, tmp_path / "a", int8=False)
    b = _compile(stem, tmp_path / "b", int8=False)
    assert (tmp_path / "a" / "cpu" / "model.so").read_bytes() == (
        tmp_path / "b" / "cpu" / "model.so"
    ).read_bytes()
    assert a["artifacts"][0]["sha256"] == b["artifacts"][0]["sha256"]


@pytest.mark.parametrize("stem", ["pan_mnv3s_skin_clothes_hair", "yunet_n_320"])
def test_int8_equals_kiln_reference(stem: str, tmp_path: Path) -> None:
    """The library computes exactly what Kiln's integer graph means: Kiln's interpreter on the
    graph the backend lowered (integer QConv, blocked layouts) agrees to float noise."""
    from backends.tvm.emit import prepare_graph
    from backends.tvm.target import resolve_target
    from compiler.ir.interpreter import run_graph
    from compiler.pass_infra import make_pass
    from compiler.pass_manager import PassManager
    from frontends.registry import load_model

    out = tmp_path / "out"
    _compile(stem, out, int8=True, emit=("onnx",))
    feeds = _feeds(stem)
    # the compile fused Conv + activation before quantizing; the QDQ export spells it Conv -> act:
    # fuse again so that prepare_graph builds the kiln::QConv nodes the library holds (QConv(relu)
    # requantizes in one float64 step, QConv(float out) -> Relu -> QuantizeLinear does not)
    loaded = load_model(out / "model.onnx")
    PassManager([make_pass("fuse-conv-bias-act")]).run(loaded)
    graph, _ = prepare_graph(loaded, resolve_target("cpu"))
    ref = run_graph(graph, feeds)
    got = run_tvm(out / "cpu" / "model.so", feeds)
    for name in ref:
        m = agreement(got[name], ref[name])
        assert m.cosine >= 0.99999 and m.max_rel <= 1e-3, f"{stem} {name}: {m}"
