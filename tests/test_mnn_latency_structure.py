"""Structure of Kiln's ``.mnn`` files that MNN's runtime pays for (issue 5, latency vs MNN's converter).

* ReLU after a float Add/Sub/Mul becomes the BinaryOp's fused ``activationType = 1`` (one op,
  as MNN's converter writes it), and is left alone where the sum is read elsewhere, is a graph
  output, or the op or the activation is not one it handles (Max, LeakyRelu).
* A Gemm after a global pool + Flatten reads the pooled [N, K, 1, 1] tensor in NC4HW4 directly
  (no NCHW round trip: two ConvertTensor and two Reshape ops fewer); a Flatten of a spatial map
  keeps the general Reshape + ConvertTensor form.
* Ops whose results nothing reads are dropped and the tensor table compacted, in order.
* The shared models' op counts stay at or below stated numbers (ConvertTensor copies, ReLU, Reshape).

Every file written here also runs in MNN (Winograd level 0) within max |MNN - ORT| / max |ORT| <= 1e-4
(small graphs) or the fp32 tolerance 1e-3 (shared models).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.mnn.lower.graph import drop_dead_ops, fuse_binary_relu
from backends.mnn.model import MnnNet, MnnOp, Table, TensorQuant
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.metrics import agreement
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from schemas.mnn.schema import fb
from tests.conftest import MODELS
from tests.helpers.mnn_convert import mnn_op_types

_rng = np.random.default_rng(11)
SHAPE = [1, 8, 6, 6]


def _r(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, list[int]],
    outputs: list[str],
    inits: dict[str, np.ndarray],
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _write_and_run(model: onnx.ModelProto, tmp_path: Path) -> tuple[list[str], Path]:
    """Kiln's fp32 .mnn of ``model`` (default pipeline): its op types; checks MNN against ORT."""
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    graph = load_model(src)
    PassManager(pipeline("default")).run(graph)
    path = tmp_path / "m.mnn"
    write_mnn(graph, path, MnnOptions(), "m")
    feeds = {i.name: _r(*[d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input}
    ref = run_onnxruntime(src, feeds)
    got = run_mnn(path, feeds)
    for name, want in ref.items():
        m = agreement(got[name].reshape(want.shape), want)
        assert m.max_rel <= 1e-4, f"{name}: max_rel {m.max_rel:.3g}"
    return mnn_op_types(path), path


def _binary_activations(path: Path) -> list[int]:
    net = fb.Net.GetRootAs(path.read_bytes(), 0)
    acts = []
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.Type() == fb.OpType.BinaryOp:
            p = fb.BinaryOp()
            t = op.Main()
            p.Init(t.Bytes, t.Pos)
            acts.append(p.ActivationType())
    return acts


# ------------------------------------------------------------------- BinaryOp + ReLU
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
def test_relu_fuses_into_binary_op(op: str, tmp_path: Path) -> None:
    model = _model(
        [helper.make_node(op, ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        {"a": SHAPE, "b": SHAPE},
        ["y"],
        {},
    )
    types, path = _write_and_run(model, tmp_path)
    assert "ReLU" not in types
    assert _binary_activations(path) == [1]


@pytest.mark.parametrize("case", ["sum_is_output", "sum_read_twice", "max", "leaky"])
def test_relu_fusion_must_not_fire(case: str, tmp_path: Path) -> None:
    op = "Max" if case == "max" else "Add"
    act = helper.make_node("LeakyRelu", ["s"], ["y"], alpha=0.1) if case == "leaky" else None
    nodes = [helper.make_node(op, ["a", "b"], ["s"]), act or helper.make_node("Relu", ["s"], ["y"])]
    outputs = ["y"]
    if case == "sum_is_output":
        outputs.append("s")
    if case == "sum_read_twice":
        nodes.append(helper.make_node("Sigmoid", ["s"], ["z"]))
        outputs.append("z")
    b = _r(*SHAPE) if case == "max" else None
    inits = {"b": b} if b is not None else {}
    inputs = {"a": SHAPE} if b is not None else {"a": SHAPE, "b": SHAPE}
    types, path = _write_and_run(_model(nodes, inputs, outputs, inits), tmp_path)
    assert types.count("ReLU") == 1
    assert _binary_activations(path) == [0]


# --------------------------------------------------------------- Gemm after a pool
def _classifier(spatial: int) -> onnx.ModelProto:
    k = 8 * spatial * spatial
    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1])]
    if spatial == 1:
        nodes.append(helper.make_node("GlobalAveragePool", ["c"], ["p"]))
    else:
        nodes.append(helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[3, 3]))
    nodes += [
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    inits = {"w": _r(8, 3, 3, 3) * 0.3, "cb": _r(8), "fw": _r(5, k) * 0.2, "fb": _r(5)}
    size = 6 if spatial == 2 else 5
    return _model(nodes, {"x": [1, 3, size, size]}, ["y"], inits)


def test_gemm_reads_pooled_tensor_in_nc4hw4(tmp_path: Path) -> None:
    types, _ = _write_and_run(_classifier(1), tmp_path)
    c = Counter(types)
    # input -> NC4HW4 and the FC's output -> NCHW only; one Reshape back to [1, 5]
    assert c["ConvertTensor"] == 2 and c["Reshape"] == 1, c


def test_gemm_after_spatial_flatten_keeps_general_form(tmp_path: Path) -> None:
    types, _ = _write_and_run(_classifier(2), tmp_path)
    c = Counter(types)
    assert c["ConvertTensor"] == 4 and c["Reshape"] == 3, c


# ------------------------------------------------------------------------ net passes
def _op(type_: str, name: str, ins: list[int], outs: list[int]) -> MnnOp:
    return MnnOp(type_, name, ins, outs, None)


def test_drop_dead_ops_compacts_tensors_in_order() -> None:
    relu = Table("Relu", {"slope": 0.0})
    net = MnnNet(
        ops=[
            _op("Input", "x", [], [0]),
            MnnOp("ReLU", "a", [0], [1], relu),
            MnnOp("ReLU", "dead", [1], [2], relu),
            MnnOp("ReLU", "dead2", [2], [3], relu),
            MnnOp("ReLU", "y", [1], [4], relu),
        ],
        tensor_names=["x", "a", "d", "d2", "y"],
        output_names=["y"],
        tensor_quant={4: TensorQuant(0.5)},
    )
    assert drop_dead_ops(net) == 2
    assert [op.name for op in net.ops] == ["x", "a", "y"]
    assert net.tensor_names == ["x", "a", "y"]
    assert [(op.inputs, op.outputs) for op in net.ops] == [([], [0]), ([0], [1]), ([1], [2])]
    assert net.tensor_quant == {2: TensorQuant(0.5)}
    # nothing left to drop: unchanged
    names = list(net.tensor_names)
    assert drop_dead_ops(net) == 0 and net.tensor_names == names


def test_fuse_binary_relu_keeps_integer_and_fused_ops() -> None:
    def binary(t: int, act: int) -> Table:
        return Table("BinaryOp", {"opType": fb.BinaryOpOperation.ADD, "T": t, "activationType": act})

    relu = Table("Relu", {"slope": 0.0})
    net = MnnNet(
        ops=[
            _op("Input", "a", [], [0]),
            MnnOp("BinaryOp", "int", [0, 0], [1], binary(fb.DataType.DT_INT32, 0)),
            MnnOp("ReLU", "r1", [1], [2], relu),
            MnnOp("BinaryOp", "done", [2, 2], [3], binary(fb.DataType.DT_FLOAT, 1)),
            MnnOp("ReLU", "r2", [3], [4], relu),
        ],
        tensor_names=["a", "i", "r1", "f", "y"],
        output_names=["y"],
    )
    assert fuse_binary_relu(net) == 0 and len(net.ops) == 5


# -------------------------------------------------------------------- shared models
SHAPES = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}
# upper bounds on Kiln's fp32 files (MNN's converter, same ONNX: ConvertTensor 3 / 3 / 13,
# Reshape 9 / 3 / 12, ReLU 0 / 0 / 0 - it permutes NC4HW4 heads directly, see the report)
LIMITS = {
    "ultraface_rfb320": {"ConvertTensor": 9, "ReLU": 0, "Reshape": 8},
    "ppocr_mobile_v2_cls": {"ConvertTensor": 2, "ReLU": 0, "Reshape": 1},
    "yunet_n_320": {"ConvertTensor": 13, "ReLU": 0, "Reshape": 12},
}


