"""kiln::QConv and fuse-quantized-ops on convs (Gemm/MatMul: test_pass_fuse_quantized_ops.py): op
reference vs onnxruntime, structure on real int8 models,
must-not-fire reasons, idempotence, and the interpreter on the rewritten graph vs onnxruntime on
Kiln's QDQ export."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from compiler.ir import DType, Graph, TensorType, print_graph, run_graph, verify
from compiler.onnx_export import export_onnx
from compiler.ops.blocked_layout import block_of
from compiler.ops.qconv import QConvAttrs
from compiler.ops.registry import ShapeError, get_op
from compiler.pass_infra import PassContext, all_passes
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from compiler.quant.options import QuantOptions
from compiler.quant.quantize import quantize_int8
from frontends.onnx.loader import load_onnx
from frontends.registry import load_model
from tests.helpers.numerics import agreement, assert_close
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, ort, ort_graph, run_passes

PASS = "fuse-quantized-ops"
CONVS_ONLY = "fuse-quantized-ops{gemm=0}"
LSB = 1  # quantized tensors: at most one step apart
FLOAT_RTOL = 1e-5  # float32 outputs: |a - e| <= FLOAT_RTOL * max(1, max|e|)
MIN_COSINE = 0.999


# ------------------------------------------------------------------ (a) the op against onnxruntime
@dataclass(frozen=True)
class Case:
    """One QConv configuration."""

    x_dtype: str = "uint8"
    x_zero: int = 0
    per_channel: bool = True
    activation: str = "none"
    residual: bool = False
    depthwise: bool = False
    bias: bool = True
    out_dtype: str = "uint8"
    strides: tuple[int, int] = (1, 1)


CASES = {
    "per-tensor": Case(per_channel=False),
    "per-channel-zero-point": Case(x_zero=37),
    "relu": Case(x_zero=128, activation="relu"),
    "hard-swish-int8": Case(x_dtype="int8", x_zero=-5, activation="hard_swish", out_dtype="int8"),
    "residual": Case(x_zero=20, residual=True, activation="relu"),
    "depthwise-stride2": Case(x_zero=90, depthwise=True, strides=(2, 2), activation="relu6"),
    "no-bias-leaky": Case(bias=False, activation="leaky_relu", out_dtype="int8"),
    "float-out": Case(x_zero=11, activation="hard_sigmoid", out_dtype="float32"),
    "float-out-residual": Case(residual=True, out_dtype="float32", depthwise=True),
}
ALPHA_BETA = {"leaky_relu": (0.1, 0.0), "hard_sigmoid": (0.2, 0.5)}


def qconv_graph(case: Case, seed: int) -> tuple[Graph, dict[str, np.ndarray]]:
    """x (and r) -> kiln::QConv -> y, with random integer data and scales that fill the output grid."""
    rng = np.random.default_rng(seed)
    c, oc, hw = (8, 8, 10) if case.depthwise else (6, 8, 9)
    group = c if case.depthwise else 1
    xdt = np.dtype(case.x_dtype)
    info = np.iinfo(xdt)
    x = rng.integers(info.min, info.max + 1, (1, c, hw, hw)).astype(xdt)
    w = rng.integers(-127, 128, (oc, c // group, 3, 3)).astype(np.int8)
    x_scale = float(np.float32(0.02))
    w_scales = rng.uniform(0.002, 0.01, oc if case.per_channel else 1).astype(np.float32)
    alpha, beta = ALPHA_BETA.get(case.activation, (0.0, 0.0))
    base = QConvAttrs(
        pads=(1, 1, 1, 1),
        strides=case.strides,
        group=group,
        activation=case.activation,
        alpha=alpha,
        beta=beta,
        x_scale=x_scale,
        x_zero=case.x_zero,
        w_scales=tuple(float(s) for s in w_scales),
        out_dtype="float32",
        r_scale=float(np.float32(0.05)),
        r_zero=7,
    )
    g = Graph("qconv")
    xv = g.add_input("x", TensorType(DType.from_numpy(xdt), x.shape))
    wv = g.add_constant(w, "w")
    b = rng.integers(-3000, 3000, oc).astype(np.int32) if case.bias else None
    bv = g.add_constant(b, "b") if b is not None else None
    feeds = {"x": x}
    ins = [xv, wv, bv]
    out_hw = (hw + 2 - 3) // case.strides[0] + 1
    if case.residual:
        feeds["r"] = rng.integers(0, 256, (1, oc, out_hw, out_hw)).astype(np.uint8)
        ins.append(g.add_input("r", TensorType(DType.UINT8, feeds["r"].shape)))
    ref = get_op("QConv", "kiln").reference([feeds["x"], w, b, feeds.get("r")], base, 1)
    lo, hi = min(float(ref[0].min()), 0.0), max(float(ref[0].max()), 0.0)
    if case.out_dtype == "uint8":
        y_scale, y_zero = (hi - lo) / 255, int(round(-lo / ((hi - lo) / 255)))
    else:
        y_scale, y_zero = max(hi, -lo) / 127, 3  # a nonzero int8 zero point clips a little at the ends
    attrs = QConvAttrs(
        **{
            **base.__dict__,
            "out_dtype": case.out_dtype,
            "y_scale": float(np.float32(y_scale)),
            "y_zero": y_zero,
        }
    )
    while ins[-1] is None:
        ins.pop()
    node = g.add_node("QConv", ins, attrs, domain="kiln", name="qconv", output_names=["y"])
    g.set_outputs([g.value(node)])
    verify(g)
    return g, feeds


@pytest.mark.parametrize("name", sorted(CASES))
def test_qconv_reference_matches_ort_on_expansion(name: str) -> None:
    case = CASES[name]
    for seed in (1, 2):
        g, feeds = qconv_graph(case, seed)
        got = run_graph(g, feeds)["y"]
        exp = ort_graph(g, feeds)["y"]
        assert got.dtype == exp.dtype == np.dtype(case.out_dtype)
        if case.out_dtype == "float32":
            assert_close(
                got, exp, rtol=FLOAT_RTOL, atol=FLOAT_RTOL * max(1.0, float(np.abs(exp).max())), what=name
            )
        else:
            assert_close(got, exp, rtol=0.0, atol=LSB, what=name)
            assert np.unique(exp).size >= 50  # the data spans the output grid


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"out_dtype": "int16"}, "out_dtype must be one of"),
        ({"w_scales": (0.1, 0.2)}, "w_scales has 2 entries for 8 output channels"),
    ],
)
def test_qconv_inference_rejects_bad_attrs(change: dict[str, object], message: str) -> None:
    g, _ = qconv_graph(CASES["per-tensor"], 1)
    node = next(n for n in g.ops() if n.op == "QConv")
    attrs = QConvAttrs(**{**node.attrs.__dict__, **change})
    with pytest.raises(ShapeError, match=message):
        g.add_node("QConv", g.inputs_of(node), attrs, domain="kiln")


# --------------------------------------------------------------- (b) structure on real int8 models
SHARED = Path(__file__).resolve().parents[2] / "shared" / "models"
MODELS = {
    # stem: (input shapes, QConv with uint8 output, QConv with float32 output)
    "ppocr_mobile_v2_cls": ({"x": (1, 3, 48, 192)}, 52, 1),
    "yunet_n_320": (None, 43, 16),
}


@dataclass
class Quantized:
    """A real model after the default pipeline and Kiln's int8 step, and its QDQ ONNX export."""

    stem: str
    qdq_graph: Graph
    qdq_onnx: onnx.ModelProto
    feeds: dict[str, np.ndarray]


