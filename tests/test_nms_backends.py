"""NonMaxSuppression on MNN (native NonMaxSuppressionV2 per batch and class) and CANN (NonMaxSuppressionV6).

MNN: the ``.mnn`` runs in MNN's runtime and its selected indices equal onnxruntime's exactly (integers,
tolerance 0), on the ONNX node tests (their thresholds made constants) and on random two-batch,
three-class graphs in both box encodings; the file holds, and MNN's per-op callback runs, one
NonMaxSuppressionV2 per (batch, class). CANN: the ``.om`` in both schemas passes the strict reader and
lifts back to a graph whose onnxruntime selection equals the original's exactly; Netron loads the ge
file with every op visible. What stays refused (a computed threshold, MNN/CANN limits) is one line
naming the node and the reason, for every requested backend at once.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.cann.emit import om_bytes
from backends.cann.lower import capabilities
from backends.cann.options import CannOptions
from backends.mnn.lower.table import TABLE as MNN_TABLE
from backends.mnn.runtime import run_mnn
from compiler.api import load_model
from compiler.cli import main as kiln
from compiler.onnx_export import export_onnx, model_bytes
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from frontends.cann.lift import lift_graph
from frontends.cann.loader import read_om_graph
from tests.helpers.cann import ge_consts, netron_check
from tests.helpers.mnn_callback import executed_ops
from tests.helpers.mnn_convert import mnn_op_types
from tests.helpers.ort_parity import node_case

B, C, N = 2, 3, 24
NODE_CASES = [
    "test_nonmaxsuppression_center_point_box_format",
    "test_nonmaxsuppression_flipped_coordinates",
    "test_nonmaxsuppression_iou_threshold_boundary",
    "test_nonmaxsuppression_limit_output_size",
    "test_nonmaxsuppression_suppress_by_IOU_and_scores",
    "test_nonmaxsuppression_two_batches",
    "test_nonmaxsuppression_two_classes",
]


def _nms_model(
    center: int, max_out: int, iou: float | None, score: float | None, n: int = N
) -> onnx.ModelProto:
    """boxes [B, n, 4], scores [B, C, n] -> NonMaxSuppression with constant operands (None: absent)."""
    inits = [numpy_helper.from_array(np.array([max_out], np.int64), "max_out")]
    ins = ["boxes", "scores", "max_out", "", ""]
    if iou is not None:
        inits.append(numpy_helper.from_array(np.array([iou], np.float32), "iou"))
        ins[3] = "iou"
    if score is not None:
        inits.append(numpy_helper.from_array(np.array([score], np.float32), "score"))
        ins[4] = "score"
    while not ins[-1]:
        ins.pop()
    node = helper.make_node("NonMaxSuppression", ins, ["sel"], name="sel", center_point_box=center)
    graph = helper.make_graph(
        [node],
        "nms",
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [B, n, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [B, C, n]),
        ],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


def _feeds(center: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Overlapping boxes (a third with swapped corners) and distinct scores (MNN breaks ties otherwise)."""
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 8, (B, N, 2))
    wh = rng.uniform(1, 5, (B, N, 2))
    if center:
        boxes = np.concatenate([xy, wh], -1)
    else:
        a, c = xy[..., ::-1], xy[..., ::-1] + wh[..., ::-1]
        flip = rng.random((B, N, 1)) < 0.3
        boxes = np.where(flip, np.concatenate([c, a], -1), np.concatenate([a, c], -1))
    scores = (rng.permutation(B * C * N).reshape(B, C, N) + 0.5) / (B * C * N)
    return {"boxes": boxes.astype(np.float32), "scores": scores.astype(np.float32)}


def _compile(tmp_path: Path, model: onnx.ModelProto, feeds: dict[str, np.ndarray], emit: str) -> int:
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", **feeds)  # type: ignore[arg-type]
    return kiln(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"), "--emit", emit,
                 "--inputs", str(tmp_path / "in.npz")])  # fmt: skip


