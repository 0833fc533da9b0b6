"""Models onnxruntime already quantized: MatMulNBits / GatherBlockQuantized -> Kiln's weight-only ops.

* A Gather + MatMul model whose MatMul onnxruntime's own ``MatMulNBitsQuantizer`` quantized (4 bits
  asymmetric, 8 bits symmetric; it quantizes a Gather only as UINT4 data, which the Kiln IR has no
  type for) and a hand-built GatherBlockQuantized -> MatMulNBits (uint8 data, zero points, a bias, a
  short last block; 4 and 8 bits), compiled ``--target cpu --emit mnn,cann``: the TVM library (one
  fused ``weight-only-matmul`` kernel) equals onnxruntime on the same file within 1e-5 (max rel;
  measured 0: the dequantized weights are exact), MNN's runtime cosine >= 0.9999 (measured 1.000000),
  and the manifest's verification (the CANN file read back and run included) passes.
* The ``lift-weight-only`` pass on IR-built MatMulNBits / GatherBlockQuantized nodes: the exact inverse
  of the Kiln ops' ``expand`` (the interpreter's results equal bit for bit).
* Must not fire: B not a constant (left alone, named in a near miss, refused by TVM's preflight naming
  the node); g_idx present (the import refuses it, naming the node).
* ``kiln ops``: both ops decompose for tvm, mnn and cann.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.cli import main
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.ir.types import DType, TensorType
from compiler.ops.matmul_nbits import ORT_DOMAIN, pack_levels, pack_zero_points
from compiler.ops.weight_only_gather import pack_table
from compiler.pass_infra import PassContext
from compiler.runners import run_artifact, run_onnxruntime
from compiler.support_matrix import support_matrix
from frontends.onnx.loader import load_onnx
from tests.helpers.numerics import assert_close
from tests.helpers.pass_check import run_passes

TOL = 1e-5
COSINE = 0.9999
K, N, V = 96, 40, 50  # K = 96: 1.5 blocks of 64, 3 of 32


def _source_model() -> onnx.ModelProto:
    """y = Gather(E, ids) @ W + b with float weights (E [V, K], W [K, N])."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 1, (V, K)).astype(np.float32), "E"),
        numpy_helper.from_array(rng.normal(0, 0.2, (K, N)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.normal(0, 0.1, (N,)).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["emb"], name="embed"),
        helper.make_node("MatMul", ["emb", "W"], ["mm"], name="proj"),
        helper.make_node("Add", ["mm", "b"], ["y"], name="bias"),
    ]
    g = helper.make_graph(
        nodes,
        "lift",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, N])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _ids() -> dict[str, np.ndarray]:
    return {"ids": np.random.default_rng(1).integers(0, V, (2, 7)).astype(np.int64)}


def _ort_quantized(bits: int, symmetric: bool) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # MatMul only: onnxruntime quantizes a Gather only to 4 bits and as UINT4 data (not a Kiln IR type)
    q = MatMulNBitsQuantizer(
        _source_model(), bits=bits, block_size=32, is_symmetric=symmetric, op_types_to_quantize=("MatMul",)
    )
    q.process()
    return q.model.model


