"""decompose: RotaryEmbedding and Attention (opset 23) into elementary ops.

Numerics: onnxruntime on the original opset-23 node vs onnxruntime on Kiln's decomposed graph;
max|diff| <= 2e-6 * max(1, max|ref|) (float32; attention sums terms of both signs and the two
sides order the softmax and matmul sums differently). Structure: no Attention/RotaryEmbedding
is left, and the dead-row guard (ReduceMax/Equal) appears only where a float mask can be -inf.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.cli import main
from tests.helpers.decompose_check import decompose_matches_ort, fake_table, refusals
from tests.helpers.ort_parity import node_case, one_node_model
from tests.helpers.pass_check import op_counts
from tests.test_ops_transformer_onnx import NODE_CASES

MAX_REL = 2e-6
OPS = (
    "Reshape", "Transpose", "Concat", "Expand", "MatMul", "Mul", "Div", "Tanh", "Where", "Add",
    "Softmax", "ReduceMax", "Equal", "Gather", "Slice", "Sub",
)  # fmt: skip
TABLE = fake_table(OPS)

# the opset-23 node cases of the op tests (every rotary and attention case there)
CASES = [n for n in NODE_CASES if "rotary" in n or "attention" in n]


@pytest.mark.parametrize("name", CASES)
def test_matches_onnxruntime(name: str) -> None:
    model, feeds = node_case(name)
    g = decompose_matches_ort(model, feeds, max_rel=MAX_REL, table=TABLE)
    counts = op_counts(g)
    assert "Attention" not in counts and "RotaryEmbedding" not in counts, counts
    if "attention" in name:
        assert counts["MatMul"] == 2 and counts["Softmax"] == 1, counts


def _runtime_mask_model(neginf_rows: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    m = rng.standard_normal((1, 1, 3, 3)).astype(np.float32)
    if neginf_rows:
        m[0, 0, 1, :] = -np.inf  # query 1 sees no key: the op gives 0 there
    ins = [("q", q), ("k", k), ("v", v), ("mask", m)]
    return one_node_model("Attention", ins, {}, opset=23)


def test_runtime_float_mask_with_dead_row_gets_the_guard() -> None:
    model, feeds = _runtime_mask_model(neginf_rows=True)
    g = decompose_matches_ort(model, feeds, max_rel=MAX_REL, table=TABLE)
    counts = op_counts(g)
    assert counts["ReduceMax"] == 1 and counts["Equal"] == 1 and counts["Where"] == 1, counts


def test_bool_mask_needs_no_guard() -> None:
    """Must-not-fire: a bool mask (lowest value, finite) never takes the dead-row rule."""
    model, feeds = node_case("test_attention_4d_attn_mask_bool_4d")
    counts = op_counts(decompose_matches_ort(model, feeds, max_rel=MAX_REL, table=TABLE))
    assert "ReduceMax" not in counts and "Equal" not in counts, counts


def test_backend_without_equal_refuses_runtime_float_mask() -> None:
    """Without Equal, the runtime float mask (which may hide whole rows) is refused with reasons."""
    model, _ = _runtime_mask_model(neginf_rows=False)
    reasons, counts = refusals(model, fake_table(tuple(o for o in OPS if o != "Equal")))
    assert counts.get("Attention") == 1
    text = " ".join(reasons)
    assert "a float mask may mask whole rows with -inf" in text and "Equal" in text, reasons


def test_short_mask_is_refused() -> None:
    """Must-not-fire: a mask shorter than the keys (the op pads it) is left alone."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    model, _ = one_node_model(
        "Attention", [("q", q), ("k", k), ("v", v), ("mask", np.zeros((3, 2), bool))], {}, opset=23
    )
    reasons, counts = refusals(model, TABLE)
    assert counts.get("Attention") == 1 and any("covers 2 of 3 keys" in r for r in reasons), reasons


@pytest.mark.parametrize(
    "name", ["test_attention_3d_gqa_causal", "test_rotary_embedding_with_interleaved_rotary_dim"]
)
def test_backends_write_and_verify(name: str, tmp_path: Path) -> None:
    """The real backends take the decompositions: TVM cpu and MNN's runtime within 1e-5 of
    onnxruntime (verification), and the CANN file (checked against its ONNX export)."""
    model, feeds = node_case(name)
    src, inputs = tmp_path / "m.onnx", tmp_path / "in.npz"
    onnx.save(model, src)
    np.savez(inputs, **feeds)
    out = tmp_path / "out"
    argv = [
        "compile",
        str(src),
        "-o",
        str(out),
        "--emit",
        "mnn,cann",
        "--target",
        "cpu",
        "--inputs",
        str(inputs),
    ]
    assert main(argv) == 0
    ver = json.loads((out / "manifest.json").read_text())["verification"]
    assert ver["passed"]
    kinds = {a["path"] for a in ver["artifacts"]}
    assert {"model.mnn", "model.om", "cpu/model.so"} <= kinds, kinds
    assert all(o["max_rel"] <= 1e-5 for a in ver["artifacts"] for o in a["outputs"])
