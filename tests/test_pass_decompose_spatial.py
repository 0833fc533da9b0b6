"""decompose: Split -> Slice, and 1-D Conv/ConvTranspose/pools through their 2-D forms.

Numerics: onnxruntime on the original vs on the decomposed graph; max|diff| <= TOL * max(1, max|ref|).
Data movement and max pooling are bit-exact (TOL 0); convolutions and averages sum the same
terms through another kernel (fp32 TOL 1e-6; measured: bit-exact with onnxruntime 1.32).
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir.graph import Graph, Node
from tests.helpers.decompose_check import ELEMENTARY, decompose_matches_ort, fake_table, refusals
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts

CONV_TOL = 1e-6


def _two_d_only(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    return None if x is not None and x.type.rank == 4 else "only 2-D windows"


WINDOW_OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")
TABLE_2D = fake_table([*ELEMENTARY, *WINDOW_OPS], {op: _two_d_only for op in WINDOW_OPS})
"""A backend whose windowed ops are 2-D only (what MNN and CANN accept)."""


@pytest.mark.parametrize(
    ("opset", "call", "outs"),
    [
        (17, "a, b, c = Split<axis=1>(x, sizes)", "float[2,3,6] a, float[2,4,6] b, float[2,5,6] c"),
        (
            18,
            "a, b, c = Split<axis=-1, num_outputs=3>(x)",
            "float[2,12,2] a, float[2,12,2] b, float[2,12,2] c",
        ),
        (18, "a, b, c = Split<axis=1, num_outputs=3>(x)", "float[2,4,6] a, float[2,4,6] b, float[2,4,6] c"),
    ],
)
def test_split(opset: int, call: str, outs: str) -> None:
    m = text_model(f"g (float[2,12,6] x) => ({outs}) {{ {call} }}", opset, 8, sizes=np.array([3, 4, 5]))
    g = decompose_matches_ort(m, {"x": rand(2, 12, 6, seed=1)}, max_rel=0.0)
    assert op_counts(g) == {"Slice": 3}


def test_split_unequal_last_and_unused_output() -> None:
    text = "g (float[2,7] x) => (float[2,3] a, float[2,1] c) { a, b, c = Split<axis=1, num_outputs=3>(x) }"
    g = decompose_matches_ort(text_model(text, 18, 8), {"x": rand(2, 7, seed=2)}, max_rel=0.0)
    assert op_counts(g) == {"Slice": 2}  # b (x[:, 3:6]) is unused: no Slice


def test_split_kept_when_native() -> None:
    text = "g (float[2,8] x) => (float[2,4] a, float[2,4] b) { a, b = Split<axis=1, num_outputs=2>(x) }"
    reasons, counts = refusals(text_model(text, 18, 8), fake_table([*ELEMENTARY, "Split"]))
    assert counts == {"Split": 1} and not reasons


def test_split_dynamic_refused() -> None:
    text = "g (float[2,N] x) => (float[2,?] a, float[2,?] b) { a, b = Split<axis=1, num_outputs=2>(x) }"
    reasons, counts = refusals(text_model(text, 18, 8))
    assert counts == {"Split": 1} and any("split sizes are not static" in r for r in reasons), reasons


CONVS = {  # call, W shape, bias length (0: no bias)
    "pads-stride": ("Conv<pads=[1,2], strides=[2]>", (6, 4, 3), 6),
    "dilated-group": ("Conv<dilations=[2], group=2>", (6, 2, 3), 6),
    "same-upper": ('Conv<auto_pad="SAME_UPPER", strides=[2]>', (6, 4, 4), 0),
    "transpose": ("ConvTranspose<strides=[2], pads=[1,0], output_padding=[1]>", (4, 3, 3), 3),
    "transpose-group": ("ConvTranspose<group=2, output_shape=[17]>", (4, 2, 3), 0),
}


@pytest.mark.parametrize("case", sorted(CONVS))
def test_conv_1d(case: str) -> None:
    call, wshape, nb = CONVS[case]
    consts = {"w": rand(*wshape, seed=3), **({"b": rand(nb, seed=4)} if nb else {})}
    body = f"y = {call}(x, w{', b' if nb else ''})"
    m = text_model(f"g (float[1,4,16] x) => (float[1,?,?] y) {{ {body} }}", 17, 8, **consts)
    g = decompose_matches_ort(m, {"x": rand(1, 4, 16, seed=5)}, max_rel=CONV_TOL, table=TABLE_2D)
    assert op_counts(g) == {"Unsqueeze": 1, call.split("<")[0]: 1, "Squeeze": 1}  # W: a 4-D constant


POOLS = {
    "max-ceil": ("MaxPool<kernel_shape=[3], strides=[2], ceil_mode=1>", 0.0),
    "max-pads-dil": ("MaxPool<kernel_shape=[2], pads=[1,1], dilations=[2]>", 0.0),
    "avg-include-pad": ("AveragePool<kernel_shape=[3], pads=[1,1], count_include_pad=1>", CONV_TOL),
    "avg-same": ('AveragePool<kernel_shape=[4], auto_pad="SAME_LOWER", strides=[3]>', CONV_TOL),
    "global-avg": ("GlobalAveragePool", CONV_TOL),
    "global-max": ("GlobalMaxPool", 0.0),
}


@pytest.mark.parametrize("case", sorted(POOLS))
def test_pool_1d(case: str) -> None:
    call, tol = POOLS[case]
    m = text_model(f"g (float[1,3,17] x) => (float[1,3,?] y) {{ y = {call}(x) }}", 17, 8)
    g = decompose_matches_ort(m, {"x": rand(1, 3, 17, seed=6)}, max_rel=tol, table=TABLE_2D)
    assert op_counts(g) == {"Unsqueeze": 1, call.split("<")[0]: 1, "Squeeze": 1}


def test_maxpool_indices_1d() -> None:
    outs = "float[2,3,4] y, int64[2,3,4] i"
    text = f"g (float[2,3,9] x) => ({outs}) {{ y, i = MaxPool<kernel_shape=[3], strides=[2]>(x) }}"
    feeds = {"x": rand(2, 3, 9, seed=7)}
    g = decompose_matches_ort(text_model(text, 17, 8), feeds, max_rel=0.0, table=TABLE_2D)
    assert op_counts(g) == {"Unsqueeze": 1, "MaxPool": 1, "Squeeze": 2}


def test_conv_2d_not_decomposed() -> None:
    text = "g (float[1,4,5,5] x) => (float[1,6,3,3] y) { y = Conv(x, w) }"
    reasons, counts = refusals(text_model(text, 17, 8, w=rand(6, 4, 3, 3)), fake_table(ELEMENTARY))
    assert counts == {"Conv": 1} and any("conv-1d: x is 2-D, not 1-D" in r for r in reasons), reasons


def test_conv_1d_kept_when_native() -> None:
    text = "g (float[1,4,8] x) => (float[1,6,6] y) { y = Conv(x, w) }"
    reasons, counts = refusals(text_model(text, 17, 8, w=rand(6, 4, 3)), fake_table([*ELEMENTARY, "Conv"]))
    assert counts == {"Conv": 1} and not reasons
