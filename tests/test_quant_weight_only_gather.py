"""Weight-only embeddings: ``kiln::WeightOnlyGather``, its GatherBlockQuantized export, the pass, the
decompositions and MNN.

* Export: onnxruntime running the exported ``com.microsoft::GatherBlockQuantized`` equals the op's
  numpy reference exactly (measured: bit-identical), for bits 4 and 8, blocks 32/64/128, fp16 and
  fp32 scales, symmetric and asymmetric, D a multiple of the block or not, int32 and int64 indices
  with negative ones; the interpreter on the expansion (GatherBlockQuantized's reference, unpacking)
  equals it exactly; the ONNX frontend lifts it back to the same levels, scales and zero points.
* Pass: a constant float32 table of >= GATHER_MIN_WEIGHTS weights gathered on axis 0 fires; every
  must-not-fire case carries its reason; idempotent.
* Decompositions: ``weight-only-gather-levels`` (int8 levels kept, whole blocks) and
  ``weight-only-gather-dequantize`` (any D) equal the reference exactly; MNN runs the first one
  (int8 Gather + Cast) and equals the reference exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from backends.mnn.backend import BACKEND as MNN
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.ir.types import DType, TensorType
from compiler.onnx_export import export_onnx
from compiler.ops.fused import KILN
from compiler.ops.registry import get_op
from compiler.ops.weight_only import block_count, level_range
from compiler.ops.weight_only_gather import WeightOnlyGatherAttrs
from compiler.pass_infra import PassContext
from compiler.support_matrix import support_matrix
from frontends.onnx.loader import load_onnx
from passes.quantize_weights import GATHER_MIN_WEIGHTS, QuantizeWeights
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, ort, run_passes

OP = "kiln::WeightOnlyGather"
CONFIGS = [
    (b, bs, sd, sym)
    for b in (4, 8)
    for bs in (32, 64, 128)
    for sd in ("fp16", "fp32")
    for sym in (True, False)
]


def _gather_graph(
    v: int, d: int, bits: int, block: int, scale_dtype: str, symmetric: bool, index: DType, seed: int
) -> Graph:
    """y = kiln::WeightOnlyGather(random full-range levels [V, D], idx [2, 7], scales, zero points)."""
    rng = np.random.default_rng(seed)
    lo, hi = level_range(bits)
    nb = block_count(d, block)
    g = Graph("wg")
    idx = g.add_input("idx", TensorType(index, (2, 7)))
    ins = [
        g.add_constant(rng.integers(lo, hi + 1, (v, d)).astype(np.int8), "levels"),
        idx,
        g.add_constant(
            rng.uniform(0.001, 0.05, (v, nb)).astype(np.float16 if scale_dtype == "fp16" else np.float32), "s"
        ),
    ]
    if not symmetric:
        ins.append(g.add_constant(rng.integers(lo, hi + 1, (v, nb)).astype(np.int8), "z"))
    node = g.add_node(
        "WeightOnlyGather",
        ins,
        WeightOnlyGatherAttrs(bits, block),
        domain=KILN,
        name="wg",
        output_names=["y"],
    )
    g.set_outputs([g.value(node)])
    return g


def _idx(v: int, index: DType, seed: int, low: int | None = None) -> dict[str, np.ndarray]:
    lo = -v if low is None else low
    return {"idx": np.random.default_rng(seed).integers(lo, v, (2, 7)).astype(index.numpy)}


@pytest.mark.parametrize("bits,block,scale_dtype,symmetric", CONFIGS)
@pytest.mark.parametrize("d", [256, 200])
def test_gather_block_quantized_export_matches_reference(
    bits: int, block: int, scale_dtype: str, symmetric: bool, d: int
) -> None:
    index = DType.INT64 if d == 256 else DType.INT32
    g = _gather_graph(60, d, bits, block, scale_dtype, symmetric, index, seed=bits + block + d)
    feeds = _idx(60, index, seed=d)
    ref = run_graph(g, feeds)["y"]
    model = export_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == ("GatherBlockQuantized", "com.microsoft")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    defaults = {"gather_axis": 0, "quantize_axis": 1, "block_size": 128, "bits": 4}  # onnxruntime's
    assert defaults | attrs == {"gather_axis": 0, "quantize_axis": 1, "block_size": block, "bits": bits}
    data = next(i for i in model.graph.initializer if i.name == node.input[0])
    assert (data.data_type, list(data.dims)) == (onnx.TensorProto.UINT8, [60, d * bits // 8])
    np.testing.assert_array_equal(ort(model, feeds)["y"], ref)  # measured: bit-identical
    expanded = g.clone()
    (wg,) = expanded.ops()
    expand = get_op("WeightOnlyGather", KILN).expand
    assert expand is not None
    (new,) = expand(expanded, wg)
    expanded.replace_all_uses(expanded.value(wg), new)
    np.testing.assert_array_equal(run_graph(expanded, feeds)["y"], ref)


@pytest.mark.parametrize("bits,symmetric", [(4, True), (4, False), (8, False)])
def test_gather_block_quantized_imports_back(bits: int, symmetric: bool) -> None:
    g = _gather_graph(40, 96, bits, 32, "fp32", symmetric, DType.INT64, seed=bits)
    back = load_onnx(export_onnx(g))
    (node,) = back.ops()
    assert (node.qualified_op, node.attrs) == (OP, WeightOnlyGatherAttrs(bits, 32))
    (orig,) = g.ops()
    for port in (0, 2, 3):
        want = g.inputs_of(orig)[port] if port < len(g.inputs_of(orig)) else None
        got = back.inputs_of(node)[port] if port < len(back.inputs_of(node)) else None
        assert (want is None) == (got is None), port
        if want is not None and got is not None:
            assert want.const is not None and got.const is not None
            np.testing.assert_array_equal(got.const, want.const, err_msg=f"input {port}")
    feeds = _idx(40, DType.INT64, 3)
    np.testing.assert_array_equal(run_graph(back, feeds)["y"], run_graph(g, feeds)["y"])


# ------------------------------------------------------------------------------- the pass
TABLES = {
    "E": rand(500, 64, seed=1),  # fires
    "Esmall": rand(4, 64, seed=2),  # below GATHER_MIN_WEIGHTS
    "Eodd": rand(500, 63, seed=3),  # D odd: 4-bit tables pack two levels per byte
    "Enarrow": rand(2000, 16, seed=4),  # D = 16 < one block
}
BODY = """
    e1 = Gather(E, ids)
    e2 = Gather(Esmall, ids)
    e3 = Gather(Eodd, ids)
    e4 = Gather(Enarrow, ids)
    e5 = Gather<axis=1>(E, ids)
    e6 = Gather(t, ids)
