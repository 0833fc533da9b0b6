"""Native GE forms of ops the CANN backend once decomposed or refused, and multi-output GE ops.

SplitD/SplitVD, LayerNorm (y, mean, variance), GeluV2, LogSoftmaxV2, TensorMove + ScatterNd*,
Equal, SelectV2, Conv2DTranspose, and LSTM as DynamicRNN (ATC's CommonLSTM fusion: w = [Wᵀ; Rᵀ]
in gate order ijfo, b = Wb + Rb). Each file passes the strict container reader in both schemas,
lifts back to a graph that computes exactly what Kiln wrote (onnxruntime on the read-back graph,
against the original within 1e-5), and Netron loads the ge file with every op visible.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from backends.cann.emit import om_bytes
from backends.cann.lower import capabilities
from backends.cann.options import CannOptions
from compiler.api import load_model
from compiler.errors import ConversionError, ModelFileError
from compiler.ir.graph import Graph
from compiler.metrics import agreement
from compiler.onnx_export import export_onnx, model_bytes
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from frontends.cann.lift import lift_graph
from frontends.cann.loader import read_om_graph
from schemas.cann.om_graph import OmGraph, OmOp
from tests.helpers.cann import ge_consts, netron_check
from tests.helpers.onnx_text import rand, text_model

NATIVE = """
native (float[2, 6, 8] x, int64[2, 1] ids, float[2, 6, 8] up, float[1, 4, 5, 5] im) =>
    (float[2, 2, 8] a, float[2, 4, 8] b, float[2, 3, 8] c, float[2, 3, 8] d, float[2, 6, 8] ln,
     float[2, 6, 1] mu, float[2, 6, 8] ge, float[2, 6, 8] gt, float[2, 6, 8] ls, float[2, 6, 8] sc,
     float[2, 6, 8] sa, float[2, 6, 8] wh, float[1, 6, 11, 11] ct) {
    a, b = Split <axis = 1> (x, sp)
    c, d = Split <axis = 1, num_outputs = 2> (x)
    ln, mu = LayerNormalization <axis = -1, epsilon = 0.001> (x, g, be)
    ge = Gelu (x)
    gt = Gelu <approximate = "tanh"> (x)
    ls = LogSoftmax <axis = 1> (x)
    sc = ScatterND (x, ids, up)
    sa = ScatterND <reduction = "add"> (x, ids, up)
    q = Equal (sc, x)
    wh = Where (q, x, up)
    ct = ConvTranspose <strides = [2, 2], pads = [1, 1, 0, 0], output_padding = [1, 1], group = 2> (im, w, cb)
}
"""

NATIVE_TYPES = {
    "SplitD": 1,
    "SplitVD": 1,
    "LayerNorm": 1,
    "GeluV2": 2,
    "LogSoftmaxV2": 1,
    "TensorMove": 2,
    "ScatterNdUpdate": 1,
    "ScatterNdAdd": 1,
    "Equal": 1,
    "SelectV2": 1,
    "Conv2DTranspose": 1,
}


def _native() -> onnx.ModelProto:
    return text_model(
        NATIVE,
        opset=20,
        sp=np.array([2, 4], np.int64),
        g=rand(8, seed=1),
        be=rand(8, seed=2),
        w=rand(4, 3, 3, 3, seed=3),
        cb=rand(6, seed=4),
    )


def _native_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "x": rng.standard_normal((2, 6, 8)).astype(np.float32),
        "ids": np.array([[1], [0]], np.int64),
        "up": rng.standard_normal((2, 6, 8)).astype(np.float32),
        "im": rng.standard_normal((1, 4, 5, 5)).astype(np.float32),
    }


def _write_read(tmp_path: Path, model: onnx.ModelProto, schema: str) -> tuple[Graph, OmGraph, Path]:
    """Kiln's default pipeline, the .om in ``schema`` (deterministic), read back by the strict reader."""
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    graph = load_model(src)
    PassManager([*pipeline("default"), *pipeline("legalize-cann")]).run(graph)
    data = om_bytes(graph, CannOptions(schema))
    assert data == om_bytes(graph, CannOptions(schema)), "not deterministic"
    out = tmp_path / "m.om"
    out.write_bytes(data)
    detected, om = read_om_graph(data, "m.om")
    assert detected == schema
    return graph, om, out


