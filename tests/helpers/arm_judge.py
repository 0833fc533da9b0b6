"""One zoo model on the emulated aarch64 board, judged as Kiln's verification would judge it.

Shared by ``tests/test_tvm_arm_zoo.py`` (eight models) and ``benchmarks/zoo_arm.py`` (the whole
zoo): compile for ``--target arm`` without verification (the host cannot run aarch64 code), run
once over TVM RPC under qemu on the given inputs, and compare with onnxruntime on x86 by the fp32
rule (max rel 1e-4, or within 4x onnxruntime's own distance from the float64 interpreter).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from backends.tvm.rpc import RpcAddress, run_remote
from compiler.cli import main
from compiler.runners import run_onnxruntime
from compiler.verification import TOLERANCES, compare_outputs, exact_outputs
from frontends.registry import load_model

__all__ = ["ArmJudgement", "judge_on_arm"]


@dataclass
class ArmJudgement:
    """The compile's exit code, then (if it built) each output's check."""

    rc: int
    checks: list[dict[str, Any]] = field(default_factory=list)
    why_not: str = ""

    @property
    def passed(self) -> bool:
        """Built, ran, and every output passed."""
        return self.rc == 0 and bool(self.checks) and all(c["passed"] for c in self.checks)


def judge_on_arm(
    model: Path, inputs: Path, out: Path, rpc: RpcAddress, timeout_s: float = 300.0
) -> ArmJudgement:
    """Compile ``model`` for arm into ``out``, run it on ``rpc`` with ``inputs`` and judge it."""
    rc = main(["compile", str(model), "--target", "arm", "-o", str(out), "--no-verify"])
    if rc != 0:
        return ArmJudgement(rc, why_not=f"kiln compile exited {rc}")
    manifest = json.loads((out / "manifest.json").read_text())
    art = next(a for a in manifest["artifacts"] if a["kind"] == "tvm")
    assert art["target"] == "arm", art
    feeds = dict(np.load(inputs))
    got = run_remote(out / art["path"], feeds, rpc, timeout_s=timeout_s)
    ref = run_onnxruntime(model, feeds)
    exact = exact_outputs(load_model(model), feeds)
    if exact.outputs is None:
        return ArmJudgement(rc, why_not=f"no float64 result: {exact.why_not}")
    checks = compare_outputs(got, ref, TOLERANCES["fp32"], exact.outputs)
    return ArmJudgement(rc, [c.as_dict() for c in checks])
