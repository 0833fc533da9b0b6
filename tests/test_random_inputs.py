"""Seeded verification inputs: integer inputs that index a table stay inside it.

Without ``--inputs`` Kiln verifies on seeded random inputs. Integers are drawn from [0, 4); an
input that (through Cast/Reshape/Unsqueeze/...) indexes a Gather axis of size 2 (a BERT-style
token-type table) must stay in [0, 2), or onnxruntime refuses the reference run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from compiler.cli import main
from compiler.input_spec import index_bounds, random_graph_inputs
from frontends.onnx.loader import load_onnx
from tests.helpers.onnx_text import rand, text_model

TOKEN_TYPES = """g (int64[1,6] ids, int64[1,6] types, int64[1,6] other) => (float[1,6,8] y, int64[1,6] o) {
     e = Gather(words, ids)
     t32 = Cast<to=6>(types)
     t4 = Unsqueeze(t32, zero)
     t = Squeeze(t4, zero)
     f = Gather(pairs, t)
     y = Add(e, f)
     o = Identity(other)
   }"""


def _model() -> onnx.ModelProto:
    return text_model(
        TOKEN_TYPES, words=rand(30, 8, seed=1), pairs=rand(2, 8, seed=2), zero=np.zeros(1, np.int64)
    )


def test_index_inputs_are_bounded_by_the_smallest_gathered_axis() -> None:
    g = load_onnx(_model())
    assert index_bounds(g) == {"ids": 30, "types": 2}  # 'other' indexes nothing: must not be bounded
    feeds = random_graph_inputs(g, seed=0)
    assert feeds["types"].max() < 2 and feeds["ids"].max() < 4 and feeds["other"].max() < 4
    assert {k: v.dtype for k, v in feeds.items()} == dict.fromkeys(feeds, np.dtype(np.int64))
    assert np.unique(random_graph_inputs(g, seed=1)["types"]).tolist() == [0, 1]


def test_compile_without_inputs_verifies_a_token_type_table(tmp_path: Path) -> None:
    onnx.save(_model(), tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o")]) == 0
    ver = json.loads((tmp_path / "o" / "manifest.json").read_text())["verification"]
    assert ver["passed"] and ver["inputs"] == "random normal, seed 0"