def _check_round_trip(graph: Graph, om: OmGraph, src: Path, feeds: dict[str, np.ndarray]) -> None:
    got = run_onnxruntime(model_bytes(export_onnx(lift_graph(om, "m.om"))), feeds)
    before = run_onnxruntime(model_bytes(export_onnx(graph)), feeds)
    ref = run_onnxruntime(src, feeds)
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert np.array_equal(got[k], before[k]), f"{k}: the round trip is not exact"
        assert agreement(got[k], ref[k]).max_rel <= 1e-5, k


def _check_netron(path: Path) -> None:
    (res,) = netron_check([path])
    assert res["accepted"] and not res["problems"], res.get("error")
    model, _ = ge_consts(path)
    want = [(op.name, op.type) for op in model.graph[0].op if op.type != "Const"]
    assert [(n["name"], n["type"]) for n in res["graphs"][0]["nodes"]] == want


@pytest.mark.parametrize("schema", ["ge", "domi"])
def test_native_forms_round_trip(tmp_path: Path, schema: str) -> None:
    graph, om, path = _write_read(tmp_path, _native(), schema)
    types = collections.Counter(op.type for op in om.ops)
    assert {t: types[t] for t in NATIVE_TYPES} == NATIVE_TYPES
    assert not types["StridedSliceV2"] and not types["Erf"] and not types["ReduceMean"]  # nothing decomposed
    ops = {op.name: op for op in om.ops}
    consts = {op.name: op.value for op in om.ops if op.type == "Const" and op.value is not None}
    vd = next(op for op in om.ops if op.type == "SplitVD")
    assert (
        vd.attrs["size_splits"].value == (2, 4) and vd.attrs["split_dim"].value == 1 and len(vd.outputs) == 2
    )
    ln = ops["ln"]
    assert [d.shape for d in ln.outputs] == [(2, 6, 8), (2, 6, 1), (2, 6, 1)]
    assert ln.attrs["begin_norm_axis"].value == ln.attrs["begin_params_axis"].value == 2
    assert ops["gt"].attrs["approximate"].value == "tanh"
    assert ops["sc"].inputs[0] == "sc/TensorMove:0"
    ct = ops["ct"]
    assert ct.attrs["pads"].value == (1, 0, 1, 0) and ct.attrs["output_padding"].value == (0, 0, 1, 1)
    assert consts[ct.inputs[0].split(":")[0]].tolist() == [1, 6, 11, 11]
    _check_round_trip(graph, om, tmp_path / "m.onnx", _native_feeds())
    if schema == "ge":
        _check_netron(path)


