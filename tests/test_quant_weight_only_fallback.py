"""The output floor of weight-only quantization: layers that fall back to int8 (under int4) or float.

* The search (:mod:`compiler.quant.layer_fallback`, shared with MNN's weight plan) on a scripted
  trial: it raises the fewest, most sensitive layers, tier by tier.
* ``quantize-weights`` on a 3-layer MLP whose first weight has an outlier in every block: int4
  with the default floor 0.98 keeps every layer at int4 (measured 0.9834 >= 0.982 on the seed-0
  inputs); a floor of 0.995 keeps h1 and y at int8 (each one's reason and score in the record),
  and the exported model then holds 0.995 against fp32 (measured 0.9958); int8w with 0.99999 keeps
  layers float (kept_float names the fallback); ``min_cosine=0`` turns the plan off; idempotent.
* ``--weight-min-cosine`` on the command line, and its refusals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from compiler.cli import main
from compiler.errors import OptionError
from compiler.metrics import agreement
from compiler.options import CompileOptions
from compiler.pass_infra import PassContext
from compiler.quant.layer_fallback import goal_of, tiered_fallback
from compiler.quant.options import QuantOptions
from frontends.onnx.loader import load_onnx
from passes.quantize_weights import QuantizeWeights
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, ort, ort_graph, run_passes


class _Scripted:
    """A trial whose cosine is 1 - the sum of each layer's cost at its tier (weights are (tier, layer))."""

    def __init__(self, cost: list[list[float]]) -> None:
        self.cost = cost
        self.runs = 0

    def cosine(self, weights: list[np.ndarray]) -> float:
        self.runs += 1
        return 1.0 - sum(self.cost[int(w[1])][int(w[0])] for w in weights)


def _tiers(layers: int, tiers: int) -> list[list[np.ndarray]]:
    return [[np.array([t, i]) for i in range(layers)] for t in range(tiers)]


def test_search_raises_the_fewest_most_sensitive_layers() -> None:
    # per layer: cost at int4, int8, float
    cost = [[0.001, 0.0, 0.0], [0.010, 0.001, 0.0], [0.002, 0.0, 0.0], [0.008, 0.0, 0.0]]
    # every layer int4: 0.979; alone at int4 (the others int8): layer 1 0.990, 3 0.991, 2 0.997, 0 0.998;
    # raising layer 1 alone gives 0.988, layers 1 and 3 0.996
    found = tiered_fallback(_Scripted(cost), _tiers(4, 3), 0.99)  # type: ignore[arg-type]
    assert found.raised == [[1, 3], []] and found.cosine == pytest.approx(0.996)
    assert found.cosine_all_low == pytest.approx(0.979) and found.alone[1] == pytest.approx(0.990)
    found = tiered_fallback(_Scripted(cost), _tiers(4, 3), 0.9975)  # type: ignore[arg-type]
    assert found.raised == [[1, 2, 3], []] and found.cosine == pytest.approx(0.998)
    assert tiered_fallback(_Scripted(cost), _tiers(4, 3), 0.97).raised == [[], []]  # type: ignore[arg-type]
    # every layer at int8 misses the goal: the float tier is searched first
    cost = [[0.02, 0.004, 0.0], [0.02, 0.0001, 0.0], [0.02, 0.0001, 0.0]]
    found = tiered_fallback(_Scripted(cost), _tiers(3, 3), 0.999)  # type: ignore[arg-type]
    assert found.raised == [[1, 2], [0]] and found.cosine >= 0.999
    assert found.tier_of(0) == 2 and found.tier_of(1) == 1
    assert goal_of(0.98) == pytest.approx(0.982)


W1 = rand(128, 128, seed=1)
W1[::32, :] *= 30  # an outlier in every block of W1's rows
MLP = text_model(
    "g (float[16,128] x) => (float[16,64] y) "
    "{ h1 = MatMul(x, W1) r1 = Relu(h1) h2 = MatMul(r1, W2) r2 = Relu(h2) y = MatMul(r2, W3) }",
    17,
    8,
    W1=W1,
    W2=rand(128, 128, seed=2),
    W3=rand(128, 64, seed=3),
)


