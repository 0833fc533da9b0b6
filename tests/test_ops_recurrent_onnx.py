"""RNN, GRU and LSTM: Kiln against onnxruntime and the onnx wheel's node tests.

Two paths per case (``check_parity``): import -> interpreter, and import -> export ->
onnxruntime. The references compute in float32 like onnxruntime; measured over these
cases the interpreter is within 3.3e-7 (max |d| / max(1, |ORT|)) of ORT, and
|d| <= 3e-7 + 1e-6 |ORT| holds elementwise (asserted: 5e-7 + 2e-6 |ORT|); float64
internals were farther from ORT (2.2e-6 against float32's 1.7e-6 on 20-step, hidden-16
runs), so float32 it is. The exported path runs ORT's own kernel: exactly ORT. The node tests' expected
outputs (the onnx reference, float32) are met within 1.2e-7.
onnxruntime refuses ``layout=1``: batch-major cases are checked against ORT on the
equivalent sequence-major model (inputs and outputs transposed), and the importer must
have rewritten them into Transposes around a layout-0 op.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from compiler.cli import main
from compiler.errors import ConversionError
from compiler.ir import run_graph
from compiler.ir.graph import Graph
from compiler.ir.types import DType, TensorType
from compiler.onnx_export import export_onnx, model_bytes
from compiler.ops.registry import Layout, get_op
from compiler.pass_infra import PassContext, parse_pipeline
from frontends.onnx import load_onnx
from passes.fold_constants import FoldConstants, fold_reason
from tests.helpers.conformance import ort_session
from tests.helpers.numerics import assert_close
from tests.helpers.ort_parity import check_parity, node_attrs, node_case, one_node_model
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

RTOL, ATOL = 2e-6, 5e-7
MEASURED_REL = 5e-7  # the worst max_rel (|d| / max(1, |ORT|)) either path may show
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DIRECTIONS = ["forward", "reverse", "bidirectional"]
OPSET_OF = {"forward": 9, "reverse": 14, "bidirectional": 21}


def _inputs(
    op: str,
    direction: str,
    *,
    lens: bool,
    init: bool,
    peep: bool = False,
    layout: int = 0,
    seq: int = 6,
    batch: int = 3,
    size: int = 5,
    hidden: int = 4,
    seed: int = 0,
) -> list[tuple[str, np.ndarray | None]]:
    """X, W, R, B, sequence_lens, initial_h[, initial_c, P] (None = omitted)."""
    rng = np.random.default_rng(seed)
    g, nd = GATES[op], 2 if direction == "bidirectional" else 1

    def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    x = f32(batch, seq, size) if layout else f32(seq, batch, size)
    state = (batch, nd, hidden) if layout else (nd, batch, hidden)
    sl = None
    if lens:
        sl = np.array([seq, 0, seq - 2][:batch], dtype=np.int32)  # full, empty, shorter
    ins: list[tuple[str, np.ndarray | None]] = [
        ("X", x),
        ("W", f32(nd, g * hidden, size, scale=0.5)),
        ("R", f32(nd, g * hidden, hidden, scale=0.5)),
        ("B", f32(nd, 2 * g * hidden, scale=0.5)),
        ("sequence_lens", sl),
        ("initial_h", f32(*state) if init else None),
    ]
    if op == "LSTM":
        ins += [("initial_c", f32(*state) if init else None), ("P", f32(nd, 3 * hidden) if peep else None)]
    return ins


def _model(
    op: str, ins: list[tuple[str, np.ndarray | None]], attrs: dict[str, Any], opset: int = 21
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    n_out = 3 if op == "LSTM" else 2
    return one_node_model(op, ins, attrs, opset=opset, num_outputs=n_out, initializers=["W", "R", "B", "P"])


def _parity(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    p = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    assert p.interpreter_rel <= MEASURED_REL and p.exported_rel <= MEASURED_REL


# ------------------------------------------------------------------ directions x sequence_lens x states
@pytest.mark.parametrize("init", [False, True])
@pytest.mark.parametrize("lens", [False, True])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_direction_lengths_and_states(op: str, direction: str, lens: bool, init: bool) -> None:
    ins = _inputs(op, direction, lens=lens, init=init)
    _parity(*_model(op, ins, {"hidden_size": 4, "direction": direction}, opset=OPSET_OF[direction]))


def test_sequence_lens_masks_outputs_and_keeps_last_valid_state() -> None:
    """Y is 0 past a row's length; Y_h is its state at the last valid step (0 for length 0)."""
    ins = _inputs("GRU", "bidirectional", lens=True, init=True)
    model, feeds = _model("GRU", ins, {"hidden_size": 4, "direction": "bidirectional"})
    g = load_onnx(model)
    out = run_graph(g, feeds)
    y, y_h = out["y0"], out["y1"]  # [seq, 2, batch, hidden], [2, batch, hidden]
    assert np.all(y[:, :, 1] == 0) and np.all(y_h[:, 1] == 0)  # length 0
    assert np.all(y[4:, :, 2] == 0) and np.any(y[:4, :, 2] != 0)  # length 4
    np.testing.assert_array_equal(y_h[0, 2], y[3, 0, 2])  # forward: after step 3
    np.testing.assert_array_equal(y_h[1, 2], y[0, 1, 2])  # reverse: after step 0