def _lstm(direction: str, **attrs: Any) -> onnx.ModelProto:
    steps, batch, n_in, hid = 5, 2, 3, 4
    nd = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(11)
    w, r = (rng.standard_normal((nd, 4 * hid, n)).astype(np.float32) for n in (n_in, hid))
    b = rng.standard_normal((nd, 8 * hid)).astype(np.float32)
    h0 = rng.standard_normal((nd, batch, hid)).astype(np.float32)
    node = helper.make_node(
        "LSTM",
        ["x", "W", "R", "B", "", "h0", "c0"],
        ["Y", "Y_h", "Y_c"],
        hidden_size=hid,
        direction=direction,
        **attrs,
    )
    inputs = [helper.make_tensor_value_info("x", 1, [steps, batch, n_in])]
    inputs.append(helper.make_tensor_value_info("c0", 1, [nd, batch, hid]))
    outputs = [helper.make_tensor_value_info(n, 1, None) for n in ("Y", "Y_h", "Y_c")]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"), (h0, "h0"))]
    graph = helper.make_graph([node], "lstm", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def _lstm_feeds(nd: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "x": rng.standard_normal((5, 2, 3)).astype(np.float32),
        "c0": rng.standard_normal((nd, 2, 4)).astype(np.float32),
    }


@pytest.mark.parametrize("schema", ["ge", "domi"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_as_dynamic_rnn(tmp_path: Path, direction: str, schema: str) -> None:
    model = _lstm(direction)
    graph, om, path = _write_read(tmp_path, model, schema)
    rnns = [op for op in om.ops if op.type == "DynamicRNN"]
    assert len(rnns) == (2 if direction == "bidirectional" else 1)
    consts = {op.name: op.value for op in om.ops if op.type == "Const" and op.value is not None}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    hid = 4
    for d, rnn in enumerate(rnns):
        want_dir = "REDIRECTIONAL" if direction == "reverse" or d == 1 else "UNIDIRECTIONAL"
        assert rnn.attrs["direction"].value == want_dir and rnn.attrs["gate_order"].value == "ijfo"
        assert len(rnn.outputs) == 8 and all(o.shape == (5, 2, hid) for o in rnn.outputs)
        w, b = consts[rnn.inputs[1].split(":")[0]], consts[rnn.inputs[2].split(":")[0]]
        # [x, h] · w + b, split as i, j(= ONNX c), f, o, equals ONNX's gates i, o, f, c
        xh = np.random.default_rng(d).standard_normal((3, 3 + hid)).astype(np.float32)
        ge = xh @ w + b
        onnx_gates = xh[:, :3] @ inits["W"][d].T + xh[:, 3:] @ inits["R"][d].T
        onnx_gates += inits["B"][d, : 4 * hid] + inits["B"][d, 4 * hid :]
        i, o, f, c = np.split(onnx_gates, 4, axis=1)
        np.testing.assert_allclose(ge, np.concatenate([i, c, f, o], axis=1), rtol=1e-5, atol=1e-5)
    _check_round_trip(graph, om, tmp_path / "m.onnx", _lstm_feeds(len(rnns)))
    if schema == "ge":
        _check_netron(path)


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({"clip": 1.0}, "clip=1.0: ONNX clips the gate pre-activations"),
        ({"input_forget": 1}, "input_forget=1"),
        (
            {"activations": ["Sigmoid", "Relu", "Tanh"]},
            r"activations .*\(DynamicRNN computes Sigmoid, Tanh, Tanh\)",
        ),
    ],
)
def test_lstm_refusals_name_the_reason(tmp_path: Path, attrs: dict[str, Any], reason: str) -> None:
    onnx.save(_lstm("forward", **attrs), tmp_path / "m.onnx")
    with pytest.raises(ConversionError, match=f"LSTM .*{reason}"):
        om_bytes(load_model(tmp_path / "m.onnx"))


def test_layer_norm_inv_std_dev_falls_back_to_the_decomposition(tmp_path: Path) -> None:
    """LayerNorm's third output is the variance, not ONNX's InvStdDev: the check refuses, decompose runs."""
    model = text_model(
        "l (float[2, 8] x) => (float[2, 8] y, float[2, 1] r) { y, m, r = LayerNormalization (x, g, b) }",
        opset=17,
        g=rand(8, seed=1),
        b=rand(8, seed=2),
    )
    onnx.save(model, tmp_path / "m.onnx")
    graph = load_model(tmp_path / "m.onnx")
    (node,) = [n for n in graph.ops() if n.op == "LayerNormalization"]
    assert (
        capabilities().reason(graph, node) == "InvStdDev is read (GE's LayerNorm gives the variance instead)"
    )
    PassManager([*pipeline("default"), *pipeline("legalize-cann")]).run(graph)
    _, om = read_om_graph(om_bytes(graph, CannOptions("ge")), "m.om")
    assert "LayerNorm" not in {op.type for op in om.ops}


def test_dynamic_rnn_cell_state_reads_are_refused(tmp_path: Path) -> None:
    """output_c holds the cell state of every step, which ONNX lacks: only its final step lifts."""
    _, om, _ = _write_read(tmp_path, _lstm("forward"), "ge")
    rnn = next(op for op in om.ops if op.type == "DynamicRNN")
    net = om.ops[-1]
    om.ops.insert(len(om.ops) - 1, OmOp("cell", "Relu", [f"{rnn.name}:2"], [rnn.outputs[2]]))
    net.inputs.append("cell:0")
    om.output_names.append("cell")
    with pytest.raises(ModelFileError, match="output_c .* read by 'cell'"):
        lift_graph(om, "m.om")


def _gru(direction: str, bias: bool = True, h0: bool = True, **attrs: Any) -> onnx.ModelProto:
    steps, batch, n_in, hid = 5, 2, 3, 4
    nd = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(13)
    w, r = (rng.standard_normal((nd, 3 * hid, n)).astype(np.float32) for n in (n_in, hid))
    b = rng.standard_normal((nd, 6 * hid)).astype(np.float32)
    attrs.setdefault("linear_before_reset", 1)
    node = helper.make_node(
        "GRU",
        ["x", "W", "R", "B" if bias else "", "", "h0" if h0 else ""],
        ["Y", "Y_h"],
        hidden_size=hid,
        direction=direction,
        **attrs,
    )
    inputs = [helper.make_tensor_value_info("x", 1, [steps, batch, n_in])]
    if h0:
        inputs.append(helper.make_tensor_value_info("h0", 1, [nd, batch, hid]))
    outputs = [helper.make_tensor_value_info(n, 1, None) for n in ("Y", "Y_h")]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"))]
    inits += [numpy_helper.from_array(b, "B")] if bias else []
    graph = helper.make_graph([node], "gru", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def _gru_feeds(nd: int, h0: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((5, 2, 3)).astype(np.float32)}
    if h0:
        feeds["h0"] = rng.standard_normal((nd, 2, 4)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("schema", ["ge", "domi"])
@pytest.mark.parametrize(
    ("direction", "bias", "h0"),
    [
        ("forward", True, True),
        ("reverse", True, True),
        ("bidirectional", True, True),
        ("forward", False, False),
        ("bidirectional", True, False),
    ],
)
def test_gru_as_dynamic_gru_v2(tmp_path: Path, direction: str, bias: bool, h0: bool, schema: str) -> None:
    """GRU (linear_before_reset=1) -> DynamicGRUV2 per direction: weight_input = Wᵀ, weight_hidden = Rᵀ
    in gate order zrh, bias_input = Wb, bias_hidden = Rb, init_h [B, H]; Y_h from output_h."""
    model = _gru(direction, bias, h0)
    graph, om, path = _write_read(tmp_path, model, schema)
    grus = [op for op in om.ops if op.type == "DynamicGRUV2"]
    nd = 2 if direction == "bidirectional" else 1
    assert len(grus) == nd and not any(op.type == "DynamicRNN" for op in om.ops)
    consts = {op.name: op.value for op in om.ops if op.type == "Const" and op.value is not None}
    descs = {f"{op.name}:{i}": d for op in om.ops for i, d in enumerate(op.outputs)}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    hid = 4
    for d, gru in enumerate(grus):
        want_dir = "REDIRECTIONAL" if direction == "reverse" or d == 1 else "UNIDIRECTIONAL"
        assert gru.attrs["direction"].value == want_dir and gru.attrs["gate_order"].value == "zrh"
        assert gru.attrs["reset_after"].value is True
        assert len(gru.outputs) == 6 and all(o.shape == (5, 2, hid) for o in gru.outputs)
        wi, wh = (consts[gru.inputs[k].split(":")[0]] for k in (1, 2))
        np.testing.assert_array_equal(wi, inits["W"][d].T)  # zrh is ONNX's own block order
        np.testing.assert_array_equal(wh, inits["R"][d].T)
        if bias:
            bi, bh = (consts[gru.inputs[k].split(":")[0]] for k in (3, 4))
            np.testing.assert_array_equal(np.concatenate([bi, bh]), inits["B"][d])
        else:
            assert all(r == "" for r in gru.inputs[3:5])
        if h0:
            assert descs[gru.inputs[6]].shape == (2, hid)  # init_h is [batch, hidden]
        else:
            assert len(gru.inputs) <= 5
    _check_round_trip(graph, om, tmp_path / "m.onnx", _gru_feeds(nd, h0))
    if schema == "ge":
        _check_netron(path)


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        (
            {"linear_before_reset": 0},
            r"linear_before_reset=0: DynamicGRUV2's kernel computes only reset_after=true",
        ),
        ({"clip": 2.0}, r"clip=2.0: DynamicGRUV2 has no gate clipping"),
        ({"activations": ["Sigmoid", "Relu"]}, r"activations .*\(DynamicGRUV2 computes Sigmoid, Tanh\)"),
    ],
)
def test_gru_refusals_name_the_reason(tmp_path: Path, attrs: dict[str, Any], reason: str) -> None:
    """What DynamicGRUV2 cannot express is refused (no GRU decomposition exists for CANN)."""
    onnx.save(_gru("forward", **attrs), tmp_path / "m.onnx")
    with pytest.raises(ConversionError, match=f"GRU .*{reason}"):
        om_bytes(load_model(tmp_path / "m.onnx"))


def test_dynamic_gru_v2_gate_order_rzh_lifts(tmp_path: Path) -> None:
    """A DynamicGRUV2 written in gate order rzh (the kernel's other order) lifts to the same GRU."""
    graph, om, _ = _write_read(tmp_path, _gru("forward"), "ge")
    gru = next(op for op in om.ops if op.type == "DynamicGRUV2")
    consts = {op.name: op for op in om.ops if op.type == "Const"}
    hid = 4
    swap = np.concatenate([np.arange(hid, 2 * hid), np.arange(hid), np.arange(2 * hid, 3 * hid)])
    for k in (1, 2, 3, 4):
        c = consts[gru.inputs[k].split(":")[0]]
        assert c.value is not None
        c.value = np.ascontiguousarray(c.value[..., swap])
    gru.attrs["gate_order"] = gru.attrs["gate_order"].__class__("s", "rzh")
    _check_round_trip(graph, om, tmp_path / "m.onnx", _gru_feeds(1))


def test_xor_as_logical_ops(tmp_path: Path) -> None:
    """GE has no LogicalXor: Xor(a, b) = LogicalAnd(LogicalOr(a, b), LogicalNot(LogicalAnd(a, b)))."""
    model = text_model(
        """
        x (float[2, 3, 4] x, float[3, 4] y) => (float[2, 3, 4] z) {
            a = Greater (x, zero)
            b = Less (y, zero)
            q = Xor (a, b)
            z = Cast <to = 1> (q)
        }
        """,
        opset=17,
        zero=np.zeros((), np.float32),
    )
    rng = np.random.default_rng(3)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in (("x", (2, 3, 4)), ("y", (3, 4)))}
    for schema in ("ge", "domi"):
        graph, om, path = _write_read(tmp_path, model, schema)
        types = collections.Counter(op.type for op in om.ops)
        assert (types["LogicalOr"], types["LogicalAnd"], types["LogicalNot"]) == (1, 2, 1), types
        assert not types["LogicalXor"] and not types["BitwiseXor"]
        _check_round_trip(graph, om, tmp_path / "m.onnx", feeds)
        if schema == "ge":
            _check_netron(path)


def test_xor_decomposition_does_not_fire_where_xor_is_native(tmp_path: Path) -> None:
    """MNN writes Xor as its own BinaryOp LOGICALXOR: the CANN rewrite must leave it alone there."""
    from backends.mnn.backend import BACKEND as MNN

    model = text_model(
        "x (bool[3, 4] a, bool[3, 4] b) => (bool[3, 4] q) { q = Xor (a, b) }",
        opset=17,
    )
    onnx.save(model, tmp_path / "m.onnx")
    graph = load_model(tmp_path / "m.onnx")
    PassManager([*pipeline("default"), *MNN.legalization("mnn", None)]).run(graph)
    assert [n.op for n in graph.ops()] == ["Xor"]
