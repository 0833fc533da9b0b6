"""The run-time-row dense kernel (:mod:`backends.tvm.lowering.dynamic_dense`) against onnxruntime.

A Gemm whose rows come from NonZero (Compress along axis 0): y = x[c] @ W^T + b. Widths that are a
whole number of vectors and ones that are not (the padded last chunk), a K that is cut into steps
and one that is not, no bias, and 0, 1, 5 and all rows selected (the padded row tile reads the last
row again and never stores it). Agreement: max |kiln - ort| <= 2e-5 * max(1, max |ort|) (float
sums in another order), empty results exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from backends.tvm.lowering.dynamic_dense import K_STEP, pack_columns
from tests.helpers.pass_check import op_counts
from tests.test_tvm_compress_topk import _legal, _ort, _run, _vm

ROWS_TOTAL = 7


def _model(k: int, n: int, bias: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(k * 1000 + n)
    w = nh.from_array((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), "w")
    inits = [w]
    gemm_in = ["rows", "w"]
    if bias:
        inits.append(nh.from_array(rng.standard_normal(n).astype(np.float32), "b"))
        gemm_in.append("b")
    graph = h.make_graph(
        [
            h.make_node("Compress", ["x", "c"], ["rows"], axis=0),
            h.make_node("Gemm", gemm_in, ["y"], transB=1),
        ],
        "dyn_dense",
        [
            h.make_tensor_value_info("x", T.FLOAT, [ROWS_TOTAL, k]),
            h.make_tensor_value_info("c", T.BOOL, [ROWS_TOTAL]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("k", "n", "bias"),
    [(300, 48, True), (2 * K_STEP + 64, 91, True), (40, 20, False), (K_STEP * 3, 256, True)],
)
def test_dynamic_dense_matches_onnxruntime(k: int, n: int, bias: bool) -> None:
    model = _model(k, n, bias)
    legal = _legal(model, "cpu")
    vm = _vm(legal)
    x = np.random.default_rng(k).standard_normal((ROWS_TOTAL, k)).astype(np.float32)
    for picked in ([], [3], [0, 2, 3, 5, 6], list(range(ROWS_TOTAL))):
        c = np.zeros(ROWS_TOTAL, bool)
        c[picked] = True
        feeds = {"x": x, "c": c}
        (want,) = _ort(model, feeds)
        (got,) = _run(vm, legal, feeds)
        assert got.shape == want.shape == (len(picked), n)
        if picked:
            err = float(np.abs(got - want).max())
            assert err <= 2e-5 * max(1.0, float(np.abs(want).max())), (picked, err)


def test_dynamic_dense_is_the_lowering_of_a_run_time_row_gemm() -> None:
    """The Gemm stays one node up to lowering, and becomes the kiln_dynamic_dense kernel."""
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target

    legal = _legal(_model(64, 32, True), "cpu")
    assert op_counts(legal).get("Gemm") == 1
    text = lower_graph(legal, resolve_target("cpu")).mod.script()
    assert text.count("def kiln_dynamic_dense(") == 1


def test_pack_columns_layout() -> None:
    """Wp[c, k, j] = w[k, c*B + j], zero past N."""
    w = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
    wp = pack_columns(w, 4)
    assert wp.shape == (2, 3, 4)
    assert np.array_equal(wp[0], w[:, :4])
    assert np.array_equal(wp[1][:, 0], w[:, 4]) and not wp[1][:, 1:].any()


def test_dynamic_dense_builds_for_arm(tmp_path: Path) -> None:
    """aarch64 (4 lanes: the packed chunks are 4 wide) cross-builds to an ELF shared library."""
    from backends.tvm.build import compile_module, export
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target

    arm = resolve_target("arm")
    lib = tmp_path / "model.so"
    export(compile_module(lower_graph(_legal(_model(300, 91, True), "arm"), arm).mod, arm), lib, arm)
    head = lib.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64