@pytest.fixture(scope="module", params=sorted(MODELS))
def quantized(request: pytest.FixtureRequest) -> Quantized:
    stem = request.param
    assert SHARED.is_dir(), f"missing {SHARED}"
    g = load_model(SHARED / f"{stem}.onnx", input_shapes=MODELS[stem][0])
    PassManager(pipeline("default")).run(g)
    q = QuantOptions(calib=SHARED / "data" / f"{stem}.calib.npz", calib_count=4, sensitivity=False)
    quantize_int8(g, q, progress=False)
    with np.load(SHARED / "data" / f"{stem}.holdout.npz") as z:
        feeds = {k: np.asarray(z[k][0], np.float32) for k in z.files}
    return Quantized(stem, g, export_onnx(g), feeds)


def test_pass_is_registered_but_not_in_default_pipeline() -> None:
    assert PASS in all_passes()
    assert PASS not in str(pipeline("default"))


def test_every_conv_becomes_qconv(quantized: Quantized) -> None:
    g = quantized.qdq_graph.clone()
    ctx = PassContext()
    result = run_passes(g, [CONVS_ONLY], ctx)
    stem = quantized.stem
    _, n_int, n_float = MODELS[stem]
    counts = op_counts(g)
    assert counts["Conv"] == 0 and counts["kiln::FusedConv"] == 0
    assert Counter(n.attrs.out_dtype for n in g.ops() if n.op == "QConv") == {
        "uint8": n_int,
        "float32": n_float,
    }
    assert result.applied == {"quantized-conv": n_int, "float-out-conv": n_float}
    # the weight and bias DequantizeLinear nodes went with their convs; the Gemm's stay
    assert _const_dqs(g) == _const_dqs(quantized.qdq_graph, skip=("Conv", "FusedConv"))
    if stem == "yunet_n_320":  # 2 relu convs feed both a float MaxPool and the next conv's Q
        miss = Counter((m.rule, m.reason) for m in ctx.near_misses)
        assert miss == {("quantized-conv", "output has users besides the QuantizeLinear"): 2}
    assert not run_passes(g, [CONVS_ONLY]).changed  # idempotent


