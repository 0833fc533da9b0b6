"""choose-layout: blocked-layout structure, numerics against onnxruntime, must-not-fire, idempotence."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import pytest

from compiler.api import load_model
from compiler.errors import ConversionError
from compiler.ir import DType, Graph, TensorType, Value, print_graph, run_graph, verify
from compiler.onnx_export import export_onnx
from compiler.ops import blocked_layout as bl
from compiler.pass_infra import PassContext, all_passes
from compiler.pipelines import pipeline
from frontends.onnx.loader import load_onnx
from passes.choose_layout import ChooseLayout, layout_decisions
from tests.conftest import MODEL_STEMS, MODELS
from tests.helpers.numerics import assert_close
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, ort, run_passes

T = "kiln::LayoutTransform"
X = {"x": rand(1, 3, 16, 16, seed=1)}


def _check(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], p: ChooseLayout | None = None) -> Graph:
    """Default pipeline + choose-layout; the interpreter must match onnxruntime on the original
    (|a - e| <= 1e-4 * max(1, max|e|)) and the pipeline's own NCHW graph (rtol 1e-6)."""
    graph = load_onnx(model)
    run_passes(graph, pipeline("default"))
    before = run_graph(graph, feeds)
    ctx = PassContext()
    assert run_passes(graph, [p or ChooseLayout()], ctx).changed
    got = run_graph(graph, feeds)
    ref = ort(model, feeds)
    for k, e in ref.items():
        assert_close(got[k], e, rtol=0.0, atol=1e-4 * max(1.0, float(np.max(np.abs(e)))), what=k)
        assert_close(got[k], before[k], rtol=1e-6, atol=1e-6, what=k)
    assert not run_passes(graph, [p or ChooseLayout()]).changed
    return graph


def _misses(ctx: PassContext) -> set[tuple[str, str]]:
    return {(m.node, m.reason) for m in ctx.near_misses}


# ------------------------------------------------------------------ layout op
def test_pack_unpack_and_transform_export_match_reference() -> None:
    x = rand(2, 20, 3, 5, seed=3)
    p = bl.pack(x, 16)
    assert p.shape == (2, 2, 3, 5, 16) and np.all(p[:, 1, :, :, 4:] == 0)
    assert p[1, 1, 2, 3, 3] == x[1, 19, 2, 3]
    np.testing.assert_array_equal(bl.unpack(p, 20), x)
    np.testing.assert_array_equal(bl.relayout(p, "NCHW16c", "NCHW8c", 20), bl.pack(x, 8))
    assert bl.block_of("NCHW") == 0 and bl.block_of("NCHW3c") == 3
    with pytest.raises(bl.LayoutError):
        bl.block_of("NHWC")
    g = Graph()
    v = g.add_input("x", TensorType(DType.FLOAT32, (2, 20, 3, 5)))
    for src, dst in (("NCHW", "NCHW16c"), ("NCHW16c", "NCHW8c"), ("NCHW8c", "NCHW")):
        v = g.value(
            g.add_node("LayoutTransform", [v], {"src": src, "dst": dst, "channels": 20}, domain="kiln")
        )
    mid = g.inputs_of(v.producer)[0]
    assert mid is not None and str(mid.type) == "f32[2,3,3,5,8]"
    g.set_outputs([mid, v], ["mid", "y"])
    got = ort(export_onnx(g), {"x": x})
    np.testing.assert_array_equal(got["mid"], bl.pack(x, 8))
    np.testing.assert_array_equal(got["y"], x)


