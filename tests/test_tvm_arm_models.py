"""Every shared model compiled for `--target arm`, run for real on the emulated aarch64 device.

fp32 matches onnxruntime (x86) on the real inputs to max rel 1e-4; int8 matches Kiln's QDQ
ONNX model in onnxruntime (cosine >= 0.999) where exact QDQ arithmetic does (see
test_tvm_models.py: pan and yunet flip requantization ties), and Kiln's integer reference
everywhere. `kiln run --rpc` and `kiln bench --rpc` drive the same device.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from backends.tvm.emit import prepare_graph
from backends.tvm.rpc import RpcAddress, run_remote
from backends.tvm.target import resolve_target
from compiler.cli import main
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.pass_infra import make_pass
from compiler.pass_manager import PassManager
from compiler.runners import run_onnxruntime
from frontends.registry import load_model
from tests.conftest import MODEL_STEMS, MODELS
from tests.helpers.numerics import agreement
from tests.helpers.shared_compile import compile_shared, real_feeds

TIES_FLIP = {"pan_mnv3s_skin_clothes_hair"}


_feeds = real_feeds


def _lowered_graph(model: Path, target: str) -> Graph:
    """The integer graph the backend lowered for the exported QDQ ``model``.

    The compile fused each Conv with its activation (fuse-conv-bias-act) before quantizing; the QDQ
    export spells that as Conv -> act, so fuse them again before fuse-quantized-ops (prepare_graph)
    builds the same kiln::QConv nodes: QConv(relu) requantizes in float64 in one step, which
    QConv(float out) -> Relu -> QuantizeLinear does not.
    """
    g = load_model(model)
    PassManager([make_pass("fuse-conv-bias-act")]).run(g)
    return prepare_graph(g, resolve_target(target))[0]


def _compile(stem: str, out: Path, int8: bool, target: str = "arm") -> dict:
    man = compile_shared(stem, out, (target,), int8=int8, emit=("onnx",) if int8 else ())
    art = next(a for a in man["artifacts"] if a["kind"] == "tvm")
    assert art["path"] == f"{target}/model.so" and art["target"] == target
    return art


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_fp32_on_emulated_arm_matches_onnxruntime(stem: str, tmp_path: Path, arm_rpc: RpcAddress) -> None:
    _compile(stem, tmp_path / "out", int8=False)
    feeds = _feeds(stem)
    got = run_remote(tmp_path / "out" / "arm" / "model.so", feeds, arm_rpc, timeout_s=120.0)
    ref = run_onnxruntime(MODELS / f"{stem}.onnx", feeds)
    for name in ref:
        m = agreement(got[name], ref[name])
        assert m.max_rel <= 1e-4, f"{stem} {name}: max_rel {m.max_rel:.3g}"


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_int8_on_emulated_arm(stem: str, tmp_path: Path, arm_rpc: RpcAddress) -> None:
    out = tmp_path / "out"
    _compile(stem, out, int8=True)
    feeds = _feeds(stem)
    got = run_remote(out / "arm" / "model.so", feeds, arm_rpc, timeout_s=120.0)
    graph = _lowered_graph(out / "model.onnx", "arm")
    exact = run_graph(graph, feeds)
    qdq = run_onnxruntime(out / "model.onnx", feeds)
    for name in qdq:
        m = agreement(got[name], exact[name])
        assert m.cosine >= 0.99999, f"{stem} {name} vs Kiln's integer reference: {m}"
        if stem not in TIES_FLIP:
            c = agreement(got[name], qdq[name]).cosine
            assert c >= 0.999, f"{stem} {name} vs the QDQ model in onnxruntime: cosine {c:.6f}"


def test_kiln_run_and_bench_with_rpc(
    tmp_path: Path, arm_rpc: RpcAddress, capsys: pytest.CaptureFixture[str]
) -> None:
    stem = "yunet_n_320"
    _compile(stem, tmp_path / "out", int8=False)
    lib = tmp_path / "out" / "arm" / "model.so"
    x = MODELS / "data" / f"{stem}.npz"
    assert (
        main(["run", str(lib), "--inputs", str(x), "-o", str(tmp_path / "y.npz"), "--rpc", str(arm_rpc)]) == 0
    )
    got = dict(np.load(tmp_path / "y.npz"))
    ref = run_onnxruntime(MODELS / f"{stem}.onnx", _feeds(stem))
    assert agreement(got["obj_8"], ref["obj_8"]).max_rel <= 1e-4
    capsys.readouterr()
    assert (
        main(["bench", str(lib), "--inputs", str(x), "--rpc", str(arm_rpc), "--rounds", "3", "--json"]) == 0
    )
    rep = json.loads(capsys.readouterr().out)
    assert rep["rounds"] == 3 and rep["median_ms"] > 0 and str(arm_rpc) in rep["artifact"]


def test_int8_dotprod_on_emulated_arm(tmp_path: Path, arm_rpc: RpcAddress) -> None:
    """armv8.2 dotprod: the int8 convs run SDOT kernels and still equal Kiln's integer reference."""
    stem = "ppocr_mobile_v2_cls"
    art = _compile(stem, tmp_path / "out", int8=True, target="arm-dotprod")
    rules = {k["rule"] for k in art["details"]["kernels"]}
    assert "qconv2d_sdot" in rules, rules
    feeds = _feeds(stem)
    got = run_remote(tmp_path / "out" / "arm-dotprod" / "model.so", feeds, arm_rpc, timeout_s=120.0)
    graph = _lowered_graph(tmp_path / "out" / "model.onnx", "arm-dotprod")
    exact = run_graph(graph, feeds)
    qdq = run_onnxruntime(tmp_path / "out" / "model.onnx", feeds)
    for name in qdq:
        assert agreement(got[name], exact[name]).cosine >= 0.99999
        assert agreement(got[name], qdq[name]).cosine >= 0.999
