"""explicit-pads: auto_pad -> explicit pads, and zero Pads folded into Conv, vs onnxruntime.

Numerics: max|diff| <= TOL * max(1, max|ref|). The rewritten ops read exactly the same
elements, so max pools are bit-exact (TOL 0) and convolutions and average pools use fp32 TOL 1e-6 (same sums,
possibly another kernel: measured <= 5.2e-8).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from compiler.pass_infra import PassContext
from frontends.onnx.loader import load_onnx
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

TOL = 1e-6
X = {"x": rand(1, 4, 9, 10, seed=1)}
W = {"w": rand(6, 4, 3, 2, seed=2)}
WT = {"w": rand(4, 3, 3, 3, seed=2)}

CASES = {
    # name: (call, constants, tolerance, explicit pads expected)
    "conv-same-upper": ('Conv<auto_pad="SAME_UPPER", strides=[2,3]>(x, w)', W, TOL, (1, 0, 1, 1)),
    "conv-same-lower": ('Conv<auto_pad="SAME_LOWER", strides=[2,1]>(x, w)', W, TOL, (1, 1, 1, 0)),
    "conv-valid": ('Conv<auto_pad="VALID">(x, w)', W, TOL, (0, 0, 0, 0)),
    "convT-same": ('ConvTranspose<auto_pad="SAME_UPPER", strides=[2,2]>(x, w)', WT, TOL, (0, 0, 1, 1)),
    "convT-shape": ("ConvTranspose<strides=[2,2], output_shape=[18,20]>(x, w)", WT, TOL, (1, 1, 0, 0)),
    "max-same": (
        'MaxPool<auto_pad="SAME_UPPER", kernel_shape=[3,3], strides=[2,2]>(x)',
        {},
        0.0,
        (1, 0, 1, 1),
    ),
    "avg-same": ('AveragePool<auto_pad="SAME_LOWER", kernel_shape=[2,3]>(x)', {}, TOL, (1, 1, 0, 1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_auto_pad(case: str) -> None:
    call, consts, tol, pads = CASES[case]
    m = text_model(f"g (float[1,4,9,10] x) => (float[1,?,?,?] y) {{ y = {call} }}", 17, 8, **consts)
    g = assert_pass_matches_ort(m, ["explicit-pads"], X, max_rel=tol)
    (node,) = g.ops()
    assert node.attrs.auto_pad == "NOTSET" and tuple(node.attrs.pads) == pads
    assert not getattr(node.attrs, "output_shape", ())
    assert not run_passes(g, ["explicit-pads"]).changed


def test_auto_pad_dynamic_refused() -> None:
    m = text_model(
        'g (float[1,4,H,W] x) => (float[1,6,?,?] y) { y = Conv<auto_pad="SAME_UPPER">(x, w) }', 17, 8, **W
    )
    g, ctx = load_onnx(m), PassContext()
    assert not run_passes(g, ["explicit-pads"], ctx).changed
    assert [(n.rule, n.reason) for n in ctx.near_misses] == [("auto-pad", "spatial dims are not static")]


def test_convtranspose_larger_than_natural_refused() -> None:
    # kernel 1, stride 2: SAME asks for 2 * L outputs, one more than the natural 2 * (L - 1) + 1
    text = 'g (float[1,4,5,5] x) => (float[1,3,?,?] y) { y = ConvTranspose<auto_pad="SAME_UPPER", strides=[2,2]>(x, w) }'
    g, ctx = load_onnx(text_model(text, 17, 8, w=rand(4, 3, 1, 1))), PassContext()
    assert not run_passes(g, ["explicit-pads"], ctx).changed
    assert any("larger than the natural size" in n.reason for n in ctx.near_misses)


PAD_CONV = "g (float[1,4,9,10] x) => (float[?,6,?,?] y) {{ p = Pad{mode}(x, pads{value}) \n y = Conv<pads=[1,0,0,1]>(p, w, b) }}"
CONV_CONSTS = {**W, "b": rand(6, seed=3)}


def _pad_model(pads: list[int], mode: str = "", value: float | None = None) -> onnx.ModelProto:
    extra = {} if value is None else {"v": np.array(value, np.float32)}
    text = PAD_CONV.format(mode=mode, value="" if value is None else ", v")
    return text_model(text, 17, 8, pads=np.array(pads, np.int64), **CONV_CONSTS, **extra)


def test_pad_into_conv() -> None:
    g = assert_pass_matches_ort(
        _pad_model([0, 0, 2, 1, 0, 0, 0, 3], value=0.0), ["explicit-pads"], X, max_rel=TOL
    )
    (conv,) = g.ops()
    assert op_counts(g) == {"Conv": 1} and tuple(conv.attrs.pads) == (3, 1, 0, 4)
    assert not run_passes(g, ["explicit-pads"]).changed


@pytest.mark.parametrize(
    ("pads", "mode", "value", "why"),
    [
        ([1, 0, 1, 1, 0, 0, 1, 1], "", None, "Pad pads the batch or channel axis"),
        ([0, 0, 1, 1, 0, 0, 1, 1], '<mode="reflect">', None, "Pad mode is reflect, not constant"),
        ([0, 0, 1, 1, 0, 0, 1, 1], "", 1.0, "Pad value is not a constant 0"),
        ([0, 0, -1, 0, 0, 0, 0, 0], "", None, "Pad crops (negative pads)"),
    ],
)
def test_pad_not_folded(pads: list[int], mode: str, value: float | None, why: str) -> None:
    g, ctx = load_onnx(_pad_model(pads, mode, value)), PassContext()
    run_passes(g, ["explicit-pads"], ctx)
    assert op_counts(g) == {"Pad": 1, "Conv": 1}
    assert ("pad-conv", why) in {(n.rule, n.reason) for n in ctx.near_misses}
