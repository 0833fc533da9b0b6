"""fuse-conv-bias-act: structure, numerics against onnxruntime, must-not-fire, idempotence."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir import print_graph
from compiler.pass_infra import PassContext
from frontends.onnx.loader import load_onnx
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

X = {"x": rand(1, 3, 8, 8, seed=1)}
W = rand(4, 3, 3, 3, seed=2, scale=0.3)
B = rand(4, seed=3)

ACTS = {
    "Relu": ("Relu(c)", "relu"),
    "LeakyRelu": ("LeakyRelu<alpha=0.2>(c)", "leaky_relu"),
    "Sigmoid": ("Sigmoid(c)", "sigmoid"),
    "Tanh": ("Tanh(c)", "tanh"),
    "HardSigmoid": ("HardSigmoid<alpha=0.25,beta=0.4>(c)", "hard_sigmoid"),
    "HardSwish": ("HardSwish(c)", "hard_swish"),
    "Clip": ("Clip(c, lo, hi)", "clip"),
    "Relu6": ("Clip(c, zero, six)", "relu6"),
}


@pytest.mark.parametrize("act", sorted(ACTS))
def test_conv_bias_act_fuses_and_matches_ort(act: str) -> None:
    expr, fused = ACTS[act]
    m = text_model(
        f"""g (float[1,3,8,8] x) => (float[1,4,8,8] y) {{
             c0 = Conv<pads=[1,1,1,1]>(x, w)
             c = Add(c0, b)
             y = {expr}
           }}""",
        w=W,
        b=B.reshape(1, 4, 1, 1),
        lo=np.array(-0.5, np.float32),
        hi=np.array(0.7, np.float32),
        zero=np.array(0, np.float32),
        six=np.array(6, np.float32),
    )
    g = assert_pass_matches_ort(m, ["fuse-conv-bias-act"], X)
    assert op_counts(g) == {"kiln::FusedConv": 1}
    node = g.ops()[0]
    assert node.attrs.activation == fused
    assert not run_passes(g, ["fuse-conv-bias-act"]).changed


def test_golden_ir_with_residual() -> None:
    m = text_model(
        """g (float[1,3,8,8] x) => (float[1,3,8,8] y) {
             c = Conv<pads=[1,1,1,1]>(x, w, b)
             s = Add(x, c)
             y = Relu(s)
           }""",
        w=rand(3, 3, 3, 3, seed=4, scale=0.3),
        b=rand(3, seed=5),
    )
    g = assert_pass_matches_ort(m, ["fuse-conv-bias-act{residual=true}"], X)
    assert print_graph(g, constants=False) == (
        "graph g(\n  %x: f32[1,3,8,8],\n) {\n"
        "  %y = kiln::FusedConv(%x, %w, %b, %x) {pads=[1,1,1,1], activation='relu'} : f32[1,3,8,8]\n"
        "  return %y\n}\n"
    )


def test_residual_is_off_by_default() -> None:
    m = text_model(
        """g (float[1,3,8,8] x) => (float[1,3,8,8] y) {
             c = Conv<pads=[1,1,1,1]>(x, w)
             y = Add(x, c)
           }""",
        w=rand(3, 3, 3, 3, seed=4),
    )
    g = load_onnx(m)
    assert not run_passes(g, ["fuse-conv-bias-act"]).changed
    assert op_counts(g) == {"Conv": 1, "Add": 1}


def test_must_not_fire_shared_conv_output_and_dynamic_clip() -> None:
    m = text_model(
        """g (float[1,3,8,8] x, float lo, float hi) => (float[1,4,8,8] y, float[1,4,8,8] z, float[1,4,8,8] q) {
             c = Conv<pads=[1,1,1,1]>(x, w)
             y = Relu(c)
             z = Sigmoid(c)
             c2 = Conv<pads=[1,1,1,1]>(x, w)
             q = Clip(c2, lo, hi)
           }""",
        w=W,
    )
    g = load_onnx(m)
    ctx = PassContext()
    assert not run_passes(g, ["fuse-conv-bias-act"], ctx).changed
    reasons = {(n.rule, n.reason) for n in ctx.near_misses}
    assert ("conv-act", "'c' has other users") in reasons
    assert ("conv-act", "activation parameters are not constant scalars") in reasons


def test_non_channel_bias_is_not_folded() -> None:
    m = text_model(
        """g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
             c = Conv<pads=[1,1,1,1]>(x, w)
             y = Add(c, b)
           }""",
        w=W,
        b=rand(1, 1, 8, 8, seed=9),
    )
    g = load_onnx(m)
    ctx = PassContext()
    assert not run_passes(g, ["fuse-conv-bias-act"], ctx).changed
    assert ("conv-add-bias", "addend of shape [1, 1, 8, 8] is not per-channel") in {
        (n.rule, n.reason) for n in ctx.near_misses
    }
