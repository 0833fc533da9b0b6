"""Kiln's int8 dense kernel (kiln::QGemm): bit-exact against the op's numpy reference.

Every case is a generated QGemm (odd K and N, prime M, per-channel and per-tensor weight scales,
uint8/int8 activations, uint8/int8/float32 outputs, with and without bias, the accumulator near its
extremes). The kernels of each x86 path (VNNI, AVX2 ``pmaddwd``, plain int32) are built into one
library per path and run on this host; the aarch64 paths (SDOT, NEON) are cross-compiled, checked for
their instructions, and run on the emulated device over TVM RPC. Then the lowering: a batched
(3-D) QGemm lowers to one packed kernel on CPU targets and to a Relax integer matmul elsewhere, and
a zoo transformer compiled with ``--quantize int8`` runs its dense layers on the kernel and verifies.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm

from backends.tvm.build import export
from backends.tvm.kernels.dense_int8 import qdense_kernel, qdense_kind, qdense_spec
from backends.tvm.kernels.qdense_spec import (
    QDenseSpec,
    pack_qdense_bias,
    pack_qdense_multiplier,
    pack_qdense_weight,
)
from backends.tvm.rpc import RpcAddress, connect
from backends.tvm.target import TargetSpec, resolve_target, why_not_runnable_here
from compiler.ops.qgemm import QGemmAttrs
from compiler.ops.registry import get_op
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

# name -> (M, K, N, in dtype, x_zero, out dtype, bias, per-channel scales)
CASES: dict[str, tuple[int, int, int, str, int, str, bool, bool]] = {
    "u8_to_u8_bias": (32, 128, 128, "uint8", 90, "uint8", True, True),
    "odd_k_n_float_out_per_tensor": (5, 13, 10, "uint8", 200, "float32", True, False),
    "prime_m_i8_to_i8_no_bias": (197, 96, 72, "int8", -9, "int8", False, True),
    "i8_float_out_k30_n33": (7, 30, 33, "int8", 3, "float32", False, True),
    "gemv_u8_to_i8": (1, 64, 48, "uint8", 0, "int8", True, True),
    "full_range_float_out": (6, 256, 32, "uint8", 0, "float32", False, True),
}
X86 = {"vnni": resolve_target("x86-avx512"), "avx2": resolve_target("x86-avx2")}
ARM = {"sdot": resolve_target("arm-dotprod"), "neon": resolve_target("arm")}


def _attrs(name: str, seed: int) -> tuple[QGemmAttrs, dict[str, np.ndarray | None]]:
    m, k, n, in_dt, xz, out_dt, bias, per_ch = CASES[name]
    rng = np.random.default_rng(seed)
    lo, hi = (0, 256) if in_dt == "uint8" else (-128, 128)
    x = rng.integers(lo, hi, (m, k)).astype(in_dt)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    if name.startswith("full_range"):  # |acc| near 255 * 128 * K; SDOT's shifted terms hit -128 * -128
        x = rng.choice(np.array([0, 255], np.uint8), (m, k))
        w = rng.choice(np.array([-128, 127], np.int8), (k, n))
        x[:2], w[:, :4] = 255, -128
    b = rng.integers(-5000, 5000, n).astype(np.int32) if bias else None
    ws = tuple(float(v) for v in rng.uniform(0.001, 0.004, n if per_ch else 1).astype(np.float32))
    y_zero = {"uint8": 120, "int8": -5, "float32": 0}[out_dt]
    x_scale = 0.9 / k  # keeps the integer outputs spread over the grid
    return QGemmAttrs(0, x_scale, xz, ws, 0.05, y_zero, out_dt), {"x": x, "w": w, "b": b}


def _spec(name: str, target: TargetSpec) -> QDenseSpec:
    m, k, n, in_dt, xz, out_dt, _, _ = CASES[name]
    y_zero = {"uint8": 120, "int8": -5, "float32": 0}[out_dt]
    return qdense_spec(m, k, n, target, in_dt, xz, out_dt, y_zero)


def _run(fn: Any, dev: Any, spec: QDenseSpec, a: QGemmAttrs, d: dict[str, Any]) -> np.ndarray:
    w = d["w"]
    args = [d["x"], pack_qdense_weight(w, spec), pack_qdense_bias(d["b"], w, spec)]
    args.append(pack_qdense_multiplier(a.x_scale, a.w_scales, a.y_scale, spec))
    out = tvm.runtime.tensor(np.zeros(spec.out_shape, spec.out_dtype), dev)
    fn(*[tvm.runtime.tensor(v, dev) for v in args], out)
    return out.numpy()


def _check(name: str, got: np.ndarray, a: QGemmAttrs, d: dict[str, Any]) -> None:
    exp = get_op("QGemm", "kiln").reference([d["x"], d["w"], d["b"]], a, 1)[0]
    assert got.dtype == exp.dtype and got.shape == exp.shape
    if a.out_dtype != "float32":
        lo, hi = np.iinfo(exp.dtype).min, np.iinfo(exp.dtype).max
        assert len(np.unique(exp)) > 20 and (exp > lo).mean() > 0.5 and (exp < hi).mean() > 0.5, name
    elif name.startswith("full_range"):
        acc = np.abs(exp / np.asarray(a.w_scales, np.float32) / np.float32(a.x_scale))
        assert acc.max() > 0.9 * 255 * 128 * CASES[name][1]
    np.testing.assert_array_equal(got, exp)


@pytest.fixture(scope="module")
def x86_libs() -> dict[str, tuple[Any, dict[str, tuple[QDenseSpec, str]]]]:
    """Per x86 path (and ``plain``, built for the AVX-512 target): one library of every case."""
    out = {}
    paths = {**X86, "plain": X86["vnni"]}
    for path, target in paths.items():
        specs = {c: _spec(c, target) for c in CASES}
        if path == "plain":
            specs = {c: replace(s, kind="plain") for c, s in specs.items()}
        kernels = {c: qdense_kernel(s, target) for c, s in specs.items()}
        lib = tvm.compile(tvm.IRModule({k.name: k.func for k in kernels.values()}), target.tvm_target())
        out[path] = (lib, {c: (specs[c], kernels[c].name) for c in CASES})
    return out


@pytest.mark.parametrize("path", ["vnni", "avx2", "plain"])
@pytest.mark.parametrize("case", list(CASES))
def test_x86_qdense_matches_reference_exactly(
    case: str, path: str, x86_libs: dict[str, tuple[Any, dict[str, tuple[QDenseSpec, str]]]]
) -> None:
    lib, entries = x86_libs[path]
    spec, symbol = entries[case]
    assert spec.kind == path
    target = X86.get(path, X86["vnni"])  # plain: built for the AVX-512 target
    if reason := why_not_runnable_here(target):  # the instruction set is missing, not a dependency
        pytest.skip(f"{target.name}: {reason} (its code is checked by the build-only tests)")
    a, d = _attrs(case, seed=len(case))
    _check(case, _run(lib[symbol], tvm.cpu(), spec, a, d), a, d)


@pytest.mark.parametrize(("path", "instr"), [("vnni", "vpdpbusd"), ("avx2", "vpmaddwd")])
def test_x86_qdense_uses_its_dot_instruction(
    path: str, instr: str, x86_libs: dict[str, tuple[Any, dict[str, tuple[QDenseSpec, str]]]]
) -> None:
    lib, entries = x86_libs[path]
    asm = lib.mod.inspect_source("asm")
    assert len(re.findall(rf"\b{instr}\b", asm)) >= len(CASES)
    plain_asm = x86_libs["plain"][0].mod.inspect_source("asm")
    assert not re.search(r"\bvpdpbusd\b", plain_asm)
    for spec, symbol in entries.values():  # the kernel's record: op class dense, ISA path = the dot path
        k = qdense_kernel(spec, X86[path])
        assert (k.name, str(k.func.attrs["kiln.isa"]), str(k.func.attrs["kiln.op_class"])) == (
            symbol,
            path,
            "dense",
        )


def test_spec_shift_and_padding_rules() -> None:
    """s maps x to the dot operand's signedness; the pad stage appears only when needed."""
    t = X86["vnni"]
    assert qdense_spec(8, 64, 32, t, "uint8", 3, "uint8", 0).needs_pad is False
    assert qdense_spec(8, 64, 32, t, "int8", 3, "uint8", 0).shift == 128
    assert qdense_spec(8, 62, 32, t, "uint8", 3, "uint8", 0).needs_pad  # K % 4
    prime = qdense_spec(197, 64, 32, t, "uint8", 3, "uint8", 0)  # prime M: rows padded to the tile
    assert prime.row_tile > 1 and prime.rows % prime.row_tile == 0 and prime.rows > 197 and prime.needs_pad
    assert qdense_spec(197, 64, 32, X86["avx2"], "uint8", 3, "uint8", 0).row_tile > 1
    assert qdense_spec(8, 64, 32, ARM["sdot"], "uint8", 3, "uint8", 0).shift == -128
    assert qdense_spec(8, 64, 32, ARM["sdot"], "int8", 3, "uint8", 0).shift == 0
    assert [qdense_kind(t) for t in (*X86.values(), *ARM.values())] == ["vnni", "avx2", "sdot", "neon"]
    assert qdense_kind(resolve_target("cuda")) == "plain"


