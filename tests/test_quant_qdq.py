"""QDQ insertion: structure, parameters, keep-float, and onnxruntime on the same QDQ model."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from compiler.ir import DType, Graph, run_graph, verify
from compiler.metrics import agreement
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from compiler.quant.params import QRANGE, bias_params, dequantize, quantize, range_params, weight_params
from compiler.quant.plan import make_plan
from compiler.quant.qdq import activation_params, insert_qdq
from frontends.onnx.loader import load_onnx
from tests.helpers.onnx_text import rand
from tests.helpers.pass_check import op_counts, ort, ort_graph
from tests.helpers.quant_models import conv_gemm_net

SAMPLES = [{"x": rand(1, 3, 8, 8, seed=s)} for s in range(4)]


def model() -> Graph:
    m = conv_gemm_net()
    g = load_onnx(m)
    PassManager(pipeline("default")).run(g)
    return g


def minmax_ranges(g: Graph, names: list[str]) -> dict[str, tuple[float, float]]:
    lo = {n: np.inf for n in names}
    hi = {n: -np.inf for n in names}
    for feeds in SAMPLES:
        vals = run_graph(g, feeds, keep_all=True)
        for n in names:
            lo[n] = min(lo[n], float(vals[n].min()))
            hi[n] = max(hi[n], float(vals[n].max()))
    return {n: (lo[n], hi[n]) for n in names}


def quantized(keep_float: tuple[str, ...] = ()) -> tuple[Graph, Graph]:
    g = model()
    ref = g.clone()
    plan = make_plan(g, keep_float)
    params = activation_params(g, minmax_ranges(g, plan.observe), DType.UINT8, symmetric=False)
    insert_qdq(g, plan, params)
    verify(g)
    return ref, g


def test_params_math() -> None:
    p = range_params(-1.0, 3.0, DType.UINT8, symmetric=False)
    assert float(p.scale) == pytest.approx(4 / 255) and int(p.zero_point) == 64
    sym = range_params(-2.0, 1.0, DType.INT8, symmetric=True)
    assert float(sym.scale) == np.float32(2.0 / 127) and int(sym.zero_point) == 0  # ORT's [-127, 127]
    zero = range_params(0.0, 0.0, DType.UINT8, symmetric=False)
    assert np.isfinite(zero.scale) and float(zero.scale) > 0
    w = rand(4, 3, 3, 3, seed=7)
    w[2] = 0.0  # an all-zero channel keeps a finite scale
    wp = weight_params(w, 0)
    assert wp.scale.shape == (4,) and np.all(np.isfinite(wp.scale)) and np.all(wp.scale > 0)
    err = np.abs(dequantize(quantize(w, wp), wp) - w).max(axis=(1, 2, 3))
    assert np.all(err <= wp.scale / 2 + 1e-7)
    bp = bias_params(np.float32(0.02), wp)
    assert bp.dtype == DType.INT32 and np.allclose(bp.scale, 0.02 * wp.scale)
    q = quantize(np.array([1e9, -1e9], np.float32), p)
    assert list(q) == [QRANGE[DType.UINT8][1], QRANGE[DType.UINT8][0]]


def test_structure_after_qdq() -> None:
    ref, g = quantized()
    counts = op_counts(g)
    # inputs of 2 fused convs, the Add (2 inputs share r1) , pool/GAP passthrough-or-quantized, gemm
    assert counts["kiln::FusedConv"] == 1 and counts["Conv"] + counts["kiln::FusedConv"] == 2
    assert counts["QuantizeLinear"] == counts["DequantizeLinear"] - sum(
        1
        for n in g.ops()
        if n.op == "DequantizeLinear" and g.inputs_of(n)[0].const is not None  # type: ignore[union-attr]
    )
    dq_consts = [n for n in g.ops() if n.op == "DequantizeLinear" and g.inputs_of(n)[0].const is not None]  # type: ignore[union-attr]
    dtypes = Counter(g.inputs_of(n)[0].type.dtype for n in dq_consts)  # type: ignore[union-attr]
    assert dtypes[DType.INT8] == 3 and dtypes[DType.INT32] == 3  # 3 weights, 3 biases
    for n in dq_consts:
        c = g.inputs_of(n)[0]
        assert c is not None
        if c.type.dtype == DType.INT8:
            assert n.attrs.axis in (0,) and g.inputs_of(n)[1].type.shape in ((4,), (8,))  # type: ignore[union-attr]


def test_maxpool_shares_its_input_scale() -> None:
    g = model()
    plan = make_plan(g)
    params = activation_params(g, minmax_ranges(g, plan.observe), DType.UINT8, symmetric=False)
    pool = next(n for n in g.ops() if n.op == "MaxPool")
    src = g.inputs_of(pool)[0]
    assert src is not None
    assert params[g.value(pool).name] is params[src.name]


def test_onnxruntime_runs_the_same_qdq_model_within_one_lsb() -> None:
    ref, g = quantized()
    for feeds in SAMPLES:
        exp = ort_graph(ref, feeds)["y"]
        got_ort = ort_graph(g, feeds)["y"]
        got_kiln = run_graph(g, feeds)["y"]
        # The output is quantized (uint8 grid): Kiln's interpreter and onnxruntime agree within 1 LSB.
        out_dq = next(n for n in g.ops() if n.op == "DequantizeLinear" and g.value(n).name == "y")
        lsb = float(g.inputs_of(out_dq)[1].const)  # type: ignore[union-attr, arg-type]
        assert np.max(np.abs(got_kiln - got_ort)) <= lsb * 1.001
        assert agreement(got_ort, exp).sqnr_db > 25


def test_keep_float_by_op_type_and_regex() -> None:
    _, g = quantized(("Gemm",))
    gemm = next(n for n in g.ops() if n.op == "Gemm")
    w = g.inputs_of(gemm)[1]
    assert w is not None and w.const is not None and w.const.dtype == np.float32
    plan = make_plan(model(), ("c[12]",))
    assert any("keep-float" in why for why in plan.skipped.values())


def test_export_of_qdq_model_matches_kiln_interpreter() -> None:
    _, g = quantized()
    from compiler.onnx_export import export_onnx

    m = export_onnx(g)
    ops = Counter(n.op_type for n in m.graph.node)
    assert ops["QuantizeLinear"] >= 3 and ops["DequantizeLinear"] >= 9
    out = ort(m, SAMPLES[0])["y"]
    assert np.all(np.isfinite(out))
