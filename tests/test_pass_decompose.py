"""decompose: the rule registry, decomposed_support, and the normalization/activation/logic rules.

Numerics: onnxruntime on the original model vs onnxruntime on Kiln's decomposed graph exported
back to ONNX; max|diff| <= TOL * max(1, max|ref|) per output, TOL stated per test.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import OptionError
from compiler.ir.graph import Graph, Node
from compiler.pass_infra import PassContext
from compiler.rewriter import Rewriter
from frontends.onnx.loader import load_onnx
from passes.decompositions import (
    DECOMPOSITIONS,
    Decomposition,
    decomposed_support,
    decompositions_for,
)
from passes.decompositions._util import replace_outputs
from tests.helpers.decompose_check import ELEMENTARY, decompose_matches_ort, fake_table, refusals
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, run_passes

LN_OPS = {"ReduceMean": 2, "Sub": 1, "Mul": 2, "Add": 1, "Sqrt": 1, "Div": 1}


def _ln(attrs: str = "", shape: str = "[2,5,16]", bias: bool = True, dtype: str = "float", opset: int = 17):
    sc = "[16]" if "axis=1" not in attrs else "[5,16]"
    b_in = f", {dtype}{sc} b" if bias else ""
    body = f"y = LayerNormalization{attrs}(x, s{', b' if bias else ''})"
    text = f"g ({dtype}{shape} x, {dtype}{sc} s{b_in}) => ({dtype}{shape} y) {{ {body} }}"
    return text_model(text, opset, 8)


def _ln_feeds(dtype: type = np.float32, axis1: bool = False) -> dict[str, np.ndarray]:
    sc = (5, 16) if axis1 else (16,)
    return {
        "x": (rand(2, 5, 16, seed=1, scale=3.0) + 2.0).astype(dtype),
        "s": rand(*sc, seed=2).astype(dtype),
        "b": rand(*sc, seed=3).astype(dtype),
    }


@pytest.mark.parametrize(
    ("attrs", "bias"),
    [("", True), ("<axis=1>", True), ("<epsilon=0.001>", False), ("<stash_type=0>", True)],
)
def test_layer_norm(attrs: str, bias: bool) -> None:
    feeds = _ln_feeds(axis1="axis=1" in attrs)
    if not bias:
        feeds.pop("b")
    g = decompose_matches_ort(_ln(attrs, bias=bias), feeds, max_rel=5e-7)  # fp32: measured <= 9.0e-8
    want = dict(LN_OPS)
    if not bias:
        want["Add"] = 1
    else:
        want["Add"] = 2
    assert op_counts(g) == want


def test_layer_norm_stats_outputs() -> None:
    text = (
        "g (float[2,5,16] x, float[16] s) => (float[2,5,16] y, float[2,5,1] m, float[2,5,1] r) "
        "{ y, m, r = LayerNormalization(x, s) }"
    )
    feeds = {k: v for k, v in _ln_feeds().items() if k != "b"}
    g = decompose_matches_ort(text_model(text, 17, 8), feeds, max_rel=5e-7)  # measured 8.1e-8
    assert op_counts(g)["Div"] == 2  # d / std and InvStdDev = 1 / std


def test_layer_norm_fp16_stash() -> None:
    feeds = _ln_feeds(np.float16)
    g = decompose_matches_ort(
        _ln(dtype="float16"), feeds, max_rel=1e-4
    )  # fp16 output (1 ulp at 1: 9.8e-4): measured 5.8e-6
    counts = op_counts(g)
    assert counts["Cast"] == 4 and counts["ReduceMean"] == 2  # x, s, b (graph inputs) up; y down


def test_layer_norm_kept_when_native() -> None:
    reasons, counts = refusals(_ln(), fake_table([*ELEMENTARY, "LayerNormalization"]))
    assert counts == {"LayerNormalization": 1} and not reasons


def test_layer_norm_dynamic_refused() -> None:
    reasons, counts = refusals(_ln(shape="[N,5,16]"))
    assert counts == {"LayerNormalization": 1}
    assert any("layer-norm: dynamic shape" in r for r in reasons), reasons


def test_layer_norm_refused_without_sqrt() -> None:
    reasons, counts = refusals(_ln(), fake_table(set(ELEMENTARY) - {"Sqrt"}))
    assert counts == {"LayerNormalization": 1}
    assert any("layer-norm: produces Sqrt, which fake cannot write" in r for r in reasons), reasons


@pytest.mark.parametrize(("approx", "extra"), [("none", "Erf"), ("tanh", "Tanh")])
def test_gelu(approx: str, extra: str) -> None:
    text = f'g (float[4,64] x) => (float[4,64] y) {{ y = Gelu<approximate="{approx}">(x) }}'
    m = text_model(text, 20, 9)
    g = decompose_matches_ort(
        m, {"x": rand(4, 64, seed=4, scale=3.0)}, max_rel=5e-7
    )  # measured: erf 0 (bit-exact), tanh 1.3e-7
    assert op_counts(g)[extra] == 1 and "Gelu" not in op_counts(g)


def test_gelu_refused_without_erf() -> None:
    m = text_model("g (float[4,8] x) => (float[4,8] y) { y = Gelu(x) }", 20, 9)
    reasons, counts = refusals(m, fake_table(set(ELEMENTARY) - {"Erf"}))
    assert counts == {"Gelu": 1}
    assert any("gelu-erf: produces Erf" in r and "gelu-tanh: approximate='none'" in r for r in reasons), (
        reasons
    )


LOG_SOFTMAX_OPS = {"ReduceMax", "Exp", "ReduceSum", "Log"}


@pytest.mark.parametrize("axis", [1, -1])
def test_log_softmax(axis: int) -> None:
    text = f"g (float[2,5,40] x) => (float[2,5,40] y) {{ y = LogSoftmax<axis={axis}>(x) }}"
    m = text_model(text, 13, 8)
    table = fake_table({*ELEMENTARY, *LOG_SOFTMAX_OPS})
    x = rand(2, 5, 40, seed=6, scale=40.0)  # log(softmax(x)) would underflow to -inf here
    g = decompose_matches_ort(m, {"x": x}, max_rel=1e-6, table=table)
    assert op_counts(g) == {"ReduceMax": 1, "Sub": 2, "Exp": 1, "ReduceSum": 1, "Log": 1}


def test_log_softmax_refused_without_log() -> None:
    m = text_model("g (float[2,8] x) => (float[2,8] y) { y = LogSoftmax(x) }", 13, 8)
    reasons, counts = refusals(m, fake_table({*ELEMENTARY, "ReduceMax", "Exp", "ReduceSum"}))
    assert counts == {"LogSoftmax": 1}
    assert any("log-softmax: produces Log, which fake cannot write" in r for r in reasons), reasons


MASK = {"zero": np.array(0, np.float32), "ninf": np.array(np.finfo(np.float32).min, np.float32)}


def test_where_attention_mask() -> None:
    text = "g (bool[1,1,8,8] c) => (float[1,1,8,8] y) { y = Where(c, zero, ninf) }"
    c = np.random.default_rng(5).random((1, 1, 8, 8)) > 0.5
    g = decompose_matches_ort(text_model(text, 17, 8, **MASK), {"c": c}, max_rel=0.0)  # bit-exact
    assert op_counts(g) == {"Cast": 1, "Mul": 1, "Add": 1}


@pytest.mark.parametrize(
    ("x", "y", "why"),
    [
        (np.float32(1e-8), np.float32(1e8), "does not round back to x"),
        (np.float32(np.finfo(np.float32).max), np.float32(np.finfo(np.float32).min), "not finite"),
        (np.float32(1.0), np.float32(-0.0), "holds -0"),
    ],
)
def test_where_refused(x: np.float32, y: np.float32, why: str) -> None:
    text = "g (bool[4] c) => (float[4] o) { o = Where(c, xc, yc) }"
    reasons, counts = refusals(text_model(text, 17, 8, xc=np.array(x), yc=np.array(y)))
    assert counts == {"Where": 1} and any(why in r for r in reasons), reasons


def test_where_non_constant_refused() -> None:
    text = "g (bool[4] c, float[4] a) => (float[4] o) { o = Where(c, a, yc) }"
    reasons, _ = refusals(text_model(text, 17, 8, yc=np.array(0, np.float32)))
    assert any("not constant" in r for r in reasons), reasons


def test_and_of_bools() -> None:
    text = "g (bool[2,16] a, bool[2,16] b) => (bool[2,16] y) { y = And(a, b) }"
    rng = np.random.default_rng(7)
    feeds = {"a": rng.random((2, 16)) > 0.5, "b": rng.random((2, 16)) > 0.5}
    g = decompose_matches_ort(text_model(text, 17, 8), feeds, max_rel=0.0)  # bit-exact
    assert op_counts(g) == {"Cast": 3, "Mul": 1}


def test_and_kept_when_native() -> None:
    text = "g (bool[4] a, bool[4] b) => (bool[4] y) { y = And(a, b) }"
    feeds = {"a": np.array([1, 0, 1, 0], bool), "b": np.array([1, 1, 0, 0], bool)}
    g = decompose_matches_ort(text_model(text, 17, 8), feeds, max_rel=0.0, table=fake_table([*ELEMENTARY, "And"]))
    assert op_counts(g) == {"And": 1}


def test_equal_integers() -> None:
    text = "g (int64[16] a, int64[16] b) => (bool[16] y) { y = Equal(a, b) }"
    rng = np.random.default_rng(6)
    feeds = {"a": rng.integers(-3, 3, 16), "b": rng.integers(-3, 3, 16)}
    g = decompose_matches_ort(text_model(text, 17, 8), feeds, max_rel=0.0)
    assert op_counts(g) == {"Less": 1, "Greater": 1, "Or": 1, "Not": 1}


def test_equal_float_refused() -> None:
    text = "g (float[4] a, float[4] b) => (bool[4] y) { y = Equal(a, b) }"
    reasons, _ = refusals(text_model(text, 17, 8))
    assert any("not integer" in r for r in reasons), reasons


@pytest.mark.parametrize(("e", "muls"), [(2.0, 1), (3.0, 2)])
def test_pow_int(e: float, muls: int) -> None:
    m = text_model("g (float[64] x) => (float[64] y) { y = Pow(x, e) }", 17, 8, e=np.array(e, np.float32))
    g = decompose_matches_ort(
        m, {"x": rand(64, seed=7, scale=3.0)}, max_rel=0.0
    )  # bit-exact (onnxruntime computes x*x, x*x*x)
    assert op_counts(g) == {"Mul": muls}


def test_pow_other_exponent_refused() -> None:
    m = text_model("g (float[4] x) => (float[4] y) { y = Pow(x, e) }", 17, 8, e=np.array(0.5, np.float32))
    reasons, _ = refusals(m)
    assert any("exponent 0.5 is not 2 or 3" in r for r in reasons), reasons


def test_clip_dynamic_bounds() -> None:
    m = text_model("g (float[64] x, float lo, float hi) => (float[64] y) { y = Clip(x, lo, hi) }", 17, 8)
    feeds = {"x": rand(64, seed=8), "lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}
    g = decompose_matches_ort(m, feeds, max_rel=0.0)
    assert op_counts(g) == {"Max": 1, "Min": 1}


# ------------------------------------------------------------- registry and recursion
def _abs_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    two = rw.const(np.array(2.0, x.type.dtype.numpy), "two")
    replace_outputs(rw, node, [rw.op("Sqrt", [rw.op("Pow", [x, two])], like=node)])


ABS = Decomposition("abs-sqrt-square", "Abs", ("Sqrt", "Pow"), lambda g, n: None, _abs_rewrite)
"""A test rule: |x| = sqrt(x^2), whose Pow then needs pow-int."""


def test_recursive_support_and_fixed_point(monkeypatch: pytest.MonkeyPatch) -> None:
    decompositions_for("Abs")  # load the built-in rules first
    monkeypatch.setitem(DECOMPOSITIONS, "Abs", [ABS])
    table = fake_table(["Sqrt", "Mul"])
    plan = decomposed_support(table, "Abs")
    assert not isinstance(plan, str) and [r.name for r in plan] == ["abs-sqrt-square", "pow-int"]
    assert decomposed_support(table, "Sqrt") == []
    assert decomposed_support(fake_table(["Mul"]), "Abs") == (
        "abs-sqrt-square: produces Sqrt, which fake cannot write (no decomposition of Sqrt)"
    )
    assert decomposed_support(table, "Abs", max_depth=1) == (
        "abs-sqrt-square: produces Pow, which fake cannot write (Pow: decomposition depth cap (4) reached)"
    )
    m = text_model("g (float[64] x) => (float[64] y) { y = Abs(x) }", 17, 8)
    g = decompose_matches_ort(m, {"x": rand(64, seed=9, scale=3.0)}, max_rel=0.0, table=table)
    assert op_counts(g) == {"Sqrt": 1, "Mul": 1}


def test_cycle_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    decompositions_for("Abs")
    back = Decomposition("sqrt-abs", "Sqrt", ("Abs",), lambda g, n: None, _abs_rewrite)
    monkeypatch.setitem(DECOMPOSITIONS, "Abs", [ABS])
    monkeypatch.setitem(DECOMPOSITIONS, "Sqrt", [back])
    why = decomposed_support(fake_table(["Mul"]), "Abs")
    assert isinstance(why, str) and "decomposes back into itself" in why


def test_table_from_context() -> None:
    m = text_model("g (float[4,8] x) => (float[4,8] y) { y = Gelu(x) }", 20, 9)
    g = load_onnx(m)
    assert run_passes(g, ["decompose"], PassContext(capabilities=fake_table())).applied == {"gelu-erf": 1}
    assert op_counts(g) == {"Mul": 3, "Erf": 1, "Add": 1}


def test_needs_a_backend() -> None:
    g = load_onnx(text_model("g (float[4] x) => (float[4] y) { y = Relu(x) }", 17, 8))
    with pytest.raises(OptionError, match="needs a backend"):
        run_passes(g, ["decompose"])