# ------------------------------------------------------------------ gates, peepholes, clip, activations
@pytest.mark.parametrize(
    "extra",
    [{}, {"clip": 0.4}, {"input_forget": 1}, {"clip": 0.4, "input_forget": 1}],
    ids=["peepholes", "clip", "input_forget", "clip_input_forget"],
)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_peepholes_clip(direction: str, extra: dict[str, Any]) -> None:
    ins = _inputs("LSTM", direction, lens=True, init=True, peep=True)
    ins[0] = ("X", np.asarray(ins[0][1]) * 3)  # pre-activations well past the clip
    _parity(*_model("LSTM", ins, {"hidden_size": 4, "direction": direction, **extra}))


@pytest.mark.parametrize("clip", [None, 0.5])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr: int, direction: str, clip: float | None) -> None:
    ins = _inputs("GRU", direction, lens=True, init=True, seed=3)
    attrs: dict[str, Any] = {"hidden_size": 4, "direction": direction, "linear_before_reset": lbr}
    if clip is not None:
        attrs["clip"] = clip
    _parity(*_model("GRU", ins, attrs))


ACTIVATION_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("LSTM", "forward", {"activations": ["Tanh", "Relu", "Sigmoid"]}),
    ("LSTM", "reverse", {"activations": ["Sigmoid", "Sigmoid", "Relu"]}),
    (
        "LSTM",
        "forward",
        {
            "activations": ["HardSigmoid", "LeakyRelu", "Softsign"],
            "activation_alpha": [0.3, 0.05],
            "activation_beta": [0.4],
        },
    ),
    (
        "LSTM",
        "bidirectional",
        {
            "activations": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Relu", "Elu"],
            "activation_alpha": [0.25, 0.7],
            "activation_beta": [0.45],
        },
    ),
    ("GRU", "forward", {"activations": ["Sigmoid", "Relu"]}),
    ("GRU", "bidirectional", {"activations": ["Sigmoid", "Softplus", "HardSigmoid", "Tanh"]}),
    ("RNN", "forward", {"activations": ["Relu"]}),
    ("RNN", "bidirectional", {"activations": ["Relu", "Tanh"]}),
    ("RNN", "forward", {"activations": ["Affine"], "activation_alpha": [0.6], "activation_beta": [0.1]}),
    ("RNN", "reverse", {"activations": ["ScaledTanh"], "activation_alpha": [1.5], "activation_beta": [0.7]}),
    ("RNN", "forward", {"activations": ["ThresholdedRelu"], "activation_alpha": [0.2]}),
    ("RNN", "forward", {"activations": ["LeakyRelu"]}),  # default alpha 0.01
]


@pytest.mark.parametrize(("op", "direction", "acts"), ACTIVATION_CASES)
def test_non_default_activations(op: str, direction: str, acts: dict[str, Any]) -> None:
    ins = _inputs(op, direction, lens=True, init=True, seed=5)
    model, feeds = _model(op, ins, {"hidden_size": 4, "direction": direction, **acts})
    _parity(model, feeds)
    got = node_attrs(export_onnx(load_onnx(model)), op)
    assert [s.decode() for s in got["activations"]] == acts["activations"]
    assert got.get("activation_alpha", []) == pytest.approx(acts.get("activation_alpha", []))