def _const_dqs(g: Graph, skip: tuple[str, ...] = ()) -> int:
    """DequantizeLinear nodes of constants, except those read by ``skip`` ops."""
    count = 0
    for n in g.ops():
        src = g.inputs_of(n)[0] if n.op == "DequantizeLinear" else None
        if src is not None and src.const is not None:
            count += not any(u.op in skip for u, _ in g.users(g.value(n)))
    return count


QDQ_TEXT = """g (float[1,4,6,6] x) => (float[1,4,6,6] y) {{
     xq = QuantizeLinear(x, xs, xz)
     xd = DequantizeLinear(xq, xs, xz)
     wd = DequantizeLinear<axis=0>(wq, ws, wz)
     c = Conv<pads=[1,1,1,1],group={group}>({x_in}, wd)
     yq = QuantizeLinear(c, ys, yz)
     y = DequantizeLinear(yq, ys, yz)
   }}"""


def qdq_model(*, group: int = 1, x_in: str = "xd", w_zero: int = 0) -> onnx.ModelProto:
    """A hand-written QDQ conv: x -> q -> dq -> Conv(., dq(W)) -> q -> dq -> y."""
    return text_model(
        QDQ_TEXT.format(group=group, x_in=x_in),
        opset=21,
        ir_version=10,
        xs=np.array(0.02, np.float32),
        xz=np.array(128, np.uint8),
        wq=np.random.default_rng(3).integers(-127, 128, (4, 4 // group, 3, 3)).astype(np.int8),
        ws=np.full(4, 0.01, np.float32),
        wz=np.full(4, w_zero, np.int8),
        ys=np.array(0.05, np.float32),
        yz=np.array(100, np.uint8),
    )


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"x_in": "x"}, "input x is not produced by a DequantizeLinear"),
        ({"w_zero": 2}, "weight zero point is not 0"),
        ({"group": 2}, "group 2 is neither 1 nor depthwise"),
    ],
)
def test_must_not_fire(kw: dict[str, object], reason: str) -> None:
    g = load_onnx(qdq_model(**kw))  # type: ignore[arg-type]
    ctx = PassContext()
    assert not run_passes(g, [PASS], ctx).changed
    assert {(m.rule, m.reason) for m in ctx.near_misses} == {
        ("quantized-conv", reason),
        ("float-out-conv", reason),
    }
    assert op_counts(g)["Conv"] == 1


