"""CANN's int8 ops come from fuse-quantized-ops (kiln::QConv / kiln::QGemm), not from a matcher of its own.

* A QDQ conv the pass refuses (a grouped conv that is not depthwise) stays in Q/DQ form and is
  written in float, with the pass's reason logged and listed in the manifest; the file still reads
  back equal to Kiln's QDQ model.
* The table refuses, with a reason, a QConv / QGemm that Ascend's int8 ops cannot hold: an input
  that is not AscendQuant data on its grid, a uint8 graph output, a FullyConnection input that is
  not 2-D.
"""

from __future__ import annotations

import collections
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from backends.cann.backend import BACKEND as CANN
from compiler.api import load_model
from compiler.ir.graph import Graph
from compiler.ir.types import DType, TensorType
from compiler.onnx_export import export_onnx, model_bytes
from compiler.ops.fused import KILN
from compiler.ops.qconv import QConvAttrs
from compiler.ops.qgemm import QGemmAttrs
from compiler.runners import run_onnxruntime
from frontends.cann.loader import read_om_graph
from tests.helpers.cann import compile_tiny
from tests.helpers.onnx_text import rand, text_model

GROUPED = """
grouped (float[1, 4, 8, 8] x) => (float[1, 4, 8, 8] y) {
    c = Conv <pads = [1, 1, 1, 1], group = 2> (x, w, b)
    y = Relu (c)
}
"""


def test_refused_qdq_conv_is_written_in_float_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = text_model(GROUPED, opset=17, w=rand(4, 2, 3, 3, seed=1), b=rand(4, seed=2))
    with caplog.at_level(logging.WARNING, logger="backends.cann.emit"):
        out = compile_tiny(model, tmp_path / "out", "int8", "ge")
    manifest = json.loads((out / "manifest.json").read_text())
    (art,) = [a for a in manifest["artifacts"] if a["kind"] == "cann"]
    why = "group 2 is neither 1 nor depthwise"
    assert list(art["details"]["int8_fallbacks"].values()) == [why]
    assert why in caplog.text
    _, om = read_om_graph((out / "model.om").read_bytes(), "model.om")
    types = collections.Counter(op.type for op in om.ops)
    assert types["Conv2D"] == 1 and types["AscendAntiQuant"] == 1 and types["AscendDequant"] == 0
    x = np.random.default_rng(5).standard_normal((1, 4, 8, 8)).astype(np.float32)
    qdq = run_onnxruntime(out / "model.onnx", {"x": x})
    got = run_onnxruntime(model_bytes(export_onnx(load_model(out / "model.om"))), {"x": x})
    assert np.array_equal(got["y"], qdq["y"])


def _quantized(op: str, x_type: TensorType, w: np.ndarray, attrs: object, quantize_x: bool) -> Graph:
    """x (-> QuantizeLinear) -> kiln::QConv/QGemm -> y."""
    g = Graph("t")
    x = g.add_input("x", x_type)
    if quantize_x:
        s = g.add_constant(np.array(0.02, np.float32), "xs")
        z = g.add_constant(np.array(3, np.int8), "xz")
        x = g.value(g.add_node("QuantizeLinear", [x, s, z], name="q"))
    node = g.add_node(op, [x, g.add_constant(w, "w")], attrs, domain=KILN, name="n")
    g.set_outputs(g.outputs_of(node))
    return g


def _reason(g: Graph) -> str | None:
    (node,) = [n for n in g.ops() if n.domain == KILN]
    return CANN.capabilities("cann").reason(g, node)


@pytest.mark.parametrize(
    ("op", "x_shape", "quantize_x", "out_dtype", "reason"),
    [
        ("QConv", (1, 2, 4, 4), True, "float32", None),
        ("QConv", (1, 2, 4, 4), True, "int8", None),
        (
            "QConv",
            (1, 2, 4, 4),
            False,
            "float32",
            "input x is not the output of a QuantizeLinear, QConv or QGemm",
        ),
        (
            "QConv",
            (1, 2, 4, 4),
            True,
            "uint8",
            "its uint8 output (int8 on Ascend) is read by an op other than",
        ),
        ("QGemm", (4, 2), True, "float32", None),
        ("QGemm", (2, 4, 2), True, "float32", "FullyConnection reads a 2-D input (x has rank 3)"),
    ],
)
def test_table_refuses_what_ascend_int8_cannot_hold(
    op: str, x_shape: tuple[int, ...], quantize_x: bool, out_dtype: str, reason: str | None
) -> None:
    x_type = TensorType(DType.FLOAT32 if quantize_x else DType.INT8, x_shape)
    if op == "QConv":
        w = np.ones((3, 2, 1, 1), np.int8)
        attrs: object = QConvAttrs(x_scale=0.02, x_zero=3, w_scales=(0.1,), out_dtype=out_dtype)
    else:
        w = np.ones((2, 3), np.int8)
        attrs = QGemmAttrs(x_scale=0.02, x_zero=3, w_scales=(0.1,), out_dtype=out_dtype)
    why = _reason(_quantized(op, x_type, w, attrs, quantize_x))
    assert why is None if reason is None else why is not None and why.startswith(reason), why
