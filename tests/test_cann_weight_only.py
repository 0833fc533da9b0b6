"""kiln::WeightOnlyMatMul in a CANN ``.om``: AscendAntiQuant of the int8 levels feeding BatchMatMulV2.

The reference documents no fused weight-only matrix product (no WeightQuantBatchMatmulV2), so the
op is written with the documented AscendAntiQuant (one scale and offset per tensor) on the levels,
Sub / Mul by the per-block zero points and scales, Reshape (StridedSliceV2 for a short last block)
and BatchMatMulV2 (+ Add for the bias). Checks, for the ge and domi schemas:

* the file passes the strict reader of ``shared/reference/cann/tools`` and Kiln's own, holds the
  levels as one Const per layer (read back as int8 values; no float32 weight) and the op chain above;
* read back by Kiln's ``.om`` reader (AscendAntiQuant -> DequantizeLinear), onnxruntime on it
  equals the op's reference within 1e-5 · max(1, max|e|) (measured <= 4e-7);
* Netron accepts the ge file and shows its ops and the bytes Kiln wrote.
* ge schema: the 4-bit levels are ``DT_INT4`` Consts of ceil(n / 2) bytes (two levels a byte, low
  nibble first), the 8-bit ones ``DT_INT8``; Kiln's reader unpacks them exactly and refuses an
  int4 constant of the wrong size.
"""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.cann.backend import BACKEND as CANN
from backends.cann.emit import om_bytes
from backends.cann.options import CannOptions
from compiler.api import load_model
from compiler.errors import ModelFileError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.ir.types import DType
from compiler.onnx_export import export_onnx, model_bytes
from compiler.runners import run_onnxruntime
from compiler.support_matrix import support_matrix
from frontends.cann.decode import Decoder
from frontends.cann.loader import read_om_graph
from schemas.cann.generated import ge_ir_pb2 as ge
from schemas.cann.int4 import PROTO_INT4, pack_int4, unpack_int4
from schemas.cann.om_graph import TensorDesc
from tests.conftest import SHARED
from tests.helpers.cann import assert_netron_shows, ge_consts, netron_check
from tests.helpers.numerics import assert_close
from tests.helpers.pass_check import run_passes
from tests.helpers.weight_only_graphs import Layer, weight_only_graph

TOL = 1e-5
# (a shape, N, bits, block, scale dtype, symmetric, bias)
LAYERS: list[Layer] = [
    ((2, 5, 256), 48, 4, 32, "fp16", True, True),
    ((7, 200), 40, 4, 64, "fp32", False, False),  # K = 200: a short last block (StridedSliceV2)
    ((1, 9, 384), 24, 8, 128, "fp16", False, True),
]


def _graph() -> tuple[Graph, dict[str, np.ndarray]]:
    return weight_only_graph(LAYERS, seed=1)


def _shared_reader() -> Any:
    path = SHARED / "reference" / "cann" / "tools" / "om_container.py"
    spec = importlib.util.spec_from_file_location("reference_om_container", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("schema", ["ge", "domi"])
def test_om_holds_the_levels_and_reads_back_to_the_reference(tmp_path: Path, schema: str) -> None:
    g, feeds = _graph()
    ref = run_graph(g, feeds)
    run_passes(g, CANN.legalization("cann", None))
    assert {n.qualified_op for n in g.ops()} == {"kiln::WeightOnlyMatMul"}
    data = om_bytes(g, CannOptions(schema=schema))
    parsed = _shared_reader().read_om(data)  # the reference's strict reader (GE's loader checks)
    assert parsed["wide"] and len(parsed["parts"]) == 2
    _, om = read_om_graph(data, "model.om")
    types = collections.Counter(op.type for op in om.ops)
    assert types["AscendAntiQuant"] == types["BatchMatMulV2"] == len(LAYERS)
    assert types["Sub"] == 2 and types["Mul"] == len(LAYERS) and types["Add"] == 2  # zero points, bias
    assert types["StridedSliceV2"] == 1 and types["WeightQuantBatchMatmulV2"] == 0
    consts = [op.value for op in om.ops if op.type == "Const" and op.value is not None]
    levels = [c for c in consts if c.dtype == np.int8]
    assert len(levels) == len(LAYERS)
    assert all(c.dtype != np.float32 or c.size < 16 * 96 for c in consts)  # no dequantized weight
    path = tmp_path / "model.om"
    path.write_bytes(data)
    back = load_model(path)
    got = run_onnxruntime(model_bytes(export_onnx(back)), feeds)
    for name, e in ref.items():
        assert_close(got[name], e, rtol=0.0, atol=TOL * max(1.0, float(np.abs(e).max())), what=name)
    if schema == "ge":
        (verdict,) = netron_check([path])
        assert_netron_shows(path, verdict)


def test_support_matrix_lists_cann_native() -> None:
    cell = support_matrix(["cann"]).rows["kiln::WeightOnlyMatMul"]["cann"]
    assert cell.status == "native"


def test_ge_file_holds_4_bit_levels_as_packed_int4(tmp_path: Path) -> None:
    g, _ = _graph()
    run_passes(g, CANN.legalization("cann", None))
    path = tmp_path / "model.om"
    path.write_bytes(om_bytes(g, CannOptions(schema="ge")))
    model, _ = ge_consts(path)
    levels = {}
    for op in model.graph[0].op:
        d = op.attr["value"].t.desc if op.type == "Const" else None
        if d is not None and d.dtype in (PROTO_INT4, ge.DT_INT8):
            levels[op.name] = (ge.DataType.Name(d.dtype), tuple(d.shape.dim), d.weight_size)
    want = {}
    for i, (a, n, bits, block, *_) in enumerate(LAYERS):
        nb = -(-a[-1] // block)
        count = nb * block * n
        want[f"y{i}/levels"] = (
            ("DT_INT4", (nb, block, n), count // 2) if bits == 4 else ("DT_INT8", (nb, block, n), count)
        )
    assert levels == want
    _, om = read_om_graph(path.read_bytes(), "model.om")
    back = {op.name: op.value for op in om.ops if op.name in want and op.value is not None}
    q0 = g.inputs_of(next(n for n in g.ops() if n.name == "y0"))[1]
    assert q0 is not None and q0.const is not None
    np.testing.assert_array_equal(back["y0/levels"].reshape(-1, q0.const.shape[0]).T, q0.const)  # exact


def test_int4_codec_and_size_check() -> None:
    assert pack_int4(np.array([1, -2, -8], np.int8)) == bytes([0x01 | 0xE << 4, 0x08])  # low nibble first
    v = np.arange(-8, 8, dtype=np.int8).reshape(4, 4)[:, :3]
    np.testing.assert_array_equal(unpack_int4(pack_int4(v), v.shape), v)
    with pytest.raises(ValueError, match=r"must lie in \[-8, 7\]"):
        pack_int4(np.array([8]))
    blob = bytes(512) + pack_int4(np.array([3, -3, 5], np.int8)) + bytes(510)
    d = TensorDesc(DType.INT8, (3,), int4=True)
    np.testing.assert_array_equal(Decoder("m.om", blob).array(d, b"", 512, 2, "w"), [3, -3, 5])
    with pytest.raises(ModelFileError, match=r"weight_size 3 != 2 bytes of int4\[3\]"):
        Decoder("m.om", blob).array(d, b"", 512, 3, "w")  # the int8 size of 3 levels
