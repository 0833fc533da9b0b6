"""The SQNR floor's fallback ranks layers by noise removed per int8 op (compiler/quant/mixed_precision.py).

Structure: c_L counts a linear layer's multiply-accumulates and one op per output element of any
other layer; the ranking puts a cheap layer that holds nearly a MatMul's noise ahead of the MatMul,
and keeps the single-layer order where the costs are equal, or without hold-out samples
(must-not-fire of the reordering).
"""

from __future__ import annotations

from compiler.quant.mixed_precision import fallback_order, sensitivity_order
from compiler.quant.plan import make_plan
from compiler.quant.sensitivity import LayerSensitivity, Score, SensitivityReport, layer_cost
from frontends.onnx.loader import load_onnx
from tests.helpers.quant_models import conv_gemm_net


def layer(node: int, op: str, db: float, cost: int, other_db: float = 60.0) -> LayerSensitivity:
    outs = {"y": Score(db, 1.0), "p": Score(other_db, 1.0)}
    return LayerSensitivity(node, f"n{node}", op, Score(min(db, other_db), 1.0), outs, cost)


def test_layer_cost_counts_macs_of_linear_layers_and_elements_of_others() -> None:
    g = load_onnx(conv_gemm_net())
    plan = make_plan(g)
    costs = {g.node(n).output_names[0]: layer_cost(g, g.node(n)) for n in plan.nodes}
    assert costs["c1"] == 4 * 8 * 8 * (3 * 3 * 3)  # |y| x C_in kh kw
    assert costs["c2"] == 4 * 8 * 8 * (4 * 3 * 3)
    assert costs["s"] == 4 * 8 * 8  # the Add: one op per output element
    assert costs["y"] == 8 * 4  # Gemm: |y| x K


def test_cheap_layer_with_comparable_noise_goes_first() -> None:
    report = SensitivityReport(
        layers=[
            layer(1, "MatMul", 37.0, 29_000_000),  # the most sensitive alone, 768 MACs per output
            layer(2, "Add", 39.0, 38_000),  # 63% of its noise at 1/768 of its work
            layer(3, "MatMul", 40.0, 29_000_000),
            layer(4, "Mul", 70.0, 38_000),  # cheap but noiseless: ranked after the MatMuls
        ]
    )
    assert fallback_order(report, "y") == [2, 1, 3, 4]
    assert sensitivity_order(report) == [1, 2, 3, 4]  # without hold-out samples: no reordering
    # B = 10^-3.8 (an aim of 38 dB): layer 1 alone exceeds it and leads; layer 4 (n < 1e-3 B) trails
    budget = 10.0**-3.8
    assert fallback_order(report, "y", budget) == [1, 2, 3, 4]
    report.layers.append(layer(5, "Add", 75.0, 1))  # the best ratio, but negligible
    assert fallback_order(report, "y", budget) == [1, 2, 3, 5, 4]  # the trailing group by ratio too
    assert fallback_order(report, "y")[0] == 5


def test_equal_costs_keep_the_single_layer_order() -> None:
    report = SensitivityReport(
        layers=[layer(1, "Conv", 40.0, 1000), layer(2, "Conv", 35.0, 1000), layer(3, "Conv", 38.0, 1000)]
    )
    assert fallback_order(report, "y") == [2, 3, 1]
    # o* decides: on output p, layer 3 is the noisiest, then layer 1
    report.layers[0] = layer(1, "Conv", 40.0, 1000, other_db=50.0)
    report.layers[2] = layer(3, "Conv", 38.0, 1000, other_db=30.0)
    assert fallback_order(report, "p") == [3, 1, 2]
    assert fallback_order(report) == [3, 2, 1]  # default: each layer's worst output
