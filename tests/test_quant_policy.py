"""The quantization policy held in the registry, and the default SQNR floor (issue 16).

Structure: the pattern-level rules of compiler/ops/quant_rules.py recognise a decomposed
LayerNorm, a GELU (Erf) chain, a residual Add and a Softmax input from the graph alone, and fire
on nothing in a CNN. Numerics: two zoo transformers meet the 25 dB floor on --inputs with at least
60% of their MatMul/Gemm nodes int8 at >= 30 dB; a near-cancellation that int8 must miss fails
with --strict (exit 1), falls back to float by default, and stays int8 with --min-sqnr off.
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
from compiler.ir import Graph
from compiler.ops.quant_rules import QUANT_RULES, float_by_rule
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from compiler.quant.options import DEFAULT_MIN_SQNR, QuantOptions
from compiler.quant.plan import make_plan
from frontends.onnx.loader import load_onnx
from tests.helpers.onnx_text import rand
from tests.helpers.quant_models import cancellation_net, conv_gemm_net, encoder_block
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

ZOO_MODELS = ["bert", "distilbert"]
MIN_SHARE = 0.6


def optimized(model: onnx.ModelProto) -> Graph:
    g = load_onnx(model)
    PassManager(pipeline("default")).run(g)
    return g


def rule_hits(g: Graph) -> dict[str, str]:
    """Output name of each node a rule keeps float -> the rule's name."""
    return {g.node(n).output_names[0]: r.name for n, r in float_by_rule(g).items()}


# --------------------------------------------------------------------------------- structure
def test_rules_recognise_the_encoder_patterns() -> None:
    hits = rule_hits(optimized(encoder_block()))
    assert hits == {
        "d2": "norm-chain",  # (x - mean)^2
        "ve": "norm-chain",  # var + eps
        "ng": "norm-chain",  # * gamma
        "ln": "norm-chain",  # + beta
        "hb": "pointwise-chain",  # the dense bias add that feeds the GELU
        "e1": "pointwise-chain",  # erf + 1
        "hm": "pointwise-chain",  # x * (...)
        "gl": "pointwise-chain",  # * 0.5
        "r": "residual-add",
        "sc": "softmax-input",  # q k^T / 4
        "sm": "softmax-input",  # + mask
    }
    assert [r.name for r in QUANT_RULES] == ["norm-chain", "pointwise-chain", "residual-add", "softmax-input"]


def test_rules_do_not_fire_on_a_cnn() -> None:
    """Must-not-fire: conv + skip Add, Relu, pools and a Gemm head hold none of the patterns."""
    g = optimized(conv_gemm_net())
    assert float_by_rule(g) == {}
    assert make_plan(g, float_tail=True).by_rule == {}


def test_plan_keeps_rule_ops_float_and_still_observes_them() -> None:
    g = optimized(encoder_block())
    plan = make_plan(g, float_tail=True)
    again = make_plan(g, float_tail=True)
    assert plan.nodes == again.nodes and plan.by_rule == again.by_rule  # deterministic
    ops = {g.node(n).output_names[0]: g.node(n).op for n in plan.nodes}
    assert set(ops.values()) == {"MatMul"}  # every elementwise op of the block stays float
    assert {g.node(n).output_names[0] for n in plan.by_rule} == set(rule_hits(g))
    assert all("(policy: " in plan.skipped[g.node(n).output_names[0]] for n in plan.by_rule)
    assert "hb" in plan.observe and "r" in plan.observe  # calibrated: a measurement may admit them
    bare = make_plan(g, float_tail=True, policy_rules=False)
    assert not bare.by_rule and len(bare.nodes) > len(plan.nodes)


# ------------------------------------------------------------------------------- the options
def test_floor_options() -> None:
    assert QuantOptions().floor_db == DEFAULT_MIN_SQNR == 25.0
    assert QuantOptions(min_sqnr=30.0).floor_db == 30.0
    assert QuantOptions(floor=False).floor_db is None
    with pytest.raises(OptionError):
        QuantOptions(min_sqnr=30.0, floor=False)
    with pytest.raises(OptionError):
        QuantOptions(strict=True, floor=False)
    view = QuantOptions().manifest_view()
    assert view["min_sqnr"] == 25.0 and view["min_sqnr_default"] and not view["strict"]


# ------------------------------------------------------------------------ the floor, end to end
@pytest.fixture(scope="module")
def cancel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cancel")
    onnx.save(cancellation_net(), str(d / "m.onnx"))
    np.savez(d / "calib.npz", x=np.stack([rand(1, 16, seed=s) for s in range(8)]))
    np.savez(d / "in.npz", x=rand(1, 16, seed=99))
    return {"model": d / "m.onnx", "calib": d / "calib.npz", "inputs": d / "in.npz", "dir": d}


