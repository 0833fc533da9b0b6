"""`--target arm` with TOPI's sort: TopK runs on the emulated aarch64 device and matches onnxruntime.

TOPI's CPU TopK calls the packed function ``tvm.contrib.sort.topk``, which the runtime-only TVM
keeps in ``libtvm_runtime_extra.so``; the emulated server loads it (``--load-library``,
backends/tvm/arm_emulator.py). Values and indices are exact, ties included (the lower index first).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from backends.tvm.rpc import RpcAddress, run_remote
from compiler.driver import compile_model
from compiler.options import CompileOptions
from compiler.runners import run_onnxruntime


def _topk_model() -> onnx.ModelProto:
    """TopK(x [3, 9], k=4) along the last axis: values and indices."""
    k = helper.make_tensor("k", TensorProto.INT64, [1], [4])
    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1)],
        "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 9])],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, [3, 4]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, [3, 4]),
        ],
        [k],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def test_arm_topk_matches_onnxruntime_exactly(arm_rpc: RpcAddress, tmp_path: Path) -> None:
    model = tmp_path / "topk.onnx"
    onnx.save(_topk_model(), model)
    out = tmp_path / "out"
    compile_model(CompileOptions(model=model, out_dir=out, emit=(), targets=("arm",), verify=False))
    x = np.random.default_rng(5).integers(0, 4, (3, 9)).astype(np.float32)  # many ties
    got = run_remote(out / "arm" / "model.so", {"x": x}, arm_rpc)
    ref = run_onnxruntime(model, {"x": x})
    assert list(got) == ["values", "indices"]
    for name in ref:
        assert got[name].dtype == ref[name].dtype, name
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
