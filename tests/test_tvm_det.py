"""Det in TVM: LU with partial pivoting in float64 (backends/tvm/lowering/linalg_extra.py).

Matrices with batch dims [2, 3, 5, 5], a single [4, 4] (0-d output) and [1, 1]; among them a singular
one (two equal rows: exactly 0), one with a negative determinant, one with a zero on the diagonal
that needs a row swap, and a nearly singular one. The library equals numpy's float64 det of the same
float32 inputs within 1e-6 · max(1, |det|) per matrix (measured: <= 1e-13 relative), and onnxruntime
(float32 LU) within 1e-4 · max(1, |det|). CUDA (sm_90, built here, nothing run): the kernel is bound.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import TensorProto, helper

from backends.tvm.build import compile_module
from backends.tvm.cuda_build import cuda_ptx
from backends.tvm.emit import prepare_graph
from backends.tvm.lower import lower_graph
from backends.tvm.target import resolve_target
from compiler.ir.graph import Graph
from compiler.ir.types import DType, TensorType
from compiler.runners import run_onnxruntime
from compiler.support_matrix import support_matrix

SHAPES = {"a": (2, 3, 5, 5), "b": (4, 4), "c": (1, 1)}


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    a = rng.normal(0, 1, SHAPES["a"]).astype(np.float32)
    a[0, 0, 3] = a[0, 0, 1]  # two equal rows: singular
    a[0, 1] = np.eye(5, dtype=np.float32)[[1, 0, 2, 3, 4]] * 2  # a permutation: det = -32, zero pivots
    a[1, 2, 4] = a[1, 2, 0] + np.float32(1e-3) * a[1, 2, 2]  # nearly singular
    a[1, 0, :, 0] = 0.0  # a zero column: singular
    b = np.array([[0, 2, 1, 0], [3, 0, 0, 1], [1, 1, 0, 2], [0, 4, 2, 1]], np.float32)  # zero diagonal
    c = np.array([[-2.5]], np.float32)
    return {"a": a, "b": b, "c": c}


def _graph() -> Graph:
    g = Graph("det")
    outs = []
    for name, shape in SHAPES.items():
        x = g.add_input(name, TensorType(DType.FLOAT32, shape))
        outs.append(g.value(g.add_node("Det", [x], name=f"det_{name}")))
    g.set_outputs(outs, [f"det_{k}" for k in SHAPES])
    return g


def _onnx_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Det", [k], [f"det_{k}"]) for k in SHAPES]
    ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in SHAPES.items()]
    outs = [
        helper.make_tensor_value_info(f"det_{k}", TensorProto.FLOAT, list(s[:-2])) for k, s in SHAPES.items()
    ]
    return helper.make_model(
        helper.make_graph(nodes, "det", ins, outs), opset_imports=[helper.make_opsetid("", 17)]
    )


def _build(target_name: str) -> object:
    target = resolve_target(target_name)
    legal, _ = prepare_graph(_graph(), target)
    return compile_module(lower_graph(legal, target).mod, target)


def test_cpu_matches_numpy_and_onnxruntime() -> None:
    import tvm
    from tvm import relax

    feeds = _inputs()
    vm = relax.VirtualMachine(_build("cpu"), tvm.cpu())
    res = vm["main"](*[tvm.runtime.tensor(feeds[k], tvm.cpu()) for k in SHAPES])
    ort = run_onnxruntime(_onnx_model().SerializeToString(), feeds)
    for i, k in enumerate(SHAPES):
        got = res[i].numpy()
        exact = np.linalg.det(feeds[k].astype(np.float64))
        assert got.shape == exact.shape == SHAPES[k][:-2] and got.dtype == np.float32, k
        scale = np.maximum(1.0, np.abs(exact))
        assert np.all(np.abs(got - exact) <= 1e-6 * scale), (k, got, exact)
        assert np.all(np.abs(got - ort[f"det_{k}"]) <= 1e-4 * scale), (k, got, ort[f"det_{k}"])
    d = res[0].numpy()
    assert d[0, 0] == 0.0 and d[1, 0] == 0.0  # singular: exactly zero
    assert d[0, 1] == -32.0  # the permutation's sign
    assert float(res[1].numpy()) == float(np.round(np.linalg.det(feeds["b"].astype(np.float64))))
    assert float(res[2].numpy()) == -2.5


def test_cuda_binds_the_kernel() -> None:
    ex = _build("cuda:sm_90")  # the CUDA pipeline refuses a kernel without a thread binding
    ptx = cuda_ptx(ex, "sm_90")
    bounds = re.findall(r"\.entry (kiln_det\w*)\([^{]*?\.maxntid (\d+)", ptx, flags=re.S)
    assert bounds and all(int(t) > 1 for _, t in bounds), bounds


def test_support_matrix_lists_tvm_native() -> None:
    assert support_matrix(["tvm"]).rows["Det"]["tvm"].status == "native"
