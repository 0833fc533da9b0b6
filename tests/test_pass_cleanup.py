"""fold-constants, eliminate-dead-nodes and eliminate-identities: structure, numerics, must-not-fire."""

from __future__ import annotations

import numpy as np

from compiler.ir import print_graph
from compiler.pass_infra import PassContext
from frontends.onnx.loader import load_onnx
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

X = {"x": rand(2, 3, 4, 4, seed=1)}


def test_fold_constants_folds_weight_arithmetic() -> None:
    m = text_model(
        """g (float[2,3,4,4] x) => (float[2,3,4,4] y) {
             s = Mul(a, b)
             t = Add(s, c)
             y = Mul(x, t)
           }""",
        a=rand(1, 3, 1, 1, seed=2),
        b=rand(1, 3, 1, 1, seed=3),
        c=rand(1, 3, 1, 1, seed=4),
    )
    g = assert_pass_matches_ort(m, ["fold-constants", "eliminate-dead-nodes"], X)
    assert op_counts(g) == {"Mul": 1}
    assert not run_passes(g, ["fold-constants"]).changed


def test_fold_constants_must_not_fire_on_random_or_large_outputs() -> None:
    m = text_model(
        """g (float[2,3,4,4] x) => (float[2,3,4,4] y, float[128,128] z) {
             r = RandomUniformLike(c)
             y = Add(x, r)
             z = Expand(one, shp)
           }""",
        c=np.zeros((1, 3, 1, 1), np.float32),
        one=np.ones((1, 1), np.float32),
        shp=np.array([128, 128], np.int64),
    )
    g = load_onnx(m)
    res = run_passes(g, ["fold-constants{max_elements=1000}"])
    assert not res.changed
    assert op_counts(g) == {"RandomUniformLike": 1, "Add": 1, "Expand": 1}
    from passes.fold_constants import fold_reason

    reasons = {n.op: fold_reason(g, n, 1000, 4.0) for n in g.ops()}
    assert reasons["RandomUniformLike"] == "RandomUniformLike is not deterministic and pure"
    assert reasons["Expand"] == "output has 16384 elements > cap 1000"


def test_eliminate_dead_nodes() -> None:
    m = text_model(
        """g (float[2,3,4,4] x) => (float[2,3,4,4] y) {
             unused = Sigmoid(x)
             unused2 = Add(unused, c)
             y = Relu(x)
           }""",
        c=rand(1, seed=5),
    )
    g = assert_pass_matches_ort(m, ["eliminate-dead-nodes"], X)
    assert op_counts(g) == {"Relu": 1}
    assert [v.name for v in g.inputs] == ["x"]
    assert not run_passes(g, ["eliminate-dead-nodes"]).changed


def test_eliminate_identities_golden() -> None:
    m = text_model(
        """g (float[2,3,4,4] x) => (float[2,3,4,4] y) {
             a = Identity(x)
             b = Dropout(a)
             c = Transpose<perm=[0,2,3,1]>(b)
             d = Transpose<perm=[0,3,1,2]>(c)
             e = Reshape(d, s1)
             f = Reshape(e, s2)
             h = Cast<to=1>(f)
             u = Unsqueeze(h, ax)
             v = Squeeze(u, ax)
             y = Relu(v)
           }""",
        s1=np.array([2, 48], np.int64),
        s2=np.array([2, 3, 4, 4], np.int64),
        ax=np.array([0], np.int64),
    )
    g = assert_pass_matches_ort(m, ["eliminate-identities", "eliminate-dead-nodes"], X)
    assert (
        print_graph(g)
        == "graph g(\n  %x: f32[2,3,4,4],\n) {\n  %y = Relu(%x) : f32[2,3,4,4]\n  return %y\n}\n"
    )
    assert not run_passes(g, ["eliminate-identities"]).changed


def test_transpose_pair_composes_when_not_inverse() -> None:
    m = text_model(
        """g (float[2,3,4,4] x) => (float[2,4,3,4] y) {
             c = Transpose<perm=[0,2,1,3]>(x)
             y = Transpose<perm=[0,3,2,1]>(c)
           }""",
    )
    g = assert_pass_matches_ort(m, ["eliminate-identities", "eliminate-dead-nodes"], X)
    assert op_counts(g) == {"Transpose": 1}


def test_eliminate_identities_must_not_fire() -> None:
    m = text_model(
        """g (float[2,3,4,4] x) => (float[2,3,4,4] y, bool[2,3,4,4] mask, float[2,4,4,3] t2) {
             y, mask = Dropout(x, r, tm)
             t = Transpose<perm=[0,2,3,1]>(x)
             t2 = Relu(t)
           }""",
        r=np.array(0.5, np.float32),
        tm=np.array(False),
    )
    g = load_onnx(m)
    ctx = PassContext()
    res = run_passes(g, ["eliminate-identities"], ctx)
    assert not res.changed
    reasons = {(n.rule, n.reason) for n in ctx.near_misses}
    assert ("dropout", "the mask output is a graph output") in reasons
    assert ("transpose", "not an identity permutation and not a Transpose pair") in reasons
