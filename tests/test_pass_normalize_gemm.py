"""normalize-gemm: canonical Gemm (transA=0, transB=trans_b, alpha=beta=1) vs onnxruntime.

Numerics: max|diff| <= TOL * max(1, max|ref|); fp32 TOL 1e-6 (a transposed operand is
bit-exact; a folded alpha/beta rounds each weight once: measured <= 1.9e-8).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.ir.graph import Graph
from compiler.pass_infra import PassContext
from frontends.onnx.loader import load_onnx
from passes.normalize_gemm import NormalizeGemm
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

TOL = 1e-6
CASES = {
    # name: (attrs, A shape, B shape, B const?, C shape or None, C const?)
    "transA-constB": ("<transA=1, transB=0>", (6, 4), (6, 5), True, (5,), True),
    "alpha-beta": ("<alpha=0.3, beta=2.5, transB=1>", (4, 6), (5, 6), True, (1, 5), True),
    "dynamic-B": ("<transB=0, alpha=0.5>", (4, 6), (6, 5), False, None, False),
    "dynamic-C": ("<beta=0.25, transB=1>", (4, 6), (5, 6), True, (4, 5), False),
    "beta-zero": ("<beta=0.0, transB=1>", (4, 6), (5, 6), True, (5,), True),
}


def _model(case: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    attrs, sa, sb, bconst, sc, cconst = CASES[case]
    m_rows = sa[1] if "transA=1" in attrs else sa[0]
    n = sb[0] if "transB=1" in attrs else sb[1]
    ins, feeds = [f"float[{sa[0]},{sa[1]}] a"], {"a": rand(*sa, seed=1)}
    consts: dict[str, np.ndarray] = {}
    (consts if bconst else feeds)["b"] = rand(*sb, seed=2)
    if not bconst:
        ins.append(f"float[{sb[0]},{sb[1]}] b")
    args = "a, b"
    if sc is not None:
        (consts if cconst else feeds)["c"] = rand(*sc, seed=3)
        if not cconst:
            ins.append(f"float[{','.join(map(str, sc))}] c")
        args += ", c"
    text = f"g ({', '.join(ins)}) => (float[{m_rows},{n}] y) {{ y = Gemm{attrs}({args}) }}"
    return text_model(text, 17, 8, **consts), feeds


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("trans_b", [1, 0])
def test_normalize_gemm(case: str, trans_b: int) -> None:
    model, feeds = _model(case)
    p = NormalizeGemm(trans_b=trans_b)
    g = assert_pass_matches_ort(model, [p], feeds, max_rel=TOL)
    (gemm,) = [n for n in g.ops() if n.op == "Gemm"]
    a = gemm.attrs
    assert (a.transA, a.transB, a.alpha, a.beta) == (0, trans_b, 1.0, 1.0)
    assert not run_passes(g, [p]).changed
    _assert_inserted(g, case, trans_b)


def _assert_inserted(g: Graph, case: str, trans_b: int) -> None:
    """Constants absorb transposes and scales; dynamic operands get Transpose / Mul nodes."""
    counts = op_counts(g)
    want = {"Gemm": 1}
    if case == "transA-constB":
        want |= {"Transpose": 1}  # A is a graph input
    if case == "dynamic-B":
        want |= {"Mul": 1} | ({"Transpose": 1} if trans_b == 1 else {})
    if case == "dynamic-C":
        want |= {"Mul": 1}
    assert counts == want
    if case == "beta-zero":
        (gemm,) = g.ops()
        assert len([v for v in g.inputs_of(gemm) if v is not None]) == 2  # C dropped


def test_canonical_gemm_untouched() -> None:
    model = text_model(
        "g (float[4,6] a) => (float[4,5] y) { y = Gemm<transB=1>(a, b, c) }",
        17,
        8,
        b=rand(5, 6),
        c=rand(5),
    )
    g = load_onnx(model)
    ctx = PassContext()
    assert not run_passes(g, ["normalize-gemm"], ctx).changed
    assert not ctx.near_misses  # "already canonical" is not worth reporting


def test_integer_gemm_refused() -> None:
    model = text_model(
        "g (int32[2,3] a, int32[3,2] b) => (int32[2,2] y) { y = Gemm<alpha=2.0>(a, b) }", 17, 8
    )
    g = load_onnx(model)
    ctx = PassContext()
    assert not run_passes(g, ["normalize-gemm"], ctx).changed
    assert [m.reason for m in ctx.near_misses] == ["Gemm is not float"]


def test_every_backend_reads_the_normalized_gemm(tmp_path: Path) -> None:
    """transA, transB = 0, alpha and beta: MNN, CANN and TVM lower only the canonical Gemm, which
    their legalization (normalize-gemm) makes; each artifact matches onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper

    from compiler.cli import main

    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 8)).astype(np.float32)
    c = rng.standard_normal((8,)).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "W", "C"], ["y"], alpha=0.5, beta=2.0, transA=1, transB=0)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(c, "C")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "gemm.onnx"
    onnx.save(model, path)
    out = tmp_path / "out"
    assert main(["compile", str(path), "-o", str(out), "--emit", "onnx,mnn,cann", "--target", "cpu"]) == 0
    ver = json.loads((out / "manifest.json").read_text())["verification"]
    assert ver["passed"] and len(ver["artifacts"]) == 4