def test_blocked_fused_conv_reference_and_export_refusal() -> None:
    x, w, b = rand(1, 5, 6, 6, seed=4), rand(12, 5, 3, 3, seed=5), rand(12, seed=6)
    z = rand(1, 12, 6, 6, seed=7)
    g = Graph()
    xi = g.add_input("x", TensorType(DType.FLOAT32, (1, 2, 6, 6, 4)))
    zi = g.add_input("z", TensorType(DType.FLOAT32, (1, 2, 6, 6, 8)))
    attrs = {"pads": (1, 1, 1, 1), "activation": "relu", "layout": "NCHW4c", "out_layout": "NCHW8c"}
    node = g.add_node("FusedConv", [xi, g.add_constant(w), g.add_constant(b), zi], attrs, domain="kiln")
    g.set_outputs([g.value(node)])
    verify(g)
    got = run_graph(g, {"x": bl.pack(x, 4), "z": bl.pack(z, 8)})[g.value(node).name]
    nchw = Graph()
    xn = nchw.add_input("x", TensorType(DType.FLOAT32, (1, 5, 6, 6)))
    zn = nchw.add_input("z", TensorType(DType.FLOAT32, (1, 12, 6, 6)))
    ref = nchw.add_node(
        "FusedConv",
        [xn, nchw.add_constant(w), nchw.add_constant(b), zn],
        {"pads": (1, 1, 1, 1), "activation": "relu"},
        domain="kiln",
    )
    nchw.set_outputs([nchw.value(ref)])
    expect = run_graph(nchw, {"x": x, "z": z})[nchw.value(ref).name]
    np.testing.assert_array_equal(bl.unpack(got, 12), expect)
    with pytest.raises(ConversionError, match="NCHW4c -> NCHW8c has no ONNX form"):
        export_onnx(g)


# ------------------------------------------------------------- small models
def _chain_model() -> onnx.ModelProto:
    return text_model(
        """g (float[1,3,16,16] x) => (float[1,5] y) {
             c1 = Conv<pads=[1,1,1,1]>(x, w1, b1)
             r1 = Relu(c1)
             m1 = Mul(r1, s1)
             d1 = Div(m1, s2)
             a1 = Add(d1, s3)
             p1 = MaxPool<kernel_shape=[2,2], strides=[2,2]>(a1)
             c2 = Conv<pads=[1,1,1,1], group=32>(p1, wd)
             h2 = HardSwish(c2)
             c3 = Conv(h2, w3)
             g3 = Sigmoid(c3)
             q3 = AveragePool<kernel_shape=[3,3], pads=[1,1,1,1]>(g3)
             l3 = LeakyRelu<alpha=0.1>(q3)
             k = Concat<axis=1>(l3, p1)
             u = Resize<mode="nearest">(k, roi, scales)
             c4 = Conv<strides=[2,2]>(u, w4)
             s = Add(c4, c4)
             gp = GlobalAveragePool(s)
             f = Flatten(gp)
             y = Gemm<transB=1>(f, fw, fb)
           }""",
        w1=rand(32, 3, 3, 3, seed=11, scale=0.3),
        b1=rand(32, seed=12),
        s1=rand(1, 32, 1, 1, seed=13),
        s2=rand(32, 1, 1, seed=14, positive=True),
        s3=rand(1, 32, 1, 1, seed=15),
        wd=rand(32, 1, 3, 3, seed=16, scale=0.3),
        w3=rand(32, 32, 1, 1, seed=17, scale=0.2),
        roi=np.zeros(0, np.float32),
        scales=np.array([1, 1, 2, 2], np.float32),
        w4=rand(24, 64, 3, 3, seed=18, scale=0.1),
        fw=rand(5, 24, seed=19),
        fb=rand(5, seed=20),
    )