def compile_cancel(cancel: dict[str, Path], name: str, *extra: str) -> tuple[int, Path]:
    out = cancel["dir"] / name
    args = ["compile", cancel["model"], "-o", out, "--quantize", "int8", "--calib", cancel["calib"]]
    return main([str(a) for a in [*args, "--inputs", cancel["inputs"], *extra]]), out


def quant_manifest(out: Path) -> dict[str, Any]:
    q: dict[str, Any] = json.loads((out / "manifest.json").read_text())["quantization"]
    return q


def test_strict_exits_1_when_int8_misses_the_floor(
    cancel: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = compile_cancel(cancel, "strict", "--strict")
    err = capsys.readouterr().err
    assert code == 1 and not out.exists()
    assert "SQNR floor of 25 dB" in err and "'y'" in err and "--strict" in err


def test_default_floor_falls_back_and_says_so(cancel: dict[str, Path]) -> None:
    code, out = compile_cancel(cancel, "default")
    assert code == 0
    q = quant_manifest(out)
    floor = q["sqnr_floor"]
    assert floor["default"] and floor["min_sqnr_db"] == 25.0
    assert floor["measured_on"] == {"calibration_samples": 8, "inputs_samples": 1}
    assert floor["all_int8_worst_db"] < 0.0  # the cancellation: int8 noise exceeds the signal
    assert floor["action"].startswith("fell back") and floor["worst_db"] >= 25.0
    assert q["float_fallback"] and q["mixed_precision"]["inputs_outputs"]["y"]["sqnr_db"] >= 25.0
    assert all("SQNR floor 25 dB" in q["float_nodes"][name] for name in q["float_fallback"])
    assert "Default floor 25 dB on the worst output" in (out / "report.md").read_text()


def test_min_sqnr_off_disables_the_floor(cancel: dict[str, Path]) -> None:
    code, out = compile_cancel(cancel, "off", "--min-sqnr", "off", "--no-verify")
    assert code == 0
    q = quant_manifest(out)
    assert q["sqnr_floor"]["action"] == "off" and q["options"]["min_sqnr"] is None
    assert q["quantized_nodes"] == 2 and q["float_fallback"] == []  # both Gemms int8, below the floor
    assert min(s["sqnr_db"] for s in q["full_model"].values()) < DEFAULT_MIN_SQNR
    assert "SQNR floor off" in (out / "report.md").read_text()


def test_floor_flag_errors(cancel: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad:  # argparse refuses the value
        compile_cancel(cancel, "e1", "--min-sqnr", "loud")
    assert bad.value.code == 2 and "give a number of dB or 'off'" in capsys.readouterr().err
    assert compile_cancel(cancel, "e2", "--min-sqnr", "off", "--strict")[0] == 2
    assert "--strict" in capsys.readouterr().err


# ---------------------------------------------------------------------------- zoo transformers
def matmul_share(model: Path) -> tuple[int, int]:
    """(MatMul/Gemm nodes whose input 1 is a DequantizeLinear output, all MatMul/Gemm nodes)."""
    g = onnx.load(str(model)).graph
    dq = {o for n in g.node if n.op_type == "DequantizeLinear" for o in n.output}
    mms = [n for n in g.node if n.op_type in ("MatMul", "Gemm")]
    return sum(1 for n in mms if n.input[1] in dq), len(mms)


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_transformer_meets_the_floor_with_matmuls_int8(
    name: str,
    zoo: ZooCache,  # noqa: F811
    tmp_path: Path,
) -> None:
    m = zoo.get(name)
    out = tmp_path / "out"
    args = ["compile", m.model, "-o", out, "--quantize", "int8", "--calib", m.calib, "--inputs", m.inputs]
    assert main([str(a) for a in args]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    worst = min(o["sqnr_db"] for a in manifest["verification"]["artifacts"] for o in a["outputs"])
    int8, total = matmul_share(out / "model.onnx")
    assert worst >= 30.0, worst  # on --inputs, against onnxruntime on the float model
    assert int8 >= MIN_SHARE * total, f"{int8}/{total} MatMul/Gemm int8"
    q = manifest["quantization"]
    assert q["sqnr_floor"]["action"] == "met" and q["sqnr_floor"]["worst_db"] >= 30.0
    rules = q["policy"]["kept_float_by_rule"]
    assert {"pointwise-chain", "residual-add", "softmax-input"} <= set(rules), rules
