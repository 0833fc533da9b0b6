"""kiln::WeightOnlyMatMul in TVM: the dequantization fused into the matrix product.

* One graph of six weight-only layers (bits 4 and 8, blocks 32/64/128, fp16/fp32 scales, symmetric
  and asymmetric, K a multiple of the block or not, with and without bias, 2-D and 3-D A) compiled
  for the host CPU equals the op's numpy reference within 1e-5 · max(1, max|e|) (measured <= 5e-7).
  The library's constants are the levels, int8 Qᵀ [K, N] for 8 bits and two 4-bit levels a byte
  (int8 [ceil(K/2), N]) for 4 bits, no float32 weight of N·K values; every layer is one kernel
  with the register-tiled schedule (``weight-only-matmul``), except N = 6 (no vector width
  divides it), which the generic schedule takes with its reduction rule.
* CUDA (sm_90, built here with nvcc, nothing run): the pipeline accepts the functions (it refuses
  any kernel without a thread binding) and each weight-only kernel is bound to more than one thread.
* ViT-Tiny ``--quantize int4w --emit onnx --target cpu``: the library equals onnxruntime running the
  exported MatMulNBits model within 1e-5 (max rel; measured 5.9e-7), both verified against fp32.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from backends.tvm.build import compile_module
from backends.tvm.cuda_build import cuda_ptx
from backends.tvm.emit import prepare_graph
from backends.tvm.lower import lower_graph
from backends.tvm.target import resolve_target
from compiler.cli import main
from compiler.input_spec import load_inputs
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.ir.types import DType, TensorType
from compiler.ops.fused import KILN
from compiler.ops.weight_only import WeightOnlyMatMulAttrs
from compiler.runners import run_artifact, run_onnxruntime
from compiler.support_matrix import support_matrix
from tests.helpers.numerics import assert_close
from tests.helpers.weight_only_graphs import Layer, weight_only_graph
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

TOL = 1e-5
# (a shape, N, bits, block, scale dtype, symmetric, bias)
LAYERS: list[Layer] = [
    ((2, 5, 256), 48, 4, 32, "fp16", True, True),
    ((7, 200), 40, 4, 64, "fp32", False, False),  # K = 200: a short last block
    ((1, 9, 768), 64, 8, 128, "fp16", False, True),
    ((3, 320), 24, 8, 32, "fp32", True, False),
    ((4, 4, 128), 32, 4, 128, "fp16", False, True),
    ((1, 96), 16, 8, 64, "fp16", True, True),  # K = 96: 1.5 blocks
    ((3, 64), 6, 4, 32, "fp32", False, True),  # N = 6: left to the generic schedule
]


def _graph() -> tuple[Graph, dict[str, np.ndarray]]:
    return weight_only_graph(LAYERS, seed=0)


def test_cpu_matches_the_reference_with_packed_levels_in_the_library() -> None:
    import tvm
    from tvm import relax

    g, feeds = _graph()
    ref = run_graph(g, feeds)
    target = resolve_target("cpu")
    legal, _ = prepare_graph(g, target)
    assert {n.qualified_op for n in legal.ops()} == {"kiln::WeightOnlyMatMul"}
    lowered = lower_graph(legal, target)
    mod = lowered.mod
    tiled = [e for e in lowered.kernels if e["kernel"].startswith("kiln_weight_only_matmul")]
    assert len(tiled) == len(LAYERS) - 1 and {e["rule"] for e in tiled} == {"weight-only-matmul"}
    seen: list[Any] = []
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, lambda e: seen.append(getattr(e, "value", None)))
    consts: list[Any] = [c for c in seen if isinstance(c, tvm.runtime.Tensor)]  # the constants' data
    levels = [(c.dtype, tuple(c.shape)) for c in consts if c.dtype == "int8"]
    # Qᵀ [K, N], or packed [ceil(K / 2), N]
    want = [
        ("int8", (a[-1], n)) if bits == 8 else ("int8", ((a[-1] + 1) // 2, n)) for a, n, bits, *_ in LAYERS
    ]
    assert sorted(x for x in levels if x in want) == sorted(want)
    unpacked = [("int8", (a[-1], n)) for a, n, bits, *_ in LAYERS if bits == 4]
    assert not [x for x in levels if x in unpacked]  # no 4-bit level takes a byte
    big_float = [c for c in consts if c.dtype == "float32" and np.prod(c.shape) >= 16 * 96]
    assert not big_float, [tuple(c.shape) for c in big_float]  # no dequantized weight
    log: list[dict[str, str]] = []
    ex = compile_module(mod, target, log)
    generic = [e for e in log if e["kernel"].startswith("kiln_weight_only_matmul")]
    assert [e["rule"] for e in generic] == ["generic:reduction"]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    res = vm["main"](*[tvm.runtime.tensor(feeds[f"a{i}"], tvm.cpu()) for i in range(len(LAYERS))])
    for i, name in enumerate(g.output_names):
        e = ref[name]
        got = res[i].numpy()
        assert_close(got, e, rtol=0.0, atol=TOL * max(1.0, float(np.abs(e).max())), what=name)


def test_cuda_binds_the_fused_kernels() -> None:
    g, _ = _graph()
    target = resolve_target("cuda:sm_90")
    legal, _ = prepare_graph(g, target)
    ex = compile_module(lower_graph(legal, target).mod, target)  # refuses an unbound kernel
    ptx = cuda_ptx(ex, "sm_90")
    bounds = dict(re.findall(r"\.entry (kiln_weight_only_matmul\w*)\([^{]*?\.maxntid (\d+)", ptx, flags=re.S))
    assert len(bounds) == len(LAYERS), sorted(bounds)
    assert all(int(t) > 1 for t in bounds.values()), bounds


def test_support_matrix_lists_tvm_native() -> None:
    cell = support_matrix(["tvm"]).rows["kiln::WeightOnlyMatMul"]["tvm"]
    assert cell.status == "native"


def test_vit_tiny_int4w_library_matches_matmulnbits(zoo: ZooCache, tmp_path: Path) -> None:  # noqa: F811
    m = zoo.get("vit_tiny_patch16_224")
    out = tmp_path / "out"
    args = ["compile", str(m.model), "-o", str(out), "--quantize", "int4w", "--inputs", str(m.inputs)]
    assert main([*args, "--emit", "onnx", "--target", "cpu"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verification"]["passed"]
    (lib,) = [a for a in manifest["artifacts"] if a["path"] == "cpu/model.so"]
    assert lib["precision"] == "int4w"
    # 5.5 M weight-only weights, the 4-bit ones packed two a byte: 4.76 MB (7.24 MB with a byte
    # per level, 23 MB in float32)
    assert (out / "cpu" / "model.so").stat().st_size < 5_200_000
    feeds = load_inputs(m.inputs)
    want = run_onnxruntime(out / "model.onnx", feeds)  # com.microsoft MatMulNBits
    got = run_artifact(out / "cpu" / "model.so", feeds)
    for k, e in want.items():
        assert_close(got[k], e, rtol=0.0, atol=TOL * max(1.0, float(np.abs(e).max())), what=k)


def test_single_row_gemv() -> None:
    """A 2-D A with one row (the GEMV of a decoder step), int4 with zero points."""
    import tvm
    from tvm import relax

    k = 256
    rng = np.random.default_rng(3)
    g = Graph("gemv")
    a = g.add_input("a", TensorType(DType.FLOAT32, (1, k)))
    q = g.add_constant(rng.integers(-8, 8, (64, k)).astype(np.int8), "q")
    s = g.add_constant(rng.uniform(0.01, 0.1, (64, k // 32)).astype(np.float16), "s")
    z = g.add_constant(rng.integers(-8, 8, (64, k // 32)).astype(np.int8), "z")
    node = g.add_node("WeightOnlyMatMul", [a, q, s, z], WeightOnlyMatMulAttrs(4, 32), domain=KILN, name="y")
    g.set_outputs([g.value(node)])
    feeds = {"a": rng.standard_normal((1, k)).astype(np.float32)}
    target = resolve_target("cpu")
    legal, _ = prepare_graph(g, target)
    ex = compile_module(lower_graph(legal, target).mod, target)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(feeds["a"], tvm.cpu())).numpy()
    e = run_graph(g, feeds)["y"]
    assert_close(got, e, rtol=0.0, atol=TOL * max(1.0, float(np.abs(e).max())), what="y")