def test_blocked_region_needs_one_transform_in_and_one_out() -> None:
    g = _check(_chain_model(), X)
    counts = op_counts(g)
    assert counts[T] == 2, print_graph(g, constants=False)
    assert counts["kiln::FusedConv"] == 4 and counts["Conv"] == 0
    assert counts["ReduceMean"] == 1 and counts["GlobalAveragePool"] == 0
    first, last = (n for n in g.ops() if n.op == "LayoutTransform")
    assert (first.attrs.src, first.attrs.dst) == ("NCHW", "NCHW3c")
    assert (last.attrs.src, last.attrs.dst, last.attrs.channels) == ("NCHW16c", "NCHW", 24)
    assert [u.op for u, _ in g.users(g.value(last))] == ["Flatten"]
    pool = next(n for n in g.ops() if n.op == "MaxPool")
    assert pool.attrs.kernel_shape == (2, 2, 1) and pool.attrs.strides == (2, 2, 1)
    decisions = layout_decisions(g)
    assert [(d["data_layout"], d["out_layout"], d["weight_layout"]) for d in decisions] == [
        ("NCHW3c", "NCHW16c", "OIHW3i16o"),
        ("NCHW16c", "NCHW16c", "OIHW1i16o"),
        ("NCHW16c", "NCHW16c", "OIHW16i16o"),
        ("NCHW16c", "NCHW16c", "OIHW16i16o"),
    ]
    assert all(d["cost"] > 0 for d in decisions)


def test_golden_ir_small_channels_use_their_own_block() -> None:
    m = text_model(
        """g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
             c = Conv<pads=[1,1,1,1]>(x, w, b)
             y = Relu(c)
           }""",
        w=rand(4, 3, 3, 3, seed=2, scale=0.3),
        b=rand(4, seed=3),
    )
    g = _check(m, {"x": rand(1, 3, 8, 8, seed=1)})
    assert print_graph(g, constants=False) == (
        "graph g(\n  %x: f32[1,3,8,8],\n) {\n"
        "  %x_to_NCHW3c = kiln::LayoutTransform(%x) {src='NCHW', dst='NCHW3c', channels=3} : f32[1,1,8,8,3]\n"
        "  %y_NCHW4c = kiln::FusedConv(%x_to_NCHW3c, %w, %b) {pads=[1,1,1,1], activation='relu', "
        "layout='NCHW3c', out_layout='NCHW4c', weight_layout='OIHW3i4o'} : f32[1,1,8,8,4]\n"
        "  %y = kiln::LayoutTransform(%y_NCHW4c) {src='NCHW4c', dst='NCHW', channels=4} : f32[1,4,8,8]  # y_to_NCHW\n"
        "  return %y\n}\n"
    )


# ------------------------------------------------------------ must not fire
def test_grouped_conv_stays_nchw_with_reason() -> None:
    """48 channels in 2 groups of 24: with 16-channel blocks a group spans 1.5 chunks."""
    m = text_model(
        """g (float[1,48,8,8] x) => (float[1,48,8,8] y) {
             y = Conv<pads=[1,1,1,1], group=2>(x, w)
           }""",
        w=rand(48, 24, 3, 3, seed=2),
    )
    g = load_onnx(m)
    ctx = PassContext()
    assert not run_passes(g, [ChooseLayout()], ctx).changed
    assert op_counts(g) == {"Conv": 1}
    why = "grouped conv (group=2, C_in=48, C_out=48): its groups do not fill whole NCHW16c / NCHW16c chunks"
    assert ("y", why) in _misses(ctx)
    assert layout_decisions(g) == []


def test_grouped_conv_with_whole_chunks_is_blocked() -> None:
    """ResNeXt-style groups of 4 channels: four groups fill each 16-channel chunk."""
    m = text_model(
        """g (float[1,32,8,8] x) => (float[1,32,8,8] y) {
             y = Conv<pads=[1,1,1,1], group=8>(x, w)
           }""",
        w=rand(32, 4, 3, 3, seed=2),
    )
    g = _check(m, {"x": rand(1, 32, 8, 8, seed=3)})
    assert op_counts(g) == {T: 2, "kiln::FusedConv": 1}
    (decision,) = layout_decisions(g)
    assert decision["data_layout"] == "NCHW16c" and decision["weight_layout"] == "OIHW16i16o"