def test_hand_written_qdq_conv_fuses_and_matches_ort() -> None:
    m = qdq_model(group=4)  # depthwise
    g = load_onnx(m)
    assert run_passes(g, [PASS]).applied == {"quantized-conv": 1}
    assert print_graph(g, constants=False) == (
        "graph g(\n  %x: f32[1,4,6,6],\n) {\n"
        "  %xq = QuantizeLinear(%x, %xs, %xz) : u8[1,4,6,6]\n"
        "  %yq = kiln::QConv(%xq, %wq) {group=4, pads=[1,1,1,1], x_scale=0.02, x_zero=128, "
        "w_scales=[0.01,0.01,0.01,0.01], y_scale=0.05, y_zero=100, out_dtype='uint8'} : u8[1,4,6,6]\n"
        "  %y = DequantizeLinear(%yq, %ys, %yz) : f32[1,4,6,6]\n"
        "  return %y\n}\n"
    )
    feeds = {"x": rand(1, 4, 6, 6, seed=4)}
    assert_close(run_graph(g, feeds)["y"], ort(m, feeds)["y"], rtol=0.0, atol=0.05 * LSB * (1 + 1e-6))


# --------------------------------------------------- (c) interpreter after the pass vs onnxruntime
def _with_outputs(model: onnx.ModelProto, g: Graph, names: set[str]) -> onnx.ModelProto:
    """``model`` with the named intermediate values (those it computes) added as outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    produced = {o for n in model.graph.node for o in n.output}
    have = {o.name for o in model.graph.output}
    types = {v.name: v.type for n in g.nodes() for v in g.outputs_of(n)}
    for nm in sorted((names & produced) - have):
        t = types[nm]
        assert t.shape is not None
        out.graph.output.append(helper.make_tensor_value_info(nm, int(t.dtype), list(t.shape)))
    return out


def test_interpreter_after_pass_matches_ort_on_qdq(quantized: Quantized) -> None:
    g = quantized.qdq_graph.clone()
    run_passes(g, [PASS])
    qconvs = [n for n in g.ops() if n.op == "QConv"]
    names = {
        v.name for n in qconvs for v in [*g.inputs_of(n), g.value(n)] if v is not None and v.const is None
    }
    ref = ort(_with_outputs(quantized.qdq_onnx, g, names), quantized.feeds)
    got = run_graph(g, quantized.feeds)
    for name in g.output_names:
        assert agreement(got[name], ref[name]).cosine >= MIN_COSINE, name
    # every quantized tensor a QConv writes, from onnxruntime's own integer inputs: within 1 LSB
    # (end to end, 1-LSB rounding ties compound through the layers, so they are judged per layer)
    checked = Counter[str]()
    reference = get_op("QConv", "kiln").reference
    for n in qconvs:
        y = g.value(n).name
        if y not in ref:
            continue  # a float output renamed by the export's expansion
        ins = [
            None if v is None else (v.const if v.const is not None else ref[v.name]) for v in g.inputs_of(n)
        ]
        mine = reference(ins, n.attrs, 1)[0]
        if mine.dtype.kind == "f":
            assert_close(
                mine, ref[y], rtol=0.0, atol=FLOAT_RTOL * max(1.0, float(np.abs(ref[y]).max())), what=y
            )
        else:
            assert_close(mine, ref[y], rtol=0.0, atol=LSB, what=y)
        checked[n.attrs.out_dtype] += 1
    assert checked["uint8"] >= 40


def test_choose_layout_blocks_every_qconv_exactly(quantized: Quantized) -> None:
    """After fuse-quantized-ops, choose-layout blocks every QConv in multiples of 4 channels
    (int8 dot instructions take 4 at once) and the interpreter's outputs do not move at all."""
    g = quantized.qdq_graph.clone()
    run_passes(g, [PASS, "eliminate-dead-nodes"])
    before = run_graph(g, quantized.feeds)
    run_passes(g, ["choose-layout{lanes=16}", "eliminate-dead-nodes"])
    qconvs = [n for n in g.ops() if n.op == "QConv"]
    assert qconvs and all(n.attrs.is_blocked for n in qconvs)
    for n in qconvs:
        assert block_of(n.attrs.layout) % 4 == 0 and block_of(n.attrs.output_layout) % 4 == 0
    after = run_graph(g, quantized.feeds)
    for k, v in before.items():
        np.testing.assert_array_equal(after[k], v, err_msg=k)
