"""Which quantization grids are shared: Concat/Relu hand their grid back, passthrough ops carry theirs.

Each sharing must remove a rounding without adding one: the QDQ model still runs in
onnxruntime (default optimizations, uint8 and int8 activations) within one LSB of Kiln's
interpreter, and an input with a second reader keeps its own grid (must-not-fire).
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.ir import DType, Graph, run_graph, verify
from compiler.onnx_export import export_onnx, model_bytes
from compiler.quant.params import QParams
from compiler.quant.plan import make_plan
from compiler.quant.qdq import activation_params, insert_qdq
from frontends.onnx.loader import load_onnx
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.quant_reference import FUSED_INT8_EXACT, run_samples

SAMPLES = [{"x": rand(1, 3, 8, 8, seed=s)} for s in range(3)]


def graph(extra_reader: bool = False) -> Graph:
    """Conv, Conv -> Add -> Relu -> Concat with Conv -> Relu; a Transpose ends at an output."""
    tail = "z = Sigmoid(s)" if extra_reader else ""
    outs = "float[1,8,8,8] y, float[1,8,8,8] t" + (", float[1,4,8,8] z" if extra_reader else "")
    m = text_model(
        f"""g (float[1,3,8,8] x) => ({outs}) {{
             a = Conv<pads=[1,1,1,1]>(x, w1, b1)
             b = Conv<pads=[1,1,1,1]>(x, w2, b2)
             s = Add(a, b)
             r = Relu(s)
             c0 = Conv<pads=[1,1,1,1]>(x, w3, b3)
             c = Relu(c0)
             y = Concat<axis=1>(r, c)
             t = Transpose<perm=[0,1,3,2]>(y)
             {tail}
           }}""",
        w1=rand(4, 3, 3, 3, seed=1),
        b1=rand(4, seed=2),
        w2=rand(4, 3, 3, 3, seed=3),
        b2=rand(4, seed=4),
        w3=rand(4, 3, 3, 3, seed=5, scale=3.0),
        b3=rand(4, seed=6),
    )
    return load_onnx(m)


def quantized(g: Graph, dtype: DType) -> tuple[Graph, dict[str, QParams]]:
    ref = g.clone()
    plan = make_plan(g)
    lo = {n: np.inf for n in plan.observe}
    hi = {n: -np.inf for n in plan.observe}
    for feeds in SAMPLES:
        vals = run_graph(ref, feeds, keep_all=True)
        for n in plan.observe:
            lo[n], hi[n] = min(lo[n], float(vals[n].min())), max(hi[n], float(vals[n].max()))
    ranges = {n: (lo[n], hi[n]) for n in plan.observe}
    params = activation_params(g, ranges, dtype, symmetric=dtype == DType.INT8)
    used = insert_qdq(g, plan, params).activations
    verify(g)
    return g, used


def q_scale(g: Graph, value: str) -> float:
    q = next(n for n in g.ops() if n.op == "QuantizeLinear" and n.name == f"{value}_q")
    s = g.inputs_of(q)[1]
    assert s is not None and s.const is not None
    return float(s.const)


def test_relu_and_concat_hand_their_grid_back() -> None:
    g, used = quantized(graph(), DType.UINT8)
    assert used["s"] is used["r"] is used["y"], "Add -> Relu -> Concat share the concat's grid"
    assert used["c0"] is used["c"] is used["y"]
    assert int(used["s"].zero_point) == 0, "on the grid of [0, b] the clamp at 0 is the relu"
    assert q_scale(g, "s") == q_scale(g, "y")


def test_an_input_with_a_second_reader_keeps_its_own_grid() -> None:
    _, used = quantized(graph(extra_reader=True), DType.UINT8)
    assert used["s"] is not used["r"] and float(used["s"].scale) != float(used["r"].scale)
    assert used["r"] is used["y"], "the relu output is still read by the concat alone"


def test_passthrough_output_is_requantized_on_its_input_grid() -> None:
    g, used = quantized(graph(), DType.UINT8)
    assert used["t"] is used["y"]
    out = g.outputs[g.output_names.index("t")]
    assert out.producer.op == "DequantizeLinear", "no DequantizeLinear leads into a graph output"
    src = g.inputs_of(g.inputs_of(out.producer)[0].producer)[0]  # type: ignore[union-attr]
    assert src is not None and src.producer.op == "Transpose"


@pytest.mark.parametrize("dtype", [DType.UINT8, DType.INT8])
def test_onnxruntime_runs_the_shared_grids_within_one_lsb(dtype: DType) -> None:
    ref = graph()
    g, used = quantized(graph(), dtype)
    # default optimizations (QDQ fusion into integer kernels) where those compute the QDQ definition
    runs = run_samples(model_bytes(export_onnx(g)), SAMPLES, not FUSED_INT8_EXACT)
    for i, feeds in enumerate(SAMPLES):
        got = {k: v[i] for k, v in runs.items()}
        mine = run_graph(g, feeds)
        exp = run_graph(ref, feeds)
        for name in ("y", "t"):
            lsb = float(used[name].scale)
            assert np.max(np.abs(got[name] - mine[name])) <= lsb * 1.001, name
            assert np.max(np.abs(mine[name] - exp[name])) <= lsb * 4, name
