"""canonicalize: structure, numerics against onnxruntime, must-not-fire reasons, idempotence."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest

from compiler.ir import Graph, print_graph
from compiler.pass_infra import Pass, PassContext
from compiler.pattern import apply_rules
from compiler.rewriter import PassResult
from frontends.onnx.loader import load_onnx
from passes.canonicalize import ClipToRelu, exact_reciprocal
from tests.conftest import MODELS
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

TOL = 1e-5  # max|diff| <= TOL * max(1, max|ref|), float32
SHAPE = "float[1,4,6,6]"
X = {"x": rand(1, 4, 6, 6, seed=1, scale=4.0)}  # spans the hard-swish knees at -3 and 3
CONSTS = {
    "three": np.array(3, np.float32),
    "zero": np.array(0, np.float32),
    "six": np.array([6], np.float32),  # shape-[1] constants are accepted too
    "sixth": np.array(1 / 6, np.float32),
    "inf": np.array(np.inf, np.float32),
    "minus3": np.array(-3, np.float32),
}


IN, OUT = f"{SHAPE} x", f"{SHAPE} y"
Misses = tuple[set[tuple[str, str]], dict[str, int]]


def _model(body: str, inputs: str = IN, outputs: str = OUT, **extra: np.ndarray) -> onnx.ModelProto:
    return text_model(f"g ({inputs}) => ({outputs}) {{\n{body}\n}}", 17, 8, **{**CONSTS, **extra})


def _misses(body: str, inputs: str = IN, outputs: str = OUT, **extra: np.ndarray) -> Misses:
    """Run canonicalize; return the (rule, reason) near-misses and the op counts."""
    g = load_onnx(_model(body, inputs, outputs, **extra))
    ctx = PassContext()
    run_passes(g, ["canonicalize"], ctx)
    return {(n.rule, n.reason) for n in ctx.near_misses}, dict(op_counts(g))


def _assert_idempotent(model: onnx.ModelProto) -> None:
    g = load_onnx(model)
    assert run_passes(g, ["canonicalize"]).changed
    assert not run_passes(g, ["canonicalize"]).changed


GATE = "a = Add(x, three)\n c = Clip(a, zero, six)\n"
HARD_SWISH = {
    "x*(g/6)": GATE + "d = Div(c, six)\n y = Mul(x, d)",
    "(x*g)/6": GATE + "p = Mul(x, c)\n y = Div(p, six)",
    "x*(g*1/6)": GATE + "d = Mul(c, sixth)\n y = Mul(x, d)",
    "(x*g)*1/6": GATE + "p = Mul(c, x)\n y = Mul(sixth, p)",
    "swapped": "a = Add(three, x)\n c = Clip(a, zero, six)\n d = Div(c, six)\n y = Mul(d, x)",
    "x-(-3)": "a = Sub(x, minus3)\n c = Clip(a, zero, six)\n d = Div(c, six)\n y = Mul(x, d)",
    "x*HardSigmoid(x)": "h = HardSigmoid<alpha=0.16666667, beta=0.5>(x)\n y = Mul(x, h)",
}


@pytest.mark.parametrize("variant", sorted(HARD_SWISH))
def test_hard_swish_variants(variant: str) -> None:
    m = _model(HARD_SWISH[variant])
    g = assert_pass_matches_ort(m, ["canonicalize"], X, max_rel=TOL)
    assert op_counts(g) == {"HardSwish": 1}
    _assert_idempotent(m)


@dataclass(frozen=True)
class _Relu6First(Pass):
    """Only the relu6 rule, so that canonicalize then sees x * Relu6(x + 3) / 6."""

    name = "test-relu6-first"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return apply_rules(graph, [ClipToRelu()])


def test_hard_swish_with_relu6_gate() -> None:
    m = _model(HARD_SWISH["(x*g)/6"])
    g = load_onnx(m)
    assert run_passes(g, [_Relu6First()]).applied == {"relu6": 1}
    assert run_passes(g, ["canonicalize"]).applied == {"hard-swish": 1}
    g = assert_pass_matches_ort(m, [_Relu6First(), "canonicalize"], X, max_rel=TOL)
    assert op_counts(g) == {"HardSwish": 1}


def test_hard_sigmoid_golden_ir() -> None:
    m = _model(GATE + "y = Div(c, six)")
    g = assert_pass_matches_ort(m, ["canonicalize"], X, max_rel=TOL)
    assert print_graph(g, constants=False) == (
        "graph g(\n  %x: f32[1,4,6,6],\n) {\n"
        "  %y = HardSigmoid(%x) {alpha=0.16666667} : f32[1,4,6,6]\n"
        "  return %y\n}\n"
    )
    _assert_idempotent(m)


def test_hard_sigmoid_by_multiplication() -> None:
    m = _model(GATE + "y = Mul(sixth, c)")
    g = assert_pass_matches_ort(m, ["canonicalize"], X, max_rel=TOL)
    assert op_counts(g) == {"HardSigmoid": 1}


@pytest.mark.parametrize(
    ("body", "op"),
    [
        ("y = Clip(x, zero, six)", "kiln::Relu6"),
        ("y = Clip(x, zero)", "Relu"),
        ("y = Clip(x, zero, inf)", "Relu"),
    ],
)
def test_clip_to_relu(body: str, op: str) -> None:
    m = _model(body)
    g = assert_pass_matches_ort(m, ["canonicalize"], X, max_rel=0.0)
    assert op_counts(g) == {op: 1}
    _assert_idempotent(m)


@pytest.mark.parametrize("b_shape", [(5,), (1, 5)])
def test_matmul_add_to_gemm(b_shape: tuple[int, ...]) -> None:
    m = _model(
        "p = MatMul(x, w)\n y = Add(b, p)",
        "float[3,8] x",
        "float[3,5] y",
        w=rand(8, 5, seed=2),
        b=rand(*b_shape, seed=3),
    )
    g = assert_pass_matches_ort(m, ["canonicalize"], {"x": rand(3, 8, seed=4)}, max_rel=TOL)
    assert op_counts(g) == {"Gemm": 1}
    _assert_idempotent(m)


def test_sub_and_power_of_two_div_are_bit_exact() -> None:
    q = np.array([0.25, 2, -8, 1], np.float32).reshape(1, 4, 1, 1)
    m = _model("s = Sub(x, c)\n y = Div(s, q)", c=rand(1, 4, 1, 1, seed=5), q=q)
    g = assert_pass_matches_ort(m, ["canonicalize"], X, max_rel=0.0)
    assert op_counts(g) == {"Add": 1, "Mul": 1}
    _assert_idempotent(m)


def test_exact_reciprocal_only_for_powers_of_two() -> None:
    assert exact_reciprocal(np.array([4.0, -0.5], np.float32)) is not None
    assert exact_reciprocal(np.array([3.0], np.float32)) is None
    assert exact_reciprocal(np.array([0.0], np.float32)) is None
    assert exact_reciprocal(np.array([2.0**-127], np.float32)) is not None  # subnormal c, 1/c = 2^127 fits
    assert exact_reciprocal(np.array([2.0**-149], np.float32)) is None  # 1/c overflows


# ------------------------------------------------------------------ must not fire
def test_must_not_fire_hard_swish_with_different_x_is_a_hard_sigmoid() -> None:
    body = "a = Add(z, three)\n c = Clip(a, zero, six)\n d = Div(c, six)\n y = Mul(x, d)"
    reasons, counts = _misses(body, f"{SHAPE} x, {SHAPE} z")
    assert ("hard-swish", "x is used with different values") in reasons
    assert counts == {"HardSigmoid": 1, "Mul": 1}


def test_must_not_fire_clip_with_dynamic_bounds() -> None:
    body = "a = Add(x, three)\n c = Clip(a, lo, hi)\n d = Div(c, six)\n y = Mul(x, d)"
    reasons, counts = _misses(body, f"{SHAPE} x, float lo, float hi")
    assert ("hard-swish", "Clip bounds are not constant") in reasons
    assert ("hard-sigmoid", "Clip bounds are not constant") in reasons
    assert ("relu6", "Clip bounds are not constant") in reasons
    assert counts == {"Add": 1, "Clip": 1, "Div": 1, "Mul": 1}


def test_must_not_fire_other_clip_bounds_and_shift() -> None:
    two, m1, one = (np.array(v, np.float32) for v in (2, -1, 1))
    reasons, counts = _misses("a = Add(x, two)\n c = Clip(a, zero, six)\n y = Div(c, six)", two=two)
    assert ("hard-sigmoid", "the Add constant is 2.0, not 3") in reasons
    assert counts == {"Add": 1, "kiln::Relu6": 1, "Div": 1}
    reasons, counts = _misses("y = Clip(x, m1, one)", m1=m1, one=one)
    assert ("relu6", "Clip bounds (-1, 1) are neither (0, 6) nor (0, inf)") in reasons
    assert counts == {"Clip": 1}


def test_must_not_fire_hard_sigmoid_with_other_slope() -> None:
    reasons, counts = _misses("h = HardSigmoid<alpha=0.2>(x)\n y = Mul(x, h)")
    assert ("hard-swish", "HardSigmoid has alpha=0.2, beta=0.5, not 1/6, 0.5") in reasons
    assert counts == {"HardSigmoid": 1, "Mul": 1}


def test_must_not_fire_gemm() -> None:
    body, b = "p = MatMul(x, w)\n y = Add(p, b)", rand(5, seed=3)
    reasons, counts = _misses(body, "float[3,8] x, float[8,5] w", "float[3,5] y", b=b)
    assert ("gemm", "W is not constant") in reasons
    assert counts == {"MatMul": 1, "Add": 1}
    reasons, counts = _misses(body, "float[2,3,8] x", "float[2,3,5] y", w=rand(8, 5), b=b)
    assert ("gemm", "input is not 2-D") in reasons
    assert counts == {"MatMul": 1, "Add": 1}


def test_must_not_fire_sub_and_div() -> None:
    reasons, counts = _misses("s = Sub(x, z)\n y = Div(s, three)", f"{SHAPE} x, {SHAPE} z")
    assert ("sub-to-add", "c is not constant") in reasons
    assert ("div-to-mul", "divisor is not a power of two (x * (1/c) would not be bit-exact)") in reasons
    assert counts == {"Sub": 1, "Div": 1}


# ------------------------------------------------------------------ real model
def test_ppocr_cls_counts_and_numerics() -> None:
    model, shapes = onnx.load(str(MODELS / "ppocr_mobile_v2_cls.onnx")), {"x": (1, 3, 48, 192)}
    feeds = dict(np.load(MODELS / "data" / "ppocr_mobile_v2_cls.npz"))
    before = op_counts(load_onnx(model, input_shapes=shapes))
    g = assert_pass_matches_ort(model, ["canonicalize"], feeds, max_rel=TOL, input_shapes=shapes)
    counts = op_counts(g)
    assert (before["Clip"], before["Div"], before["HardSigmoid"]) == (18, 18, 9)
    assert counts["HardSwish"] == 18 and counts["HardSigmoid"] == 9  # the SE gates (alpha 0.2) stay
    assert counts["Clip"] == counts["Div"] == counts["MatMul"] == 0 and counts["Gemm"] == 1
    assert counts["Mul"] == before["Mul"] - 18 and counts["Add"] == before["Add"] - 19
    assert not run_passes(g, ["canonicalize"]).changed