def _assert_mnn_exact(tmp_path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    ref = run_onnxruntime(tmp_path / "m.onnx", feeds)["sel"]
    got = run_mnn(tmp_path / "out" / "model.mnn", feeds)["sel"]
    assert got.shape == ref.shape and np.array_equal(got, ref), f"MNN {got.tolist()} != ORT {ref.tolist()}"
    return ref


@pytest.mark.parametrize(
    ("center", "max_out", "iou", "score"), [(0, 4, 0.5, 0.2), (1, 50, 0.3, None)], ids=["corners", "center"]
)
def test_nms_mnn_and_cann_random(
    tmp_path: Path, center: int, max_out: int, iou: float, score: float | None
) -> None:
    feeds = _feeds(center)
    if score is None:
        feeds["scores"] -= np.float32(2)  # logit-like: without a threshold negative scores count too
    assert _compile(tmp_path, _nms_model(center, max_out, iou, score), feeds, "mnn,cann") == 0
    ref = _assert_mnn_exact(tmp_path, feeds)
    s = feeds["scores"]
    top = {(b, c, int(i)) for b in range(B) for c in range(C) for i in np.argsort(-s[b, c])[:max_out]
           if score is None or s[b, c, i] > score}  # fmt: skip
    assert len(ref) and {tuple(r) for r in ref.tolist()} != top  # IoU suppression changed the selection
    types = collections.Counter(mnn_op_types(tmp_path / "out" / "model.mnn"))
    assert types["NonMaxSuppressionV2"] == B * C and types["Where"] == 1 and types["GatherND"] == 1
    assert types["MatMul"] == (B if center else 0)  # center boxes -> corners, once per batch
    ran = collections.Counter(t for t, _ in executed_ops(tmp_path / "out" / "model.mnn", feeds))
    assert ran["NonMaxSuppressionV2"] == B * C
    (res,) = netron_check([tmp_path / "out" / "model.om"])
    assert res["accepted"] and not res["problems"], res.get("error")
    model, _ = ge_consts(tmp_path / "out" / "model.om")
    want = [(op.name, op.type) for op in model.graph[0].op if op.type != "Const"]
    assert [(nd["name"], nd["type"]) for nd in res["graphs"][0]["nodes"]] == want
    assert [t for _, t in want] == ["Data", "Data", "NonMaxSuppressionV6", "Cast", "NetOutput"]


@pytest.mark.parametrize("name", NODE_CASES)
def test_nms_mnn_onnx_node_cases(tmp_path: Path, name: str) -> None:
    model, feeds = node_case(name)
    for vi in [vi for vi in model.graph.input if vi.name not in ("boxes", "scores")]:
        model.graph.initializer.append(numpy_helper.from_array(feeds.pop(vi.name), vi.name))
        model.graph.input.remove(vi)
    model.graph.node[0].name = "sel"
    model.graph.node[0].output[0] = model.graph.output[0].name = "sel"
    assert _compile(tmp_path, model, feeds, "mnn,cann") == 0
    _assert_mnn_exact(tmp_path, feeds)


@pytest.mark.parametrize("schema", ["ge", "domi"])
def test_nms_cann_round_trip(tmp_path: Path, schema: str) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_nms_model(0, 4, 0.5, 0.2), src)
    graph = load_model(src)
    PassManager([*pipeline("default"), *pipeline("legalize-cann")]).run(graph)
    data = om_bytes(graph, CannOptions(schema))
    assert data == om_bytes(graph, CannOptions(schema)), "not deterministic"
    detected, om = read_om_graph(data, "m.om")  # the strict reader
    assert detected == schema
    (v6,) = [op for op in om.ops if op.type == "NonMaxSuppressionV6"]
    ops = om.op_map()
    consts = [np.asarray(ops[r.rsplit(":", 1)[0]].value) for r in v6.inputs[2:]]
    m = B * C * 4
    assert v6.attrs["center_point_box"].value == 0 and v6.attrs["max_boxes_size"].value == m
    assert [(d.dtype.short, d.shape) for d in v6.outputs] == [("i32", (m, 3))]
    assert [c.dtype for c in consts] == [np.int32, np.float32, np.float32]
    assert [float(c[0]) for c in consts] == [4.0, 0.5, np.float32(0.2)]
    feeds = _feeds(0, seed=3)
    got = run_onnxruntime(model_bytes(export_onnx(lift_graph(om, "m.om"))), feeds)["sel"]
    ref = run_onnxruntime(src, feeds)["sel"]
    assert got.dtype == np.int64 and np.array_equal(got, ref), "the round trip is not exact"


def test_nms_computed_threshold_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _nms_model(0, 4, None, 0.2)
    model.graph.node[0].input[3] = "iou"
    model.graph.input.append(helper.make_tensor_value_info("iou", TensorProto.FLOAT, [1]))
    feeds = {**_feeds(0), "iou": np.array([0.5], np.float32)}
    assert _compile(tmp_path, model, feeds, "mnn,cann") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not (tmp_path / "out").exists()
    assert "mnn: NonMaxSuppression (node 'sel'): iou_threshold is computed" in err
    assert "cann: NonMaxSuppression (node 'sel'): iou_threshold is computed" in err


def test_nms_checks_fire_only_on_what_the_formats_lack(tmp_path: Path) -> None:
    def reasons(model: onnx.ModelProto) -> tuple[str | None, str | None]:
        onnx.save(model, tmp_path / "c.onnx")
        g = load_model(tmp_path / "c.onnx")
        (node,) = [n for n in g.nodes() if n.op == "NonMaxSuppression"]
        return MNN_TABLE.reason(g, node), capabilities().reason(g, node)

    assert reasons(_nms_model(1, 10**12, None, None)) == (None, None)  # must not fire: K = N
    none = "max_output_boxes_per_class is absent or 0 (selects nothing)"
    assert reasons(_nms_model(0, 0, 0.5, None)) == (none, none)
    mnn, cann = reasons(_nms_model(0, 800, 0.5, None, n=800))
    assert mnn is None and cann == "800 boxes per class exceed NonMaxSuppressionV6's limit 700"
    mnn, cann = reasons(_nms_model(0, 4, 1.5, None))
    assert mnn is not None and "outside [0, 1]" in mnn and cann is not None and "outside [0, 1]" in cann