@pytest.mark.parametrize(
    ("act", "explicit"),
    [
        ("ThresholdedRelu", {"activation_alpha": (1.0,)}),
        ("Affine", {"activation_alpha": (1.0,), "activation_beta": (0.0,)}),
    ],
)
def test_omitted_alpha_beta_take_the_onnx_operator_defaults(act: str, explicit: dict[str, Any]) -> None:
    """The spec's defaults (ThresholdedRelu alpha 1, Affine 1 and 0), not onnxruntime's zeros."""
    ins = [x for _, x in _inputs("RNN", "forward", lens=False, init=True)]
    d = get_op("RNN")
    omitted = d.reference(ins, d.make_attrs({"hidden_size": 4, "activations": (act,)}), 2)
    given = d.reference(ins, d.make_attrs({"hidden_size": 4, "activations": (act,), **explicit}), 2)
    for a, b in zip(omitted, given, strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ layout=1 (batch-major)
def _seq_major(ins: list[tuple[str, np.ndarray | None]]) -> list[tuple[str, np.ndarray | None]]:
    out = list(ins)
    for i, (name, x) in enumerate(ins):
        if x is not None and name in ("X", "initial_h", "initial_c"):
            out[i] = (name, np.ascontiguousarray(x.transpose(1, 0, 2)))
    return out


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_layout_1_is_transposes_around_layout_0(op: str, direction: str) -> None:
    ins = _inputs(op, direction, lens=True, init=True, layout=1, peep=op == "LSTM")
    model, feeds = _model(op, ins, {"hidden_size": 4, "direction": direction, "layout": 1}, opset=14)
    ref_model, ref_feeds = _model(op, _seq_major(ins), {"hidden_size": 4, "direction": direction}, opset=14)
    want = ort_session(ref_model).run(None, ref_feeds)
    want = [w.transpose(2, 0, 1, 3) if i == 0 else w.transpose(1, 0, 2) for i, w in enumerate(want)]
    g = load_onnx(model)
    assert sorted(n.op for n in g.ops()) == sorted([op] + ["Transpose"] * (len(want) + 2 + (op == "LSTM")))
    assert next(n for n in g.ops() if n.op == op).attrs.layout == 0
    got = run_graph(g, feeds)
    exported = export_onnx(g)
    run = ort_session(model_bytes(exported)).run(None, feeds)
    for i, (v, w) in enumerate(zip(g.outputs, want, strict=True)):
        assert_close(got[v.name], w, rtol=RTOL, atol=ATOL, what=f"interpreter output {i}")
        assert_close(run[i], w, rtol=RTOL, atol=ATOL, what=f"exported output {i}")


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_layout_1_reference_equals_transposed_layout_0(op: str) -> None:
    """The op itself (not only the importer) implements layout=1."""
    ins = [x for _, x in _inputs(op, "bidirectional", lens=True, init=True, layout=1)]
    seq_ins = [x for _, x in _seq_major(_inputs(op, "bidirectional", lens=True, init=True, layout=1))]
    opdef = get_op(op)
    n = 3 if op == "LSTM" else 2
    a1 = opdef.make_attrs({"hidden_size": 4, "direction": "bidirectional", "layout": 1})
    a0 = opdef.make_attrs({"hidden_size": 4, "direction": "bidirectional"})
    got, want = opdef.reference(ins, a1, n), opdef.reference(seq_ins, a0, n)
    np.testing.assert_array_equal(got[0], want[0].transpose(2, 0, 1, 3))
    for g_, w in zip(got[1:], want[1:], strict=True):
        np.testing.assert_array_equal(g_, w.transpose(1, 0, 2))


# ------------------------------------------------------------------ the onnx wheel's node tests
NODE_CASES = [
    f"test_{c}"
    for c in (
        "gru_defaults",
        "gru_with_initial_bias",
        "gru_seq_length",
        "gru_reverse",
        "gru_bidirectional",
        "lstm_defaults",
        "lstm_with_initial_bias",
        "lstm_with_peepholes",
        "lstm_reverse",
        "lstm_bidirectional",
        "simple_rnn_defaults",
        "simple_rnn_with_initial_bias",
        "rnn_seq_length",
        "simple_rnn_reverse",
        "simple_rnn_bidirectional",
    )
]
BATCHWISE_CASES = ["test_gru_batchwise", "test_lstm_batchwise", "test_simple_rnn_batchwise"]
NODE_EXPECTED_RTOL, NODE_EXPECTED_ATOL = 1e-6, 2e-7


def _expected(name: str) -> list[np.ndarray]:
    from tests.helpers.ort_parity import _node_cases

    _, outs = _node_cases()[name].data_sets[0]
    return [np.asarray(onnx.numpy_helper.to_array(o) if isinstance(o, onnx.TensorProto) else o) for o in outs]


@pytest.mark.parametrize("name", NODE_CASES + BATCHWISE_CASES)
def test_onnx_node_case(name: str) -> None:
    model, feeds = node_case(name)
    want = _expected(name)
    if name not in BATCHWISE_CASES:
        _parity(model, feeds)
    g = load_onnx(model)
    got = run_graph(g, feeds)
    run = ort_session(model_bytes(export_onnx(g))).run(None, feeds)
    for i, (v, w) in enumerate(zip(g.outputs, want, strict=True)):
        assert_close(
            got[v.name], w, rtol=NODE_EXPECTED_RTOL, atol=NODE_EXPECTED_ATOL, what=f"interpreter {i}"
        )
        assert_close(run[i], w, rtol=NODE_EXPECTED_RTOL, atol=NODE_EXPECTED_ATOL, what=f"exported {i}")


# ------------------------------------------------------------------ import details and export form
def test_export_writes_attributes_empty_inputs_and_unread_outputs() -> None:
    """B absent -> "" input; only Y_h read -> outputs ["", Y_h]; attributes only where not default."""
    ins = _inputs("LSTM", "reverse", lens=True, init=False, peep=True)
    ins[3] = ("B", None)
    model, feeds = one_node_model(
        "LSTM",
        ins,
        {"hidden_size": 4, "direction": "reverse", "clip": 2.5},
        opset=9,
        num_outputs=2,
        initializers=["W", "R", "P"],
    )
    del model.graph.output[0]  # Y is produced but not read
    model.graph.node[0].output[0] = ""
    exported = export_onnx(load_onnx(model))
    onnx.checker.check_model(exported, full_check=True)
    node = next(n for n in exported.graph.node if n.op_type == "LSTM")
    assert list(node.input)[3:5] == ["", "sequence_lens"] and list(node.input)[5:7] == ["", ""]
    assert list(node.output) == ["", "y1"]
    assert node_attrs(exported, "LSTM") == {
        "clip": pytest.approx(2.5),
        "direction": b"reverse",
        "hidden_size": 4,
    }
    want = ort_session(model).run(None, feeds)
    got = ort_session(model_bytes(exported)).run(None, feeds)
    assert_close(got[0], want[0], rtol=0, atol=0, what="Y_h")


def test_all_three_lstm_outputs_keep_their_names() -> None:
    model, feeds = _model(
        "LSTM",
        _inputs("LSTM", "bidirectional", lens=False, init=True),
        {"hidden_size": 4, "direction": "bidirectional"},
    )
    node = next(n for n in export_onnx(load_onnx(model)).graph.node if n.op_type == "LSTM")
    assert list(node.output) == ["y0", "y1", "y2"]


def test_missing_hidden_size_is_read_from_r() -> None:
    """ORT requires hidden_size; Kiln reads it from R and exports it."""
    ins = _inputs("GRU", "forward", lens=False, init=False, hidden=6)
    model, feeds = _model("GRU", ins, {})
    g = load_onnx(model)
    assert next(n for n in g.ops() if n.op == "GRU").attrs.hidden_size == 6
    want = ort_session(_model("GRU", ins, {"hidden_size": 6})[0]).run(None, feeds)
    run = ort_session(model_bytes(export_onnx(g))).run(None, feeds)
    got = run_graph(g, feeds)
    for i, (v, w) in enumerate(zip(g.outputs, want, strict=True)):
        assert_close(got[v.name], w, rtol=RTOL, atol=ATOL, what=f"interpreter {i}")
        assert_close(run[i], w, rtol=0, atol=0, what=f"exported {i}")


@pytest.mark.parametrize(
    ("attrs", "opset", "match"),
    [
        ({"hidden_size": 4, "activations": ["Swish"]}, 21, "unknown activation"),
        ({"hidden_size": 4, "activations": ["Sigmoid", "Tanh"]}, 21, "2 activations"),
        ({"hidden_size": 4, "direction": "sideways"}, 21, "direction must be"),
        ({"hidden_size": 5}, 21, "expected dim 1 = 20"),
        ({"hidden_size": 4, "layout": 1}, 9, "layout needs opset 14"),
    ],
)
def test_refused_forms_name_the_node(attrs: dict[str, Any], opset: int, match: str) -> None:
    model, _ = _model("LSTM", _inputs("LSTM", "forward", lens=False, init=False), attrs, opset=opset)
    with pytest.raises(ConversionError, match=match):
        load_onnx(model)


# ------------------------------------------------------------------ passes
def _lstm_graph(x_const: bool) -> Graph:
    ins = [np.asarray(x) for _, x in _inputs("LSTM", "forward", lens=False, init=False, seq=3, batch=1)[:4]]
    g = Graph("lstm")
    x = g.add_constant(ins[0], "x") if x_const else g.add_input("x", TensorType(DType.FLOAT32, ins[0].shape))
    vals = [x] + [g.add_constant(a, n) for a, n in zip(ins[1:], "WRB", strict=True)]
    node = g.add_node("LSTM", vals, {"hidden_size": 4}, num_outputs=3)
    g.set_outputs(g.outputs_of(node)[1:2])
    return g


def test_fold_constants_folds_only_all_constant_recurrences() -> None:
    g = _lstm_graph(x_const=False)
    node = next(n for n in g.ops() if n.op == "LSTM")
    assert fold_reason(g, node, 1 << 22, 4.0) == "an input is not constant"
    assert not FoldConstants().run(g, PassContext()).changed
    g2 = _lstm_graph(x_const=True)
    want = run_graph(g2, {})
    res = FoldConstants().run(g2, PassContext())
    assert res.changed and not any(n.op == "LSTM" for n in g2.ops())
    assert not FoldConstants().run(g2, PassContext()).changed  # idempotent
    assert_close(run_graph(g2, {})[g2.output_names[0]], want[g2.output_names[0]], rtol=0, atol=0)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_registry_flags(op: str) -> None:
    d = get_op(op)
    assert (
        d.layout is Layout.FIXED and d.pure and d.deterministic and d.outputs == (0, 1 + (op == "LSTM") + 1)
    )


# ------------------------------------------------------------------ zoo
ZOO_BAR = 1e-5


@pytest.mark.parametrize("name", ["crnn", "lstm_text"])
def test_zoo_recurrent_models_compile_and_verify(name: str, zoo: ZooCache, tmp_path: Path) -> None:  # noqa: F811
    m = zoo.get(name)
    out = tmp_path / "out"
    assert main(["compile", str(m.model), "-o", str(out), "--emit", "onnx", "--inputs", str(m.inputs)]) == 0
    ver = json.loads((out / "manifest.json").read_text())["verification"]
    worst = max(o["max_rel"] for a in ver["artifacts"] for o in a["outputs"])
    assert worst <= ZOO_BAR, worst


def test_choose_layout_leaves_the_recurrences_of_crnn_alone(zoo: ZooCache) -> None:  # noqa: F811
    """CRNN: blocked convs feed the LSTMs through Squeeze/Transpose, which read plain NCHW (FIXED)."""
    m = zoo.get("crnn")
    feeds = dict(np.load(m.inputs))
    g = load_onnx(onnx.load(str(m.model)))
    want = run_graph(g, feeds)
    lstms = [
        (n.name, n.attrs, [v.name for v in g.inputs_of(n) if v is not None])
        for n in g.ops()
        if n.op == "LSTM"
    ]
    text = "fold-batchnorm,fold-constants,fuse-conv-bias-act,choose-layout{lanes=8},eliminate-dead-nodes"
    for p in parse_pipeline(text):
        p.run(g, PassContext())
    assert any(n.op == "LayoutTransform" for n in g.ops())
    after = [
        (n.name, n.attrs, [v.name for v in g.inputs_of(n) if v is not None])
        for n in g.ops()
        if n.op == "LSTM"
    ]
    assert after == lstms
    got = run_graph(g, feeds)
    for k, w in want.items():
        assert_close(got[k], w, rtol=1e-5, atol=1e-6, what=k)  # only the convs' summation order moved