@pytest.mark.parametrize("stem", sorted(LIMITS))
def test_shared_model_op_counts(stem: str, tmp_path: Path) -> None:
    src = MODELS / f"{stem}.onnx"
    graph = load_model(src, input_shapes=SHAPES.get(stem))
    PassManager(pipeline("default")).run(graph)
    path = tmp_path / "model.mnn"
    write_mnn(graph, path, MnnOptions(), stem)
    c = Counter(mnn_op_types(path))
    for op, most in LIMITS[stem].items():
        assert c[op] <= most, f"{stem}: {c[op]} {op} ops > {most}"
    with np.load(MODELS / "data" / f"{stem}.npz") as z:
        feeds = {k: z[k] for k in z.files}
    ref = run_onnxruntime(src, feeds)
    got = run_mnn(path, feeds)
    for name, want in ref.items():
        m = agreement(got[name].reshape(want.shape), want)
        assert m.max_rel <= 1e-3, f"{stem}/{name}: max_rel {m.max_rel:.3g}"


# ------------------------------------------------------------------- op choices
def test_float_div_of_two_tensors_runs(tmp_path: Path) -> None:
    """a / b is BinaryOp REALDIV: MNN 3.6.1 fails to create a float DIV ("Create execution error")."""
    b = np.abs(_r(*SHAPE)) + 0.5
    model = _model([helper.make_node("Div", ["a", "b"], ["y"])], {"a": SHAPE}, ["y"], {"b": b})
    _write_and_run(model, tmp_path)
    net = fb.Net.GetRootAs((tmp_path / "m.mnn").read_bytes(), 0)
    kinds = []
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.Type() == fb.OpType.BinaryOp:
            p = fb.BinaryOp()
            p.Init(op.Main().Bytes, op.Main().Pos)
            kinds.append(p.OpType())
    assert kinds == [fb.BinaryOpOperation.REALDIV]


@pytest.mark.parametrize("channels", [1, 3])
def test_single_channel_conv_is_depthwise(channels: int, tmp_path: Path) -> None:
    """A 1 -> 1 channel conv is MNN's ConvolutionDepthwise (group == ic == oc); 3 -> 3 dense is not."""
    w = _r(channels, channels, 3, 3)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    model = _model([node], {"x": [1, channels, 6, 6]}, ["y"], {"w": w})
    types, _ = _write_and_run(model, tmp_path)
    want = "ConvolutionDepthwise" if channels == 1 else "Convolution"
    assert want in types and types.count("ConvolutionDepthwise") == (channels == 1)