"""
REFUSED = {
    "e2": f"the table has 256 weights (< {GATHER_MIN_WEIGHTS}",
    "e3": "D=63 is odd",
    "e4": "K=16 is less than one block (32)",
    "e5": "axis=1: only row lookups (axis 0) are quantized",
    "e6": "the table is not a constant",
}


def _embedding_model() -> onnx.ModelProto:
    return text_model(
        "g (int64[3,5] ids, float[4,64] t) => (float[3,5,64] e1, float[3,5,64] e2, float[3,5,63] e3, "
        f"float[3,5,16] e4, float[500,3,5] e5, float[3,5,64] e6) {{{BODY}}}",
        17,
        8,
        **TABLES,
    )


def test_pass_quantizes_embedding_tables() -> None:
    g = load_onnx(_embedding_model())
    ctx = PassContext()
    assert run_passes(g, [QuantizeWeights()], ctx).changed
    assert op_counts(g)[OP] == 1
    assert g.find_value("e1").producer.qualified_op == OP
    reasons = {m.node: m.reason for m in ctx.near_misses}
    assert set(reasons) == set(REFUSED)
    for node, reason in REFUSED.items():
        assert reasons[node].startswith(reason), (node, reasons[node])
    (layer,) = ctx.state["quantize-weights"]["layers"]
    assert (layer["op"], layer["shape"], layer["bits"], layer["rounding"]) == (
        "Gather",
        [500, 64],
        4,
        "nearest",
    )
    assert layer["quantized_bytes"] == 500 * 64 // 2 + 500 * 2 * 2  # levels + fp16 scales
    feeds = {"ids": np.random.default_rng(0).integers(-4, 4, (3, 5)), "t": rand(4, 64, seed=9)}
    got = run_graph(g, feeds)["e1"]
    assert 0 < np.abs(got - TABLES["E"][feeds["ids"]]).max() <= np.abs(TABLES["E"]).max() / 7 / 2 * 1.01
    assert not run_passes(g, [QuantizeWeights()], PassContext()).changed  # idempotent
    g2 = load_onnx(_embedding_model())
    run_passes(g2, [QuantizeWeights(gathers=False)], PassContext())
    assert OP not in op_counts(g2)


# ------------------------------------------------------------------------ decompositions, MNN
@pytest.mark.parametrize(
    "d,block,symmetric,rule",
    [
        (256, 32, True, "weight-only-gather-levels"),
        (256, 64, False, "weight-only-gather-levels"),
        (200, 64, False, "weight-only-gather-dequantize"),  # D not a whole number of blocks
    ],
)
def test_decompositions_are_exact(d: int, block: int, symmetric: bool, rule: str) -> None:
    g = _gather_graph(50, d, 4, block, "fp16", symmetric, DType.INT64, seed=d + block)
    feeds = _idx(50, DType.INT64, 5)
    ref = run_graph(g, feeds)["y"]
    result = run_passes(g, ["decompose{backend=tvm}"])
    assert result.applied[rule] == 1
    assert OP not in op_counts(g)
    np.testing.assert_array_equal(run_graph(g, feeds)["y"], ref)


@pytest.mark.parametrize("symmetric", [True, False])
def test_mnn_runs_the_levels_decomposition(tmp_path: Path, symmetric: bool) -> None:
    g = _gather_graph(300, 128, 4, 32, "fp16", symmetric, DType.INT64, seed=7)
    # non-negative: MNN 3.6.1's GatherV2 returns zeros for a negative run-time index (a float Gather
    # too; Kiln's MNN lowering wraps constant indices only)
    feeds = _idx(300, DType.INT64, 8, low=0)
    ref = run_graph(g, feeds)["y"]
    run_passes(g, MNN.legalization("mnn", None))
    counts = op_counts(g)
    assert OP not in counts and counts["Cast"] == 1
    (table,) = [n for n in g.nodes() if n.op == "Constant" and n.attrs.value.shape == (300, 128)]
    assert table.attrs.value.dtype == np.int8  # the levels, not a float table
    path = tmp_path / "model.mnn"
    write_mnn(g, path, MnnOptions())
    assert path.stat().st_size < 300 * 128 * 2  # int8 levels (a float32 table alone is 153600 bytes)
    np.testing.assert_array_equal(run_mnn(path, feeds)["y"], ref)


def test_support_matrix_rows() -> None:
    rows = support_matrix(["onnx", "mnn", "tvm", "cann"]).rows
    assert rows[OP]["onnx"].status == "native"
    for backend in ("mnn", "tvm", "cann"):
        cell = rows[OP][backend]
        assert (cell.status, cell.detail) == ("decomposed", "weight-only-gather-levels"), backend
    assert rows["com.microsoft::GatherBlockQuantized"]["onnx"].status == "native"