def test_vnni_tile_accumulators_fit_the_stack() -> None:
    """The register tile's int32 accumulators stay under TVM's stack limit, so the kernel makes no
    workspace call per tile (LLVM keeps a stack tile in registers); a 150-row product (no row padding,
    so no pad stage either) has no TVMBackendAllocWorkspace at all. Must-not-fire: a tile forced to
    5 rows x 4 blocks (1280 bytes) allocates one per tile."""
    from backends.tvm.kernels.dense_int8 import column_tile
    from backends.tvm.schedule_nest import fits_stack

    t = X86["vnni"]
    for m, k, n in ((200, 128, 128), (197, 192, 576), (128, 768, 768), (1500, 384, 384), (8, 64, 32)):
        s = qdense_spec(m, k, n, t, "uint8", 3, "uint8", 0)
        assert fits_stack(s.row_tile * column_tile(s.kind, s.block, s.chunks) * s.block), s
    spec = qdense_spec(150, 128, 128, t, "uint8", 3, "uint8", 0)
    assert spec.row_tile == 3 and not spec.needs_pad

    def allocs(s: QDenseSpec) -> int:
        k = qdense_kernel(s, t)
        lib = tvm.compile(tvm.IRModule({k.name: k.func}), t.tvm_target())
        return lib.mod.inspect_source("ll").count("load ptr, ptr @__TVMBackendAllocWorkspace")

    assert allocs(spec) == 0
    assert allocs(replace(spec, row_tile=5)) == 1


