"""Kiln's int8 conv kernels for aarch64, run for real on the emulated device and compared bit-exactly.

``arm-dotprod`` builds SDOT kernels (activations shifted to int8, ``128 * sum(w)`` as the accumulator's
start); ``arm`` builds the plain NEON path (LLVM's widening ``smlal``). Every case of every target is
compiled into one library per target, uploaded once and called kernel by kernel over TVM RPC; the
outputs must equal the numpy reference of tests/helpers/int8_conv_reference.py exactly. The disassembly
must show ``sdot`` in the dotprod conv kernels and NEON vector instructions outnumbering scalar ones.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm

from backends.tvm.build import export
from backends.tvm.kernels.conv2d_int8 import dot_kind, qconv2d_kernel
from backends.tvm.kernels.qconv_spec import QUANT_RANGES, QConv2dSpec
from backends.tvm.rpc import RpcAddress, connect
from backends.tvm.target import resolve_target
from tests.helpers.int8_conv_reference import CASES, P1, case_inputs, reference, run_packed

TARGETS = {"sdot": resolve_target("arm-dotprod"), "neon": resolve_target("arm")}
ARM_CASES: dict[str, QConv2dSpec] = {
    **{
        k: CASES[k]
        for k in (
            "3x3_s1_p1_relu_xzero",
            "1x1_int8_out",
            "3x3_s2",
            "stem_c3",
            "dilated_asym_pad",
            "depthwise_3x3",
            "float_out_hard_swish",
            "ob12_hard_sigmoid",
            "ob8",
            "ob8_clip",
        )
    },
    "residual_hard_swish_int8": QConv2dSpec(
        1,
        32,
        9,
        9,
        32,
        (3, 3),
        pads=P1,
        x_zero=40,
        y_scale=0.07,
        y_zero=20,
        activation="hard_swish",
        residual=True,
        r_scale=0.031,
        r_zero=-3,
        r_dtype="int8",
    ),  # fmt: skip
    "full_range_x_zero_0": QConv2dSpec(1, 64, 6, 6, 32, (3, 3), pads=P1, out_dtype="float32", x_zero=0),
    "full_range_x_zero_255": QConv2dSpec(1, 64, 6, 6, 32, (3, 3), pads=P1, out_dtype="float32", x_zero=255),
}
_FUNC = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")
_VECTOR_OPERAND = re.compile(r"\bv\d+\.|\bq\d+\b")


def _inputs(name: str, spec: QConv2dSpec) -> tuple[Any, ...]:
    if not name.startswith("full_range"):
        return case_inputs(spec, seed=len(name))
    # extremes: u8 0/255 against s8 -128/-127/127 (|acc| near 255*128*576; the shifted terms hit -128*-128)
    rng = np.random.default_rng(5)
    x = rng.choice(np.array([0, 255], np.uint8), (1, 64, 6, 6))
    x[:, :, :3] = 255 if spec.x_zero == 0 else 0
    w = rng.choice(np.array([-128, -127, 127], np.int8), (32, 64, 3, 3))
    w[:8] = -128
    return x, w, None, 1.0, np.ones(32, np.float32), None


@pytest.fixture(scope="module")
def arm_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, str]]]:
    """Per target: one cross-compiled library holding every case's kernel, and case -> symbol."""
    out: dict[str, tuple[Path, dict[str, str]]] = {}
    d = tmp_path_factory.mktemp("arm_int8")
    for path, target in TARGETS.items():
        kernels = {case: qconv2d_kernel(spec, target) for case, spec in ARM_CASES.items()}
        lib = tvm.compile(tvm.IRModule({k.name: k.func for k in kernels.values()}), target.tvm_target())
        so = d / f"{path}.so"
        export(lib, so, target)
        out[path] = (so, {case: k.name for case, k in kernels.items()})
    return out


