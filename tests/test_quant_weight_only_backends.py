"""kiln::WeightOnlyMatMul in the backends: MNN natively, and the decomposition the others fall back to.

* MNN: the ``.mnn`` file holds the op's own levels and scales (read back by Kiln's MNN reader:
  symmetric weights bit for bit, asymmetric within one float32 rounding of MNN's (q - aMin)·s + m),
  and MNN's runtime equals the op's numpy reference, max|a - e| <= 1e-5 · max(1, max|e|)
  (measured <= 7e-7), for bits 4/8, blocks 32/64/128, fp16/fp32 scales, symmetric/asymmetric.
  A short last block (K not a multiple of the block) is written with MNN blocks of gcd(K, block)
  weights and repeated scales; below 16 such weights the layer is refused with the reason and
  written in float (the weight-only-dequantize decomposition), still within that tolerance.
* ``weight-only-dequantize`` (W as a float32 constant, MatMul + Add; what a table without the op
  falls back to, like MNN for the layers it refuses) equals the op's reference within
  1e-6 · max(1, max|e|). TVM and CANN lower the op natively (tests/test_tvm_weight_only.py,
  tests/test_cann_weight_only.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.mnn.backend import BACKEND as MNN
from backends.mnn.lower.table import TABLE as MNN_TABLE
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.ops.weight_only import dequantize_levels
from compiler.support_matrix import support_matrix
from frontends.mnn.loader import load_mnn
from frontends.onnx.loader import load_onnx
from passes.quantize_weights import QuantizeWeights
from tests.helpers.numerics import assert_close
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, run_passes

TOL = 1e-5  # MNN (fp32 "high" precision) against the reference: measured <= 7e-7
DECOMPOSED_TOL = 1e-6
CONFIGS = [
    (b, bs, sd, sym)
    for b in (4, 8)
    for bs in (32, 64, 128)
    for sd in ("fp16", "fp32")
    for sym in (True, False)
]
OP = "kiln::WeightOnlyMatMul"


def _quantized(spec: QuantizeWeights) -> tuple[Graph, dict[str, np.ndarray]]:
    """y1 = x @ W (K=256), y2 = Gemm(x2, Wg, C) (K=256, bias), y3 = x3 @ Wr (K=200: a short last
    block for every block size, MNN blocks of gcd(200, bs) = 8 weights), y4 = x4 @ W4 (K=320: for
    block 128 a short last block of 64, MNN blocks of 64), quantized by ``spec``."""
    model = text_model(
        "g (float[2,3,256] x, float[6,256] x2, float[4,200] x3, float[5,320] x4) => (float[2,3,40] y1, "
        "float[6,48] y2, float[4,24] y3, float[5,16] y4) "
        "{ y1 = MatMul(x, W) y2 = Gemm<transB=1>(x2, Wg, C) y3 = MatMul(x3, Wr) y4 = MatMul(x4, W4) }",
        17,
        8,
        W=rand(256, 40, seed=1),
        Wg=rand(48, 256, seed=2),
        C=rand(48, seed=3),
        Wr=rand(200, 24, seed=4),
        W4=rand(320, 16, seed=8),
    )
    g = load_onnx(model)
    run_passes(g, [spec])
    assert op_counts(g)[OP] == 4
    feeds = {"x": rand(2, 3, 256, seed=5), "x2": rand(6, 256, seed=6), "x3": rand(4, 200, seed=7)}
    return g, feeds | {"x4": rand(5, 320, seed=9)}


def _weights(g: Graph) -> dict[str, np.ndarray]:
    out = {}
    for node in g.ops():
        if node.qualified_op == OP:
            q, s, *rest = [v.const if v is not None else None for v in g.inputs_of(node)[1:]]
            assert q is not None and s is not None
            out[node.output_names[0]] = dequantize_levels(
                q, s, rest[0] if rest else None, node.attrs.block_size
            )
    return out


@pytest.mark.parametrize("bits,block,scale_dtype,symmetric", CONFIGS)
def test_mnn_matches_reference(
    tmp_path: Path, bits: int, block: int, scale_dtype: str, symmetric: bool
) -> None:
    g, feeds = _quantized(QuantizeWeights(bits, block, scale_dtype, symmetric))
    ref = run_graph(g, feeds)
    weights = _weights(g)
    ragged = next(n for n in g.ops() if n.output_names[0] == "y3")
    assert MNN_TABLE.reason(g, ragged) == (
        f"MNN's weight blocks must tile K: K=200 and block_size={block} share blocks of only 8 weights (< 16)"
    )
    run_passes(g, MNN.legalization("mnn", None))
    assert op_counts(g)[OP] == 3  # y3 in float
    path = tmp_path / "model.mnn"
    write_mnn(g, path, MnnOptions())
    got = run_mnn(path, feeds)
    for name, e in ref.items():
        assert_close(got[name], e, rtol=0.0, atol=TOL * max(1.0, float(np.abs(e).max())), what=name)
    # the file holds the op's levels and scales: Kiln's MNN reader decodes the op's weights
    reader = load_mnn(path)
    decoded = {}
    for node in reader.ops():
        w = reader.inputs_of(node)[1] if node.qualified_op in ("Conv", "kiln::FusedConv") else None
        if w is not None and w.const is not None:
            decoded[w.const.shape[:2]] = w.const.reshape(w.const.shape[0], -1)
    for name in ("y1", "y2", "y4"):
        want = weights[name]
        got_w = decoded[want.shape]
        if symmetric:
            np.testing.assert_array_equal(got_w, want, err_msg=name)
        else:
            eps = float(np.finfo(np.float32).eps)
            assert_close(got_w, want, rtol=0.0, atol=4 * eps * float(np.abs(want).max()), what=name)


@pytest.mark.parametrize("backend", ["cann", "tvm"])
def test_decomposition_matches_reference(backend: str) -> None:
    from compiler.backend import CapabilityTable, get_backend
    from compiler.pass_infra import PassContext

    g, feeds = _quantized(QuantizeWeights(bits=4, block_size=64, symmetric=False))
    ref = run_graph(g, feeds)
    table = get_backend(backend).capabilities(backend)
    without = CapabilityTable(backend, {op: s for op in table.ops() if op != OP and (s := table.get(op))})
    result = run_passes(g, ["decompose"], PassContext(capabilities=without))
    assert result.applied["weight-only-dequantize"] == 4
    assert OP not in op_counts(g)
    got = run_graph(g, feeds)
    for name, e in ref.items():
        assert_close(
            got[name], e, rtol=0.0, atol=DECOMPOSED_TOL * max(1.0, float(np.abs(e).max())), what=name
        )
    assert support_matrix([backend]).rows[OP][backend].status == "native"


def test_support_matrix_native_rows() -> None:
    rows = support_matrix(["onnx", "mnn"]).rows
    assert rows[OP]["onnx"].status == rows[OP]["mnn"].status == "native"
    assert rows["com.microsoft::MatMulNBits"]["onnx"].status == "native"
    assert rows["com.microsoft::MatMulNBits"]["mnn"].status == "decomposed"  # matmul-nbits-lift