_FUNC = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")


def _arm_counts(so: Path, symbol: str) -> dict[str, int]:
    dis = subprocess.run(
        ["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn", str(so)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    counts = {"functions": 0, "sdot": 0, "sadalp": 0}
    inside = False
    for line in dis.splitlines():
        m = _FUNC.match(line)
        if m:
            inside = symbol in m.group(1) and m.group(1).endswith("_compute_")
            counts["functions"] += inside
            continue
        parts = line.split("\t")
        if inside and len(parts) > 1:
            op = parts[1].strip()
            counts[op] = counts.get(op, 0) + 1
    return counts


ARM_CASES = ("u8_to_u8_bias", "i8_float_out_k30_n33", "full_range_float_out")


@pytest.fixture(scope="module")
def arm_libs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, dict[str, tuple[QDenseSpec, str]]]]:
    out = {}
    d = tmp_path_factory.mktemp("arm_qdense")
    for path, target in ARM.items():
        specs = {c: _spec(c, target) for c in ARM_CASES}
        kernels = {c: qdense_kernel(s, target) for c, s in specs.items()}
        lib = tvm.compile(tvm.IRModule({k.name: k.func for k in kernels.values()}), target.tvm_target())
        so = d / f"{path}.so"
        export(lib, so, target)
        out[path] = (so, {c: (specs[c], kernels[c].name) for c in ARM_CASES})
    return out


@pytest.mark.parametrize(("path", "instr"), [("sdot", "sdot"), ("neon", "sadalp")])
def test_arm_qdense_builds_with_its_dot_instruction(
    path: str, instr: str, arm_libs: dict[str, tuple[Path, dict[str, tuple[QDenseSpec, str]]]]
) -> None:
    so, entries = arm_libs[path]
    for case, (spec, symbol) in entries.items():
        c = _arm_counts(so, symbol)
        assert c["functions"] == 1 and spec.kind == path, (case, c)
        assert c.get(instr, 0) >= spec.block // 4, (case, c)
        assert c.get("sdot", 0) == 0 or path == "sdot", (case, c)


