"""Op coverage of the CANN backend beyond the shared models, and its refusals.

Each small model goes through Kiln's default pipeline, is written in both schemas, read back
and run (ONNX export, onnxruntime) against the original: max rel 1e-5. The GE op types the
file holds are checked against the mapping. Int8 variants (int8 activations, per-tensor
weights) must read back equal to Kiln's QDQ model. Refusals name the node and the reason.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest

from backends.cann.emit import om_bytes
from backends.cann.ge_writer import write_ge
from backends.cann.options import CannOptions
from compiler.api import load_model
from compiler.cli import main as kiln
from compiler.errors import ConversionError, UnsupportedOpsError
from compiler.ir.graph import Graph
from compiler.ir.types import DType
from compiler.metrics import agreement
from compiler.onnx_export import export_onnx, model_bytes
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from frontends.cann.lift import lift_graph
from frontends.cann.loader import read_om_graph
from schemas.cann.om_container import pack_om
from schemas.cann.om_graph import Attr, OmGraph, OmOp, TensorDesc
from schemas.cann.op_table import SIMPLE_OPS
from tests.helpers.cann import compile_tiny, ge_consts, netron_check, tiny_net
from tests.helpers.onnx_text import rand, text_model

_UNARY_OPS = (
    "Relu",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Sqrt",
    "Abs",
    "Neg",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Erf",
)
_UNARY_OPS += ("HardSwish", "Identity")
_BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")

NN = """
nn (float[1, 4, 8, 8] x) => (float[1, 6] y, float[1, 4, 4, 4] p) {
    n = BatchNormalization <epsilon = 0.001> (x, g, b, m, v)
    a = AveragePool <kernel_shape = [2, 2], strides = [2, 2]> (n)
    p = AveragePool <kernel_shape = [3, 3], pads = [1, 1, 1, 1], count_include_pad = 1> (a)
    q = MaxPool <kernel_shape = [3, 3], strides = [2, 2], ceil_mode = 1> (p)
    c = Conv (q, w, cb)
    r6 = Clip (c, lo, hi)
    gm = GlobalMaxPool (r6)
    f = Flatten (gm)
    mm = MatMul (f, wm)
    lr = LeakyRelu <alpha = 0.2> (mm)
    t = Tanh (lr)
    hs = HardSigmoid <alpha = 0.3, beta = 0.4> (t)
    y = Gemm (hs, wg)
}
"""

SHAPES = """
shapes (float[1, 2, 3, 4] x, float[1, 3, 2, 4] z) => (float[1, 1, 2, 3] y, float[3] s, float[2, 1, 3, 4] o) {
    t = Transpose (x)
    tt = Transpose <perm = [0, 2, 1, 3]> (x)
    c = Concat <axis = 3> (tt, z)
    sl = Slice (c, starts, ends, axes, steps)
    rm = ReduceMean <keepdims = 0> (sl, rax)
    sq = Unsqueeze (rm, uax)
    sg = Sigmoid (sq)
    d = Div (sq, sg)
    e = Sub (d, sq)
    cl = Clip (e, lo)
    h = Cast <to = 10> (cl)
    y = Cast <to = 1> (h)
    s = ReduceSum <keepdims = 0> (t, sax)
    sm = Softmax <axis = 1> (x)
    r = Reshape (sm, shp)
    o = Sigmoid (r)
}
"""

RESIZE = """
rs (float[1, 2, 4, 4] x) => (float[1, 2, 8, 8] n, float[1, 2, 8, 8] l) {
    n = Resize <mode = "nearest", nearest_mode = "floor", coordinate_transformation_mode = "asymmetric"> (x, , sc)
    l = Resize <mode = "linear", coordinate_transformation_mode = "half_pixel"> (x, , sc)
}
"""


def _nn() -> onnx.ModelProto:
    return text_model(
        NN,
        opset=17,
        g=rand(4, seed=1, positive=True),
        b=rand(4, seed=2),
        m=rand(4, seed=3),
        v=rand(4, seed=4, positive=True),
        w=rand(5, 4, 1, 1, seed=5),
        cb=rand(5, seed=6),
        lo=np.array(0.0, np.float32),
        hi=np.array(6.0, np.float32),
        wm=rand(5, 7, seed=7),
        wg=rand(7, 6, seed=8),
    )


def _shapes() -> onnx.ModelProto:
    return text_model(
        SHAPES,
        opset=18,
        starts=np.array([0, 1], np.int64),
        ends=np.array([2, 7], np.int64),
        axes=np.array([1, 3], np.int64),
        steps=np.array([1, 2], np.int64),
        rax=np.array([1], np.int64),
        uax=np.array([1], np.int64),
        lo=np.array(-0.25, np.float32),
        sax=np.array([0, 2, 3], np.int64),
        shp=np.array([2, 1, 3, 4], np.int64),
    )


def _resize() -> onnx.ModelProto:
    return text_model(RESIZE, opset=17, sc=np.array([1, 1, 2, 2], np.float32))


FUSED = """
fused (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y, float[1, 4, 8, 8] k) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    y = Clip (c, lo, hi)
    d = Conv <pads = [1, 1, 1, 1]> (x, w2, b)
    k = LeakyRelu <alpha = 0.1> (d)
}
"""


def _fused() -> onnx.ModelProto:
    lo, hi = np.array(0.0, np.float32), np.array(6.0, np.float32)
    return text_model(
        FUSED, opset=17, w=rand(4, 3, 3, 3, seed=1), w2=rand(4, 3, 3, 3, seed=2), b=rand(4), lo=lo, hi=hi
    )


# case -> (model, Kiln pipeline before writing, GE op types the file must hold)
CASES = {
    "nn": (
        _nn,
        "cleanup",
        {"BNInference", "Pooling", "Conv2D", "ClipByValue", "BatchMatMulV2", "LeakyRelu", "Tanh"},
    ),
    "shapes": (
        _shapes,
        "default",
        {"TransposeD", "ConcatD", "StridedSliceV2", "ReduceMean", "Reshape", "RealDiv", "Cast", "ReduceSum"},
    ),
    "resize": (_resize, "default", {"Resize"}),
    "fused": (_fused, "default", {"Conv2D", "Relu6", "LeakyRelu"}),
}


@pytest.mark.parametrize("schema", ["ge", "domi"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fp32_ops_round_trip(tmp_path: Path, case: str, schema: str) -> None:
    build, pipeline_name, ge_types = CASES[case]
    model = build()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    graph = load_model(src)
    PassManager(pipeline(pipeline_name)).run(graph)
    data = om_bytes(graph, CannOptions(schema))
    assert data == om_bytes(graph, CannOptions(schema)), "not deterministic"
    detected, om = read_om_graph(data, "m.om")
    assert detected == schema
    types = {op.type for op in om.ops}
    assert ge_types <= types, f"missing {ge_types - types}"
    back = lift_graph(om, "m.om")
    rng = np.random.default_rng(3)
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }
    ref = run_onnxruntime(src, feeds)
    got = run_onnxruntime(model_bytes(export_onnx(back)), feeds)
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert agreement(got[k], ref[k]).max_rel <= 1e-5, k


@pytest.mark.parametrize("schema", ["ge", "domi"])
@pytest.mark.parametrize(
    "extra", [(), ("--activation-type", "int8"), ("--per-tensor-weights",)], ids=["u8", "i8", "per-tensor"]
)
def test_int8_variants_equal_the_qdq_model(tmp_path: Path, schema: str, extra: tuple[str, ...]) -> None:
    out = compile_tiny(tiny_net(), tmp_path / "out", "int8", schema, extra)
    x = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)
    qdq = run_onnxruntime(out / "model.onnx", {"x": x})
    got = run_onnxruntime(model_bytes(export_onnx(load_model(out / "model.om"))), {"x": x})
    for k in qdq:
        assert np.array_equal(got[k], qdq[k]), k
    _, om = read_om_graph((out / "model.om").read_bytes(), "model.om")
    types = collections.Counter(op.type for op in om.ops)
    assert types["AscendDequant"] == types["Conv2D"] + types["FullyConnection"] == 3


def test_refusals_name_the_node(tmp_path: Path) -> None:
    dyn = text_model("d (float[N, 3] x) => (float[N, 3] y) { y = Relu (x) }")
    onnx.save(dyn, tmp_path / "dyn.onnx")
    with pytest.raises(ConversionError, match="static shapes"):
        om_bytes(load_model(tmp_path / "dyn.onnx"))
    gather = text_model("g (float[4, 3] x) => (float[4, 3] y) { y = Hardmax (x) }")
    onnx.save(gather, tmp_path / "g.onnx")
    with pytest.raises(ConversionError, match="Hardmax .* no CANN mapping"):
        om_bytes(load_model(tmp_path / "g.onnx"))
    pad = text_model(
        'p (float[1, 1, 4, 4] x) => (float[1, 1, 4, 7] y) { y = Pad <mode = "wrap"> (x, pads) }',
        pads=np.array([0, 0, 0, 1, 0, 0, 0, 2], np.int64),
    )
    onnx.save(pad, tmp_path / "p.onnx")
    with pytest.raises(ConversionError, match="Pad .*%y.*mode 'wrap' has no PadV3 form"):
        om_bytes(load_model(tmp_path / "p.onnx"))


def test_reader_lists_every_unsupported_op() -> None:
    d = TensorDesc(DType.FLOAT32, (1, 3))
    om = OmGraph("u")
    om.ops = [
        OmOp("x", "Data", [], [d]),
        OmOp("a", "FooOp", ["x:0"], [d]),
        OmOp("b", "BarOp", ["a:0"], [d]),
        OmOp("c", "FooOp", ["b:0"], [d]),
        OmOp("out", "NetOutput", ["c:0"], []),
    ]
    om.output_names = ["c"]
    model_def, weights = write_ge(om)
    _, back = read_om_graph(pack_om([(0, model_def), (1, weights)], "u"), "u.om")
    with pytest.raises(UnsupportedOpsError) as err:
        lift_graph(back, "u.om")
    assert err.value.ops == {"BarOp": ["b"], "FooOp": ["a", "c"]}


def test_cli_flags_and_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "tiny.onnx"
    onnx.save(tiny_net(), src)
    assert kiln(["compile", str(src), "-o", str(tmp_path / "a"), "--cann-schema", "domi"]) == 2
    assert "--cann-schema needs --emit cann" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        kiln(["compile", str(src), "-o", str(tmp_path / "b"), "--emit", "cann", "--cann-schema", "xyz"])
    assert exit_.value.code == 2
    assert kiln(["compile", str(src), "-o", str(tmp_path / "c"), "--emit", "cann"]) == 0
    assert (tmp_path / "c" / "model.om").read_bytes()[:4] == b"IMOD"
    x = tmp_path / "x.npz"
    np.savez(x, x=np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32))
    assert (
        kiln(["run", str(tmp_path / "c" / "model.om"), "--inputs", str(x), "-o", str(tmp_path / "y.npz")])
        == 0
    )
    assert kiln(["run", str(src), "--inputs", str(x), "-o", str(tmp_path / "y_ref.npz")]) == 0
    with np.load(tmp_path / "y.npz") as got, np.load(tmp_path / "y_ref.npz") as ref:
        for k in ref.files:
            assert agreement(got[k], ref[k]).max_rel <= 1e-5, k


def _one_op_model(op: str, binary: bool) -> onnx.ModelProto:
    if binary:
        return text_model(f"b (float[2, 3] x, float[2, 3] z) => (float[2, 3] y) {{ y = {op} (x, z) }}")
    return text_model(f"u (float[2, 3] x) => (float[2, 3] y) {{ y = {op} (x) }}")


_ONE_OPS = [(s.kiln, s.ge) for s in SIMPLE_OPS if s.kiln in _UNARY_OPS + _BINARY_OPS]


@pytest.mark.parametrize("schema", ["ge", "domi"])
@pytest.mark.parametrize(("op", "ge_type"), _ONE_OPS, ids=[k for k, _ in _ONE_OPS])
def test_every_elementwise_op_round_trips(tmp_path: Path, op: str, ge_type: str, schema: str) -> None:
    binary = op in _BINARY_OPS
    model = _one_op_model(op, binary)
    onnx.save(model, tmp_path / "m.onnx")
    graph = load_model(tmp_path / "m.onnx")
    _, om = read_om_graph(om_bytes(graph, CannOptions(schema)), "m.om")
    assert [o.type for o in om.ops] == ["Data"] * (1 + binary) + [ge_type, "NetOutput"]
    rng = np.random.default_rng(0)
    feeds = {n: rng.uniform(0.5, 2.0, (2, 3)).astype(np.float32) for n in ("x", "z")[: 1 + binary]}
    got = run_onnxruntime(model_bytes(export_onnx(lift_graph(om, "m.om"))), feeds)
    ref = run_onnxruntime(tmp_path / "m.onnx", feeds)
    assert np.array_equal(got["y"], ref["y"])


TENSOR = """
tensor (float[1, 3, 6, 6] x, int64[2, 3] ids) =>
    (float[2, 3, 5] e, float[1, 3, 6, 2] g, float[1, 3, 6, 6] ap, float[1, 3, 4, 4] apc,
     float[1, 3, 8, 9] pc, float[1, 3, 8, 9] pr, float[1, 3, 7, 8] pe, float[2, 3, 6, 6] ex) {
    e = Gather (emb, ids)
    g = Gather <axis = -1> (x, cols)
    ap = AveragePool <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x)
    apc = AveragePool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], ceil_mode = 1> (x)
    pc = Pad (x, pads, cv)
    pr = Pad <mode = "reflect"> (x, pads)
    pe = Pad <mode = "edge"> (x, pads2, , axes)
    r = Relu (x)
    ex = Expand (r, shp)
}
"""


def _tensor() -> onnx.ModelProto:
    return text_model(
        TENSOR,
        opset=18,
        emb=rand(7, 5, seed=1),
        cols=np.array([-1, 2], np.int64),
        pads=np.array([0, 0, 1, 2, 0, 0, 1, 1], np.int64),
        cv=np.array(1.5, np.float32),
        pads2=np.array([1, 0, 0, 2], np.int64),
        axes=np.array([2, 3], np.int64),
        shp=np.array([2, 1, 1, 1], np.int64),
    )


@pytest.mark.parametrize("schema", ["ge", "domi"])
def test_gather_expand_pad_exclusive_avgpool_round_trip(tmp_path: Path, schema: str) -> None:
    """GatherV2 / Expand / PadV3 / AvgPoolV2 in the forms ATC writes; read back exactly."""
    src = tmp_path / "m.onnx"
    onnx.save(_tensor(), src)
    graph = load_model(src)
    PassManager(pipeline("default")).run(graph)
    data = om_bytes(graph, CannOptions(schema))
    (tmp_path / "m.om").write_bytes(data)
    detected, om = read_om_graph(data, "m.om")  # the strict container reader
    assert detected == schema
    ops = {op.name: op for op in om.ops}
    consts = {op.name: op.value for op in om.ops if op.type == "Const" and op.value is not None}
    by_type = collections.Counter(op.type for op in om.ops)
    assert by_type["GatherV2"] == 2 and by_type["PadV3"] == 3 and by_type["Expand"] == 1
    assert by_type["AvgPoolV2"] == 2 and by_type["Pooling"] == 0
    gv = ops["g"]
    axis = consts[gv.inputs[2].split(":")[0]]
    assert axis.dtype == np.int32 and axis.shape == () and int(axis) == 3
    assert gv.attrs["negative_index_support"].value is True
    pe = ops["pe"]
    assert pe.attrs["mode"].value == "edge" and pe.attrs["paddings_contiguous"].value is False
    assert list(consts[pe.inputs[1].split(":")[0]]) == [0, 0, 1, 0, 0, 0, 0, 2]  # axes folded in
    assert len(ops["pc"].inputs) == 3 and len(ops["pr"].inputs) == 2  # constant_values in constant mode
    apc = ops["apc"].attrs
    assert apc["exclusive"].value is True and apc["ceil_mode"].value is True
    assert apc["ksize"].value == (1, 1, 3, 3) and apc["strides"].value == (1, 1, 2, 2)
    assert list(consts[ops["ex"].inputs[1].split(":")[0]]) == [2, 3, 6, 6]
    back = lift_graph(om, "m.om")
    lifted = collections.Counter(n.op for n in back.ops())
    assert lifted["Gather"] == 2 and lifted["Pad"] == 3 and lifted["Expand"] == 1
    assert all(n.attrs.count_include_pad == 0 for n in back.ops() if n.op == "AveragePool")
    rng = np.random.default_rng(3)
    feeds: dict[str, np.ndarray] = {
        "x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
        "ids": np.array([[0, 6, -1], [2, 3, -7]], np.int64),
    }
    got = run_onnxruntime(model_bytes(export_onnx(back)), feeds)
    before = run_onnxruntime(model_bytes(export_onnx(graph)), feeds)
    ref = run_onnxruntime(src, feeds)
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert np.array_equal(got[k], before[k]), f"{k}: the round trip is not exact"
        assert agreement(got[k], ref[k]).max_rel <= 1e-5, k
    if schema == "ge":
        (res,) = netron_check([tmp_path / "m.om"])
        assert res["accepted"] and not res["problems"], res.get("error")
        model, _ = ge_consts(tmp_path / "m.om")
        want = [(op.name, op.type) for op in model.graph[0].op if op.type != "Const"]
        assert [(n["name"], n["type"]) for n in res["graphs"][0]["nodes"]] == want


def _lift_one(ops: list[OmOp], out: str) -> Graph:
    """Write ``ops`` (plus a NetOutput of ``out``) as a ge file, read it back strictly, lift it."""
    om = OmGraph("h")
    om.ops = [*ops, OmOp("out", "NetOutput", [f"{out}:0"], [])]
    om.output_names = [out]
    model_def, weights = write_ge(om)
    _, back = read_om_graph(pack_om([(0, model_def), (1, weights)], "h"), "h.om")
    return lift_graph(back, "h.om")


def test_lift_reads_gatherv2d_and_contiguous_paddings() -> None:
    """ATC's older GatherV2D (axis attr) and GE's default paddings_contiguous=true also lift."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    dx = TensorDesc(DType.FLOAT32, x.shape)
    idx = np.array([2, 0], np.int32)
    pads = np.array([0, 1, 1, 0, 2, 3], np.int64)  # [b0, e0, b1, e1, b2, e2]
    ops = [
        OmOp("x", "Data", [], [dx], {"index": Attr.i(0)}),
        OmOp("i", "Const", [], [TensorDesc(DType.INT32, (2,))], value=idx),
        OmOp("g", "GatherV2D", ["x:0", "i:0"], [TensorDesc(DType.FLOAT32, (2, 2, 4))], {"axis": Attr.i(1)}),
        OmOp("p", "Const", [], [TensorDesc(DType.INT64, (6,))], value=pads),
        OmOp(
            "y", "PadV3", ["g:0", "p:0"], [TensorDesc(DType.FLOAT32, (3, 3, 9))], {"mode": Attr.s("reflect")}
        ),
    ]
    got = run_onnxruntime(model_bytes(export_onnx(_lift_one(ops, "y"))), {"x": x})["y"]
    want = np.pad(np.take(x, idx, axis=1), [(0, 1), (1, 0), (2, 3)], mode="reflect")
    assert np.array_equal(got, want)