def _run(spec: QuantizeWeights) -> tuple[Any, dict[str, Any], PassContext]:
    g = load_onnx(MLP)
    q = QuantOptions(mode=f"int{spec.bits}w")
    ctx = PassContext(options=CompileOptions(model=Path("m.onnx"), out_dir=Path("out"), quant=q))
    run_passes(g, [spec], ctx)
    return g, ctx.state["quantize-weights"], ctx


def test_default_floor_holds_without_fallback() -> None:
    _, record, _ = _run(QuantizeWeights())
    fb = record["fallback"]
    assert (fb["min_cosine"], fb["samples"], fb["int8"], fb["float"]) == (0.98, "seed 0", [], [])
    assert fb["cosine"] == fb["cosine_all_quantized"] >= 0.982  # measured 0.98336
    assert [layer["bits"] for layer in record["layers"]] == [4, 4, 4]
    _, off, _ = _run(QuantizeWeights(min_cosine=0))
    assert "fallback" not in off


def test_int4_falls_back_to_int8_until_the_floor_holds() -> None:
    g, record, _ = _run(QuantizeWeights(min_cosine=0.995))
    fb = record["fallback"]
    assert [e["node"] for e in fb["int8"]] == ["h1", "y"] and fb["float"] == []
    assert fb["cosine_all_quantized"] < 0.9955 <= fb["cosine"]  # measured 0.98336 -> 0.99631
    bits = {layer["node"]: layer["bits"] for layer in record["layers"]}
    assert bits == {"h1": 8, "h2": 4, "y": 8}
    for layer in record["layers"]:
        assert ("fallback" in layer) == (layer["bits"] == 8)
    assert record["layers"][0]["fallback"].startswith(
        "int8 fallback for the output floor: every layer at int4"
    )
    assert "this layer alone at int4 (the others int8) gives 0.990523" in record["layers"][0]["fallback"]
    attrs = {n.output_names[0]: n.attrs.bits for n in g.ops() if n.op == "WeightOnlyMatMul"}
    assert attrs == bits
    feeds = {"x": rand(16, 128, seed=0)}
    assert agreement(ort_graph(g, feeds)["y"], ort(MLP, feeds)["y"]).cosine >= 0.995  # measured 0.9958
    assert not run_passes(g, [QuantizeWeights(min_cosine=0.995)], PassContext()).changed  # idempotent


def test_int8_falls_back_to_float() -> None:
    g, record, ctx = _run(QuantizeWeights(bits=8, min_cosine=0.99999))
    fb = record["fallback"]
    assert fb["float"] and fb["int8"] == []
    kept = {m.node: m.reason for m in ctx.near_misses}
    for entry in fb["float"]:
        assert kept[entry["node"]].startswith("kept float (float fallback for the output floor")
        assert g.find_value(entry["node"]).producer.op == "MatMul"
    assert op_counts(g).get("kiln::WeightOnlyMatMul", 0) == 3 - len(fb["float"])


def test_cli_weight_min_cosine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(MLP, src)
    out = tmp_path / "out"
    assert (
        main(["compile", str(src), "-o", str(out), "--quantize", "int4w", "--weight-min-cosine", "0.995"])
        == 0
    )
    printed = capsys.readouterr().out
    assert "weight-only fallback: 2 int8 (h1, y) for the output cosine floor 0.995" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["quant"]["weight_min_cosine"] == 0.995
    assert [e["node"] for e in manifest["quantization"]["fallback"]["int8"]] == ["h1", "y"]
    bad = tmp_path / "bad"
    assert (
        main(["compile", str(src), "-o", str(bad), "--quantize", "int8", "--weight-min-cosine", "0.9"]) == 2
    )
    assert main(["compile", str(src), "-o", str(bad), "--quantize", "int4w", "--weight-min-cosine", "2"]) == 2
    assert not bad.exists()
    with pytest.raises(OptionError, match="min_cosine must be in"):
        QuantizeWeights(min_cosine=1.5)
