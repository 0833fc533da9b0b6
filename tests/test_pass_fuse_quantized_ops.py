"""fuse-quantized-ops on Gemm/MatMul (convs: test_pass_fuse_quantized_conv.py): kiln::QGemm's
structure, must-not-fire reasons, idempotence, the interpreter on the rewritten graph vs
onnxruntime on the QDQ model (±1 LSB at quantized tensors), the expansion back to QDQ, and the
backends' pipeline options (MNN: no depthwise, no float output, no Gemm; CANN: no MatMul)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from compiler.ir import print_graph, run_graph
from compiler.ops.qgemm import QGemmAttrs
from compiler.ops.registry import ShapeError
from compiler.pass_infra import PassContext
from compiler.pipelines import pipeline
from frontends.onnx.loader import load_onnx
from tests.helpers.numerics import assert_close
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, ort, ort_graph, run_passes

PASS = "fuse-quantized-ops"
LSB = 1  # quantized tensors: at most one step apart
FLOAT_RTOL = 1e-5  # float32 outputs: |a - e| <= FLOAT_RTOL * max(1, max|e|)
X_SCALE, Y_SCALE = 0.02, 0.1

GEMM = """g (float[{x_shape}] x) => (float[{y_shape}] y, uint8[{y_shape}] yq) {{
     xq = QuantizeLinear(x, xs, xz)
     xd = DequantizeLinear(xq, xs, xz)
     {weight}
     {product}
     yq = QuantizeLinear(p, ys, yz)
     y = DequantizeLinear(yq, ys, yz)
   }}"""
FLOAT_OUT = """g (float[4,16] x) => (float[4,8] y) {
     xq = QuantizeLinear(x, xs, xz)
     xd = DequantizeLinear(xq, xs, xz)
     wd = DequantizeLinear<axis=1>(wq, ws, wz)
     y = MatMul(xd, wd)
   }"""


def gemm_model(
    kind: str = "gemm", *, per_channel: bool = True, w_zero: int = 0, float_weight: bool = False
) -> onnx.ModelProto:
    """x -> q -> dq -> Gemm(transB=1, bias) / MatMul (3-D x) -> q -> dq -> y (and the uint8 yq)."""
    rng = np.random.default_rng(3)
    k, n = 16, 8
    gemm = kind == "gemm"
    w_shape = (n, k) if gemm else (k, n)
    wq = rng.integers(-127, 128, w_shape).astype(np.int8)
    ws = rng.uniform(0.005, 0.02, n if per_channel else ()).astype(np.float32)
    weight = (
        "wf = Identity(wc)" if float_weight else f"wd = DequantizeLinear<axis={0 if gemm else 1}>(wq, ws, wz)"
    )
    w_in = "wf" if float_weight else "wd"
    if gemm:
        product = f"bd = DequantizeLinear<axis=0>(bq, bs, bz)\n     p = Gemm<transB=1>(xd, {w_in}, bd)"
        x_shape, y_shape = "16,16", "16,8"
    else:
        product = f"p = MatMul(xd, {w_in})"
        x_shape, y_shape = "2,8,16", "2,8,8"
    text = GEMM.format(x_shape=x_shape, y_shape=y_shape, weight=weight, product=product)
    consts: dict[str, np.ndarray] = {
        "xs": np.array(X_SCALE, np.float32),
        "xz": np.array(120, np.uint8),
        "wq": wq,
        "ws": ws,
        "wz": np.full(ws.shape, w_zero, np.int8),
        "ys": np.array(Y_SCALE, np.float32),
        "yz": np.array(128, np.uint8),
    }
    if float_weight:
        consts = {k: v for k, v in consts.items() if k not in ("wq", "wz")}
        consts["wc"] = wq.astype(np.float32) * 0.01
    if gemm:
        bs = (np.float64(np.float32(X_SCALE)) * ws.astype(np.float64)).astype(np.float32)
        consts.update(
            bq=rng.integers(-2000, 2000, n).astype(np.int32), bs=bs, bz=np.zeros(bs.shape, np.int32)
        )
    return text_model(text, opset=21, ir_version=10, **consts)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": rand(*shape, seed=5, scale=1.5)}


@pytest.mark.parametrize("kind", ["gemm", "matmul"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_qdq_gemm_fuses_and_matches_ort(kind: str, per_channel: bool) -> None:
    m = gemm_model(kind, per_channel=per_channel)
    g = load_onnx(m)
    ctx = PassContext()
    assert run_passes(g, [PASS], ctx).applied == {"quantized-gemm": 1}
    counts = op_counts(g)
    assert counts["kiln::QGemm"] == 1 and counts["Gemm"] == counts["MatMul"] == 0
    assert counts["DequantizeLinear"] == 1 and counts["QuantizeLinear"] == 1  # x's Q and y's DQ stay
    (node,) = [n for n in g.ops() if n.op == "QGemm"]
    assert node.attrs.trans_b == (kind == "gemm") and len(node.attrs.w_scales) == (8 if per_channel else 1)
    assert len(g.inputs_of(node)) == (3 if kind == "gemm" else 2)
    feeds = _feeds(m)
    ref, got = ort(m, feeds), run_graph(g, feeds)
    assert len(np.unique(ref["yq"])) > 20  # the test spans the grid
    assert_close(got["yq"].astype(np.int32), ref["yq"].astype(np.int32), rtol=0.0, atol=LSB)
    assert_close(got["y"], ref["y"], rtol=0.0, atol=Y_SCALE * LSB * (1 + 1e-6))
    # the ONNX export expands QGemm back into QDQ: onnxruntime agrees with itself on the original
    exported = ort_graph(g, feeds)
    assert_close(exported["yq"].astype(np.int32), ref["yq"].astype(np.int32), rtol=0.0, atol=LSB)
    assert not run_passes(g, [PASS]).changed  # idempotent


def test_float_out_matmul_is_fused_and_exact() -> None:
    rng = np.random.default_rng(4)
    m = text_model(
        FLOAT_OUT,
        opset=21,
        ir_version=10,
        xs=np.array(X_SCALE, np.float32),
        xz=np.array(3, np.int8),
        wq=rng.integers(-127, 128, (16, 8)).astype(np.int8),
        ws=rng.uniform(0.005, 0.02, 8).astype(np.float32),
        wz=np.zeros(8, np.int8),
    )
    g = load_onnx(m)
    assert run_passes(g, [PASS]).applied == {"float-out-gemm": 1}
    assert print_graph(g, constants=False).count("kiln::QGemm") == 1
    feeds = {"x": rand(4, 16, seed=6)}
    ref, got = ort(m, feeds)["y"], run_graph(g, feeds)["y"]
    assert got.dtype == np.float32
    assert_close(got, ref, rtol=0.0, atol=FLOAT_RTOL * max(1.0, float(np.abs(ref).max())))
    assert not run_passes(g, [PASS]).changed


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"per_channel": False, "w_zero": 3}, "weight zero point is not 0"),
        ({"float_weight": True}, "weight is not produced by a DequantizeLinear"),
    ],
)
@pytest.mark.parametrize("kind", ["gemm", "matmul"])
def test_must_not_fire(kind: str, kw: dict[str, object], reason: str) -> None:
    g = load_onnx(gemm_model(kind, **kw))  # type: ignore[arg-type]
    ctx = PassContext()
    assert not run_passes(g, [PASS], ctx).changed
    assert {(m.rule, m.reason) for m in ctx.near_misses} == {
        ("quantized-gemm", reason),
        ("float-out-gemm", reason),
    }
    assert op_counts(g)["kiln::QGemm"] == 0


def test_gemm_option_off_keeps_qdq() -> None:
    g = load_onnx(gemm_model())
    assert not run_passes(g, [f"{PASS}{{gemm=0}}"]).changed
    assert op_counts(g)["Gemm"] == 1


def test_matmul_option_off_keeps_matmul_and_says_why() -> None:
    """matmul=0 (CANN: FullyConnection reads 2-D data) keeps MatMul in QDQ form, Gemm still fuses."""
    assert f"{PASS}{{matmul=0}}" in pipeline("legalize-cann")
    g = load_onnx(gemm_model("matmul"))
    ctx = PassContext()
    assert not run_passes(g, [f"{PASS}{{matmul=0}}"], ctx).changed
    why = "MatMul is not fused (matmul=0)"
    assert {(m.rule, m.reason) for m in ctx.near_misses} == {("quantized-gemm", why), ("float-out-gemm", why)}
    assert op_counts(g)["MatMul"] == 1
    g = load_onnx(gemm_model("gemm"))
    assert run_passes(g, [f"{PASS}{{matmul=0}}"]).applied == {"quantized-gemm": 1}


def test_mnn_pipeline_asks_for_no_depthwise_no_float_out() -> None:
    """legalize-mnn fuses quantized-output, non-depthwise convs only (MNN's int8 conv form)."""
    first = pipeline("legalize-mnn")[0]
    assert first == "fuse-quantized-ops{depthwise=0,float_out=0,gemm=0}"
    from tests.test_pass_fuse_quantized_conv import qdq_model

    g = load_onnx(qdq_model(group=4))  # depthwise
    ctx = PassContext()
    assert not run_passes(g, [first], ctx).changed
    assert ("quantized-conv", "depthwise convs are not fused (depthwise=0)") in {
        (m.rule, m.reason) for m in ctx.near_misses
    }
    g = load_onnx(qdq_model())
    assert run_passes(g, [first]).applied == {"quantized-conv": 1}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"w_scales": (1.0, 2.0)}, "w_scales has 2 entries for 8 output columns"),
        ({"out_dtype": "int16"}, "out_dtype must be one of"),
    ],
)
def test_qgemm_inference_rejects_bad_attrs(change: dict[str, object], message: str) -> None:
    from compiler.ir import DType, Graph, TensorType

    g = Graph("q")
    x = g.add_input("x", TensorType(DType.UINT8, (4, 16)))
    w = g.add_constant(np.zeros((16, 8), np.int8), "w")
    with pytest.raises(ShapeError, match=message):
        g.add_node("QGemm", [x, w], QGemmAttrs(**change), domain="kiln")  # type: ignore[arg-type]
