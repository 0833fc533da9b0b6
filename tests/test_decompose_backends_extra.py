"""The shared decompositions end to end: ``kiln compile --emit mnn,cann`` writes graphs whose
ops MNN and CANN have no native entry for (Softplus, Mish, InstanceNormalization, DepthToSpace,
SpaceToDepth, the composite reductions, Mean, Einsum, LpNormalization, Trilu, Selu, Celu,
Softsign, Tan, Cosh, LRN, Hardmax, ThresholdedRelu, Shrink; BatchNormalization on MNN) and MNN's
runtime verifies within 1e-5 of onnxruntime (the CANN file against its ONNX export).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.cli import main
from tests.helpers.onnx_text import rand, text_model

ACTS_NORMS = """g (float[1,8,6,6] x, float[1,4,12,16] q, float[1,4,10,16] k) =>
    (float[1,2,12,12] d, float[1,8,1,1] r, float[1,4,12,1] e, float[1,4,12,10] t, float[1,8,6,6] s) {
  sp = Softplus(x)
  mi = Mish(sp)
  i = InstanceNormalization(mi, sc, bi)
  d = DepthToSpace<blocksize=2>(i)
  r = ReduceL2(x, hw)
  e0 = Einsum<equation="bhqd,bhkd->bhqk">(q, k)
  e = ReduceLogSumExp(e0, last)
  lp = LpNormalization<axis=-1>(e0)
  t = Trilu<upper=0>(lp)
  ss = Softsign(x)
  s = Selu(ss)
}"""

REDUCE_MOVE = """g (float[1,4,8,8] x, float[1,6,16] a) => (float[1,16,4,4] y, float[1,4] l1, float[1,4] sq,
    float[1,4,1,1] ls, float[1,4,8,8] m, float[1,6,5] b, float[1,4,8,8] tn, float[1,4,8,8] ch,
    float[1,4,8,8] bn, float[1,4,8,8] lr, float[1,6,16] hm) {
  y = SpaceToDepth<blocksize=2>(x)
  l1 = ReduceL1<keepdims=0>(x, hw)
  sq = ReduceSumSquare<keepdims=0>(x, hw)
  ax = Abs(x)
  ls = ReduceLogSum(ax, hw)
  c = Celu<alpha=0.5>(x)
  m = Mean(x, c, ax)
  b = Einsum<equation="bnd,dk->bnk">(a, w)
  tn = Tan(x)
  ch = Cosh(x)
  bn = BatchNormalization(x, bs, bb, bm, bv)
  lr = LRN<size=3, alpha=0.01>(x)
  hm = Hardmax(a)
}"""

THRESHOLDS = """g (float[2,64] x) => (float[2,64] t, float[2,64] s) {
  t = ThresholdedRelu<alpha=0.3>(x)
  s = Shrink<bias=0.1, lambd=0.4>(x)
}"""


def _case(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    hw, last = np.array([2, 3], np.int64), np.array([3], np.int64)
    if name == "acts_norms":
        m = text_model(ACTS_NORMS, 18, 8, sc=rand(8, seed=1), bi=rand(8, seed=2), hw=hw, last=last)
        return m, {
            "x": rand(1, 8, 6, 6, seed=3),
            "q": rand(1, 4, 12, 16, seed=4),
            "k": rand(1, 4, 10, 16, seed=5),
        }
    if name == "thresholds":
        return text_model(THRESHOLDS, 18, 8), {"x": rand(2, 64, seed=9)}
    bn = {
        "bs": rand(4, seed=10),
        "bb": rand(4, seed=11),
        "bm": rand(4, seed=12),
        "bv": rand(4, seed=13, positive=True),
    }
    m = text_model(REDUCE_MOVE, 18, 8, hw=hw, w=rand(16, 5, seed=6), **bn)
    return m, {"x": rand(1, 4, 8, 8, seed=7), "a": rand(1, 6, 16, seed=8)}


@pytest.mark.parametrize(
    ("name", "emit"), [("acts_norms", "mnn,cann"), ("reduce_move", "mnn,cann"), ("thresholds", "mnn,cann")]
)
def test_backends_write_and_verify(name: str, emit: str, tmp_path: Path) -> None:
    model, feeds = _case(name)
    src, inputs, out = tmp_path / "m.onnx", tmp_path / "in.npz", tmp_path / "out"
    onnx.save(model, src)
    np.savez(inputs, allow_pickle=False, **feeds)
    assert main(["compile", str(src), "-o", str(out), "--emit", emit, "--inputs", str(inputs)]) == 0
    ver = json.loads((out / "manifest.json").read_text())["verification"]
    assert ver["passed"]
    paths = {"mnn": "model.mnn", "cann": "model.om"}
    assert {a["path"] for a in ver["artifacts"]} == {paths[e] for e in emit.split(",")}
    outs = [o for a in ver["artifacts"] for o in a["outputs"]]
    assert len(outs) == len(emit.split(",")) * len(model.graph.output) and all(
        o["max_rel"] <= 1e-5 for o in outs
    )