def _hand_built(bits: int) -> onnx.ModelProto:
    """y = MatMulNBits(GatherBlockQuantized(data, ids, ...), B, ...) with random levels, zero points
    and a bias; blocks of 64 (K = 96: a short last block) in the matrix product, of 32 in the table."""
    rng = np.random.default_rng(bits)
    bs, nb = 64, -(-K // 64)
    u = rng.integers(0, 1 << bits, (N, K))
    z = rng.integers(0, 1 << bits, (N, nb))
    inits = [
        numpy_helper.from_array(pack_table(rng.integers(0, 1 << bits, (V, K)), bits), "data"),
        numpy_helper.from_array(rng.uniform(0.01, 0.1, (V, K // 32)).astype(np.float32), "table_scales"),
        numpy_helper.from_array(pack_table(rng.integers(0, 1 << bits, (V, K // 32)), bits), "table_zp"),
        numpy_helper.from_array(pack_levels(u, bits, bs, z), "B"),
        numpy_helper.from_array(rng.uniform(0.01, 0.1, N * nb).astype(np.float32), "scales"),
        numpy_helper.from_array(pack_zero_points(z, bits), "zero_points"),
        numpy_helper.from_array(rng.normal(0, 0.1, N).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node(
            "GatherBlockQuantized",
            ["data", "ids", "table_scales", "table_zp"],
            ["emb"],
            name="table",
            domain=ORT_DOMAIN,
            bits=bits,
            block_size=32,
        ),
        helper.make_node(
            "MatMulNBits",
            ["emb", "B", "scales", "zero_points", "", "bias"],
            ["y"],
            name="nbits",
            domain=ORT_DOMAIN,
            K=K,
            N=N,
            bits=bits,
            block_size=bs,
        ),
    ]
    g = helper.make_graph(
        nodes,
        "hand",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, N])],
        inits,
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ORT_DOMAIN, 1)]
    )


def _compile_and_compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    src, inputs, out = tmp_path / "model.onnx", tmp_path / "inputs.npz", tmp_path / "out"
    onnx.save(model, src)
    np.savez(inputs, allow_pickle=False, **feeds)
    args = [
        "compile",
        str(src),
        "-o",
        str(out),
        "--inputs",
        str(inputs),
        "--target",
        "cpu",
        "--emit",
        "mnn,cann",
    ]
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verification"]["passed"]  # model.om (CANN) included, read back and run
    (lib,) = [a for a in manifest["artifacts"] if a["path"] == "cpu/model.so"]
    assert [k["rule"] for k in lib["details"]["kernels"]] == ["weight-only-matmul"]  # dequantize fused
    want = run_onnxruntime(src, feeds)
    got = run_artifact(out / "cpu" / "model.so", feeds)
    mnn = run_artifact(out / "model.mnn", feeds)
    for k, e in want.items():
        assert_close(got[k], e, rtol=0.0, atol=TOL * max(1.0, float(np.abs(e).max())), what=k)
        a, b = mnn[k].ravel().astype(np.float64), e.ravel().astype(np.float64)
        assert float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) >= COSINE, k


@pytest.mark.parametrize("bits,symmetric", [(4, False), (8, True)])
def test_onnxruntime_quantized_model_compiles(bits: int, symmetric: bool, tmp_path: Path) -> None:
    model = _ort_quantized(bits, symmetric)
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Gather", "MatMulNBits", "Add"], ops
    _compile_and_compare(model, _ids(), tmp_path)


@pytest.mark.parametrize("bits", [4, 8])
def test_hand_built_with_zero_points_compiles(bits: int, tmp_path: Path) -> None:
    _compile_and_compare(_hand_built(bits), _ids(), tmp_path)


def _ir_nbits(bits: int, const_b: bool = True) -> Graph:
    """An IR graph holding MatMulNBits (zero points, bias) and GatherBlockQuantized (zero points)."""
    rng = np.random.default_rng(10 + bits)
    bs, nb = 32, K // 32
    g = Graph("ir")
    x = g.add_input("x", TensorType(DType.FLOAT32, (4, K)))
    ids = g.add_input("ids", TensorType(DType.INT64, (6,)))
    u = rng.integers(0, 1 << bits, (N, K))
    z = rng.integers(0, 1 << bits, (N, nb))
    packed = pack_levels(u, bits, bs, z)
    b = g.add_constant(packed, "B") if const_b else g.add_input("B", TensorType(DType.UINT8, packed.shape))
    ins = [
        x,
        b,
        g.add_constant(rng.uniform(0.01, 0.1, N * nb).astype(np.float32), "s"),
        g.add_constant(pack_zero_points(z, bits), "zp"),
        None,
        g.add_constant(rng.normal(0, 1, N).astype(np.float32), "bias"),
    ]
    y = g.add_node(
        "MatMulNBits", ins, {"K": K, "N": N, "bits": bits, "block_size": bs}, domain=ORT_DOMAIN, name="mm"
    )
    gbq = [
        g.add_constant(pack_table(rng.integers(0, 1 << bits, (V, K)), bits), "data"),
        ids,
        g.add_constant(rng.uniform(0.01, 0.1, (V, nb)).astype(np.float32), "gs"),
        g.add_constant(pack_table(rng.integers(0, 1 << bits, (V, nb)), bits), "gz"),
    ]
    e = g.add_node(
        "GatherBlockQuantized", gbq, {"bits": bits, "block_size": bs}, domain=ORT_DOMAIN, name="emb"
    )
    g.set_outputs([g.value(y), g.value(e)])
    return g


def _feeds(g: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    feeds: dict[str, np.ndarray] = {
        "x": rng.normal(0, 1, (4, K)).astype(np.float32),
        "ids": rng.integers(-V, V, 6).astype(np.int64),
    }
    if any(v.name == "B" for v in g.inputs):
        (node,) = [n for n in g.ops() if n.op == "MatMulNBits"]
        b = g.inputs_of(node)[1]
        assert b is not None and b.type.shape is not None
        feeds["B"] = rng.integers(0, 256, b.type.static_shape).astype(np.uint8)
    return feeds


@pytest.mark.parametrize("bits", [4, 8])
def test_lift_pass_is_the_exact_inverse(bits: int) -> None:
    g = _ir_nbits(bits)
    feeds = _feeds(g)
    want = run_graph(g, feeds)
    result = run_passes(g, ["lift-weight-only"])
    assert result.applied["matmul-nbits-lift"] == 1 and result.applied["gather-block-quantized-lift"] == 1
    assert sorted(n.qualified_op for n in g.ops()) == ["kiln::WeightOnlyGather", "kiln::WeightOnlyMatMul"]
    got = run_graph(g, feeds)
    for k, e in want.items():
        np.testing.assert_array_equal(got[k], e, err_msg=k)


def test_non_constant_b_is_left_alone_and_refused() -> None:
    from compiler.backend import Request, get_backend
    from compiler.preflight import CapabilityError, preflight

    g = _ir_nbits(4, const_b=False)
    ctx = PassContext()
    result = run_passes(g, ["lift-weight-only"], ctx)
    assert "matmul-nbits-lift" not in result.applied
    assert [n.op for n in g.ops()].count("MatMulNBits") == 1
    (miss,) = [m for m in ctx.near_misses if m.rule == "matmul-nbits-lift"]
    assert miss.node == "mm" and "B (input 1) is not a constant" in miss.reason
    with pytest.raises(CapabilityError, match=r"mm.*B \(input 1\) is not a constant"):
        preflight(g, [Request(get_backend("tvm"), "cpu")], None, "ir")


def test_g_idx_is_refused_naming_the_node(tmp_path: Path) -> None:
    model = _hand_built(4)
    node = model.graph.node[1]
    node.input[4] = "g_idx"
    model.graph.initializer.append(numpy_helper.from_array(np.arange(K, dtype=np.int32) // 64, "g_idx"))
    src = tmp_path / "g_idx.onnx"
    onnx.save(model, src)
    with pytest.raises(Exception, match=r"nbits.*g_idx"):
        load_onnx(src)


def test_support_matrix_decomposes_for_every_weight_only_backend() -> None:
    rows = support_matrix(["tvm", "mnn", "cann"]).rows
    for op, rule in (
        ("com.microsoft::MatMulNBits", "matmul-nbits-lift"),
        ("com.microsoft::GatherBlockQuantized", "gather-block-quantized-lift"),
    ):
        for b in ("tvm", "mnn", "cann"):
            cell = rows[op][b]
            assert cell.status == "decomposed" and cell.detail.startswith(rule), (op, b, cell)