def test_reshape_gets_one_shared_transform() -> None:
    m = text_model(
        """g (float[1,3,8,8] x) => (float[1,1024] r, float[1,16,8,8] y) {
             c = Conv<pads=[1,1,1,1]>(x, w)
             r = Reshape(c, shape)
             y = Relu(c)
           }""",
        w=rand(16, 3, 3, 3, seed=2),
        shape=np.array([1, -1], np.int64),
    )
    g = load_onnx(m)
    ctx = PassContext()
    assert run_passes(g, [ChooseLayout()], ctx).changed
    assert op_counts(g)[T] == 3  # x -> NCHW3c, c -> NCHW (shared by Reshape), y -> NCHW
    reshape = next(n for n in g.ops() if n.op == "Reshape")
    src = g.inputs_of(reshape)[0]
    assert src is not None and src.producer.op == "LayoutTransform" and src.producer.attrs.dst == "NCHW"
    assert ("r", "op has no blocked form") in _misses(ctx)
    feeds = {"x": rand(1, 3, 8, 8, seed=1)}
    got, ref = run_graph(g, feeds), ort(m, feeds)
    for k in ref:
        assert_close(got[k], ref[k], rtol=1e-4, atol=1e-5, what=k)


def test_div_by_tensor_stays_nchw_with_reason() -> None:
    m = text_model(
        """g (float[1,3,8,8] x, float[1,16,8,8] z) => (float[1,16,8,8] y) {
             c = Conv<pads=[1,1,1,1]>(x, w)
             s = Sigmoid(c)
             y = Div(s, z)
           }""",
        w=rand(16, 3, 3, 3, seed=2),
    )
    g = load_onnx(m)
    ctx = PassContext()
    run_passes(g, [*pipeline("default"), ChooseLayout()], ctx)
    div = next(n for n in g.ops() if n.op == "Div")
    assert all(v is not None and v.type.rank == 4 for v in g.inputs_of(div))
    assert ("y", "Div by a non-constant could turn a padded lane into inf/NaN") in _misses(ctx)
    assert op_counts(g)[T] == 2
    feeds = {"x": rand(1, 3, 8, 8, seed=1), "z": rand(1, 16, 8, 8, seed=3, positive=True)}
    got, ref = run_graph(g, feeds), ort(m, feeds)
    assert_close(got["y"], ref["y"], rtol=1e-4, atol=1e-5, what="y")


def test_inverse_pairs_cancel_and_duplicates_merge() -> None:
    g = Graph()
    x = g.add_input("x", TensorType(DType.FLOAT32, (1, 20, 4, 4)))

    def t(v: Value, src: str, dst: str) -> Value:
        return g.value(
            g.add_node("LayoutTransform", [v], {"src": src, "dst": dst, "channels": 20}, domain="kiln")
        )

    back = t(t(x, "NCHW", "NCHW16c"), "NCHW16c", "NCHW")
    y1 = g.value(g.add_node("Relu", [back], name="relu"))
    y2 = t(t(x, "NCHW", "NCHW16c"), "NCHW16c", "NCHW8c")
    y3 = t(x, "NCHW", "NCHW8c")
    y4 = g.value(g.add_node("Add", [y2, y3], name="add"))
    g.set_outputs([y1, y4], ["y1", "y4"])
    feeds = {"x": rand(1, 20, 4, 4, seed=5)}
    before = run_graph(g, feeds)
    ctx = PassContext()
    assert run_passes(g, [ChooseLayout()], ctx).changed
    assert op_counts(g) == {"Relu": 1, "Add": 1, T: 1}
    relu = next(n for n in g.ops() if n.op == "Relu")
    assert g.inputs_of(relu)[0] == g.inputs[0]
    add = next(n for n in g.ops() if n.op == "Add")
    assert g.inputs_of(add)[0] == g.inputs_of(add)[1]
    after = run_graph(g, feeds)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    assert (g.name, "the graph already has blocked layouts") in _misses(ctx)
    assert not run_passes(g, [ChooseLayout()]).changed


# --------------------------------------------------------------- cost model
def _wide_model() -> onnx.ModelProto:
    return text_model(
        """g (float[1,24,16,16] x) => (float[1,24,16,16] y) {
             c = Conv<pads=[1,1,1,1]>(x, w)
             y = Conv<pads=[1,1,1,1]>(c, w)
           }""",
        w=rand(24, 24, 3, 3, seed=2, scale=0.2),
    )


