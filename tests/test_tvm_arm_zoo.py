"""Zoo architectures compiled for ``--target arm`` and run for real on the emulated aarch64 device.

Eight models across the zoo's families (text and audio transformers, a vision transformer, a
hybrid conv/attention net, small CNNs with grouped, depthwise and channel-shuffle layers): each
is compiled for arm without verification (the host cannot run aarch64 code), run once over TVM
RPC under qemu on the zoo's ``inputs.npz``, and judged by Kiln's fp32 verification rule against
onnxruntime on x86 (max rel 1e-4, or within 4x onnxruntime's own distance from the float64
interpreter's result).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from backends.tvm.rpc import RpcAddress, run_remote
from compiler.cli import main
from compiler.runners import run_onnxruntime
from compiler.verification import TOLERANCES, compare_outputs, exact_outputs
from frontends.registry import load_model
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

ARM_ZOO = (
    "albert",
    "distilbert",
    "whisper_encoder",
    "hf_vit",
    "mobilevit_xs",
    "squeezenet1_1",
    "lcnet_050",
    "shufflenet_v2_x1_0",
)


@pytest.mark.parametrize("name", ARM_ZOO)
def test_zoo_model_on_emulated_arm_matches_onnxruntime(
    name: str,
    zoo: ZooCache,  # noqa: F811 - the fixture
    tmp_path: Path,
    arm_rpc: RpcAddress,
) -> None:
    m = zoo.get(name)
    out = tmp_path / "out"
    assert main(["compile", str(m.model), "--target", "arm", "-o", str(out), "--no-verify"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    art = next(a for a in manifest["artifacts"] if a["kind"] == "tvm")
    assert art["target"] == "arm"
    feeds = dict(np.load(m.inputs))
    got = run_remote(out / art["path"], feeds, arm_rpc, timeout_s=300.0)
    ref = run_onnxruntime(m.model, feeds)
    exact = exact_outputs(load_model(m.model), feeds)
    assert exact.outputs is not None, exact.why_not
    checks = compare_outputs(got, ref, TOLERANCES["fp32"], exact.outputs)
    assert checks and all(c.passed for c in checks), [c.as_dict() for c in checks if not c.passed]