@pytest.fixture(scope="module")
def remote_libs(
    arm_rpc: RpcAddress, arm_libs: dict[str, tuple[Path, dict[str, str]]]
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """One RPC session with both libraries uploaded and loaded: (session, path -> remote module)."""
    sess = connect(arm_rpc, timeout_s=60.0)
    mods = {}
    for path, (so, _) in arm_libs.items():
        sess.upload(str(so), so.name)
        mods[path] = sess.load_module(so.name)
    yield sess, mods
    del mods, sess


def _run_remote(remote: tuple[Any, dict[str, Any]], path: str, symbol: str, spec: QConv2dSpec,
                inputs: tuple[Any, ...]) -> np.ndarray:  # fmt: skip
    sess, mods = remote
    return run_packed(mods[path][symbol], sess.cpu(), spec, *inputs)


@pytest.mark.parametrize("path", list(TARGETS))
@pytest.mark.parametrize("case", list(ARM_CASES))
def test_arm_qconv_matches_reference_exactly(
    case: str,
    path: str,
    arm_libs: dict[str, tuple[Path, dict[str, str]]],
    remote_libs: tuple[Any, dict[str, Any]],
) -> None:
    spec = ARM_CASES[case]
    assert dot_kind(spec, TARGETS[path]) == ("depthwise" if spec.is_depthwise else path)
    inputs = _inputs(case, spec)
    got = _run_remote(remote_libs, path, arm_libs[path][1][case], spec, inputs)
    x, w, b, xs, ws, r = inputs
    exp = reference(x, w, b, xs, ws, spec, r)
    assert got.dtype == exp.dtype and got.shape == exp.shape
    if spec.out_dtype != "float32":
        lo, hi = QUANT_RANGES[spec.out_dtype]
        assert len(np.unique(exp)) > 20 and (exp > lo).mean() > 0.3 and (exp < hi).mean() > 0.3
    elif case.startswith("full_range"):
        assert np.abs(exp).max() > 2**22
    np.testing.assert_array_equal(got, exp)


def _instruction_counts(so: Path, name_part: str) -> dict[str, int]:
    """Instructions in functions whose symbol holds ``name_part`` (TVM's parallel lambdas are local
    labels, so objdump lists them under the kernel's ``_compute_`` symbol): vector (a ``vN.``/``qN``
    operand), scalar (the rest), and ``sdot``."""
    dis = subprocess.run(
        ["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn", str(so)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    counts = {"functions": 0, "vector": 0, "scalar": 0, "sdot": 0, "sadalp": 0}
    inside = False
    for line in dis.splitlines():
        m = _FUNC.match(line)
        if m:
            inside = name_part in m.group(1) and m.group(1).endswith("_compute_")
            counts["functions"] += inside
            continue
        parts = line.split("\t")
        if not inside or len(parts) < 2 or not parts[1].strip():
            continue
        operands = parts[2] if len(parts) > 2 else ""
        vector = bool(_VECTOR_OPERAND.search(operands))
        counts["vector" if vector else "scalar"] += 1
        counts["sdot"] += parts[1].strip() == "sdot"
        counts["sadalp"] += parts[1].strip() == "sadalp"
    return counts


@pytest.mark.parametrize("path", list(TARGETS))
def test_conv_kernels_are_neon_and_dotprod_uses_sdot(
    path: str, arm_libs: dict[str, tuple[Path, dict[str, str]]]
) -> None:
    """Static counts over each whole kernel (pad, weight sum, dot nest, epilogue, parallel launch)."""
    so, symbols = arm_libs[path]
    total = {"vector": 0, "scalar": 0}
    for case, spec in ARM_CASES.items():
        if spec.is_depthwise:
            continue
        c = _instruction_counts(so, symbols[case])
        assert c["functions"] == 1, (case, c)
        total = {k: total[k] + c[k] for k in total}
        if path == "sdot":
            assert c["vector"] > 1.2 * c["scalar"], f"{path} {case}: {c}"
            assert c["sdot"] >= spec.out_block // 4 and c["sadalp"] == 0, f"{case}: {c}"
        else:
            # ob8's small tile leaves its static count near even (315 vector / 330 scalar)
            assert c["vector"] > 0.9 * c["scalar"], f"{path} {case}: {c}"
            assert c["sdot"] == 0 and c["sadalp"] >= spec.out_block // 2, f"{case}: {c}"
    assert total["vector"] > 1.15 * total["scalar"], f"{path}: {total}"


def test_x86_and_plain_arm_kinds_unchanged() -> None:
    spec = ARM_CASES["3x3_s2"]
    assert dot_kind(spec, resolve_target("x86-avx512")) == "vnni"
    assert dot_kind(spec, resolve_target("x86-avx2")) == "avx2"
    assert dot_kind(replace(spec, out_block=6), TARGETS["sdot"]) == "plain"  # SDOT needs 4-channel groups
    assert dot_kind(replace(spec, out_block=6), TARGETS["neon"]) == "plain"