def test_arm_qdense_matches_reference_on_emulated_device(
    arm_rpc: RpcAddress, arm_libs: dict[str, tuple[Path, dict[str, tuple[QDenseSpec, str]]]]
) -> None:
    sess = connect(arm_rpc, timeout_s=60.0)
    for path, (so, entries) in arm_libs.items():
        sess.upload(str(so), so.name)
        mod = sess.load_module(so.name)
        for case, (spec, symbol) in entries.items():
            a, d = _attrs(case, seed=len(case))
            _check(f"{path}:{case}", _run(mod[symbol], sess.cpu(), spec, a, d), a, d)


def _qgemm_graph(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: QGemmAttrs) -> Any:
    from compiler.ir.graph import Graph
    from compiler.ir.types import TensorType

    g = Graph("qgemm_batched")
    ins = [g.add_input("x", TensorType.of(x)), g.add_constant(w, "w"), g.add_constant(b, "b")]
    node = g.add_node("QGemm", ins, attrs, domain="kiln", name="qgemm")
    g.set_outputs(g.outputs_of(node))
    return g


def test_batched_qgemm_lowers_to_one_packed_kernel_and_matches() -> None:
    """x [2, 5, 24] int8, W [10, 24] (trans_b), bias, uint8 out: the leading dims are flattened."""
    from tvm import relax

    from backends.tvm.build import compile_module
    from backends.tvm.lower import lower_graph

    rng = np.random.default_rng(11)
    x = rng.integers(-128, 128, (2, 5, 24)).astype(np.int8)
    w = rng.integers(-128, 128, (10, 24)).astype(np.int8)
    b = rng.integers(-3000, 3000, 10).astype(np.int32)
    ws = tuple(float(v) for v in rng.uniform(0.001, 0.004, 10).astype(np.float32))
    attrs = QGemmAttrs(1, 0.03, -4, ws, 0.05, 100, "uint8")
    target = resolve_target("cpu")
    lowered = lower_graph(_qgemm_graph(x, w, b, attrs), target)
    assert [k["rule"] for k in lowered.kernels] == [f"qdense_{qdense_kind(target)}"]
    vm = relax.VirtualMachine(compile_module(lowered.mod, target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    exp = get_op("QGemm", "kiln").reference([x, w, b], attrs, 1)[0]
    assert got.shape == (2, 5, 10) and len(np.unique(exp)) > 20
    np.testing.assert_array_equal(got, exp)


def test_qgemm_off_cpu_keeps_the_relax_integer_matmul() -> None:
    """Must-not-fire: on CUDA no packed CPU kernel is made (dlight schedules the int32 matmul)."""
    from backends.tvm.lower import lower_graph

    x = np.zeros((4, 16), np.uint8)
    w = np.ones((16, 8), np.int8)
    attrs = QGemmAttrs(0, 0.02, 3, (0.01,), 0.05, 0, "uint8")
    lowered = lower_graph(_qgemm_graph(x, w, np.zeros(8, np.int32), attrs), resolve_target("cuda"))
    assert lowered.kernels == []
    assert "matmul" in lowered.mod.script() and "kiln_qdense" not in lowered.mod.script()


def test_zoo_transformer_int8_runs_dense_layers_on_the_kernel_and_verifies(
    zoo: ZooCache,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    from compiler.cli import main

    m = zoo.get("t5_encoder")
    out = tmp_path / "t5_int8"
    argv = ["compile", str(m.model), "-o", str(out), "--target", "cpu", "--quantize", "int8"]
    assert main([*argv, "--calib", str(m.calib), "--inputs", str(m.inputs), "--no-sensitivity"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (art,) = [a for a in manifest["artifacts"] if a["path"] == "cpu/model.so"]
    dense = art["details"]["kernel_report"]["dense"]
    kind = qdense_kind(resolve_target("cpu"))
    assert dense["isa"] == [kind] and dense["schedules"] == {f"qdense_{kind}": dense["kernels"]}
    assert dense["kernels"] >= 6  # q, k, v, o and the two feed-forward projections of a layer
    (check,) = manifest["verification"]["artifacts"]
    assert manifest["verification"]["passed"] and check["passed"] and check["precision"] == "int8"
    assert min(o["cosine"] for o in check["outputs"]) >= 0.999  # measured 0.99986 against onnxruntime fp32