@pytest.mark.parametrize(
    ("p", "layout"),
    [
        (ChooseLayout(), "NCHW16c"),  # eff(8) = 1/2: 32x32 padded MACs beat 24x24 at half speed
        (ChooseLayout(peak_lanes=8), "NCHW8c"),  # Zen 4: 8 lanes reach peak, no padding wins
        (ChooseLayout(blocks=(8,)), "NCHW8c"),
        (ChooseLayout(lanes=8), "NCHW8c"),
    ],
)
def test_cost_model_picks_block(p: ChooseLayout, layout: str) -> None:
    g = _check(_wide_model(), {"x": rand(1, 24, 16, 16, seed=1)}, p)
    assert {d["data_layout"] for d in layout_decisions(g)} == {layout}
    assert op_counts(g)[T] == 2


def test_record_mode_only_records() -> None:
    g = load_onnx(_chain_model())
    run_passes(g, pipeline("default"))
    text = print_graph(g)
    assert not run_passes(g, [ChooseLayout(mode="record", lanes=4)]).changed
    assert print_graph(g) == text
    decisions = layout_decisions(g)
    assert len(decisions) == 4
    assert {d["data_layout"] for d in decisions} == {"NCHW4c"}
    assert decisions[1]["weight_layout"] == "OIHW1i4o"


def test_registered_and_parsed_from_pipeline_string() -> None:
    assert "choose-layout" in all_passes()
    g = load_onnx(_wide_model())
    run_passes(g, ["choose-layout{lanes=16,blocks=8,peak_lanes=8}"])
    assert {d["data_layout"] for d in layout_decisions(g)} == {"NCHW8c"}


# ------------------------------------------------------------ shared models
TRANSFORMS = {
    "pan_mnv3s_skin_clothes_hair": 2,
    "ppocr_mobile_v2_cls": 2,
    "ultraface_rfb320": 9,
    "yunet_n_320": 13,
}
INPUT_SHAPES = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_shared_model_blocked_matches_onnxruntime(stem: str) -> None:
    graph = load_model(MODELS / f"{stem}.onnx", input_shapes=INPUT_SHAPES.get(stem))
    run_passes(graph, pipeline("default"))
    convs = sum(n.op in ("Conv", "FusedConv") for n in graph.ops())
    feeds = dict(np.load(MODELS / "data" / f"{stem}.npz"))
    before = run_graph(graph, feeds)
    assert run_passes(graph, [ChooseLayout()]).changed
    counts = op_counts(graph)
    assert counts[T] == TRANSFORMS[stem]
    assert counts["Conv"] == 0 and len(layout_decisions(graph)) == convs
    got = run_graph(graph, feeds)
    ref = ort(onnx.load(MODELS / f"{stem}.onnx"), feeds)
    for name, expected in ref.items():
        scale = max(1.0, float(np.max(np.abs(expected))))
        assert_close(got[name], expected, rtol=0.0, atol=1e-4 * scale, what=f"{stem}:{name}")
        assert_close(got[name], before[name], rtol=1e-6, atol=1e-6 * scale, what=f"{stem}:{name}")
    assert not run_passes(graph, [ChooseLayout()]).changed


def test_record_layouts_for_mnn_and_cann_leaves_graph_alone() -> None:
    from compiler.ir import print_graph
    from frontends.onnx.loader import load_onnx
    from passes.choose_layout import record_layouts
    from tests.helpers.models import conv_bn_relu

    g = load_onnx(conv_bn_relu())
    before = print_graph(g)
    mnn = record_layouts(g, 4)
    cann = record_layouts(g, 16)
    assert print_graph(g) == before
    assert [(d["data_layout"], d["out_layout"]) for d in mnn] == [("NCHW4c", "NCHW4c")]
    assert [(d["data_layout"], d["out_layout"], d["weight_layout"]) for d in cann] == [
        ("NCHW16c", "NCHW16c", "OIHW16i16o")
    ]
