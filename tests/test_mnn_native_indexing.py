"""TopK, ArgMax / ArgMin, Tile, GatherElements, GatherND, CumSum and OneHot as MNN's own kernels.

Each small graph goes through Kiln's default pipeline and the MNN legalization, is written as
``.mnn`` and runs in MNN 3.6.1's runtime: integer outputs (indices) must equal onnxruntime
exactly, float outputs within 1e-6 relative (the gathers and tiles are exact copies). The file
holds MNN's op (no decomposition), negative indices are wrapped, and the refusals say why.
A TopK whose indices are read and a GatherND with batch_dims > 0 go through the shared
decompositions (topk-stable-indices, gathernd-batch) and must match onnxruntime exactly too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper as nh

from backends.mnn.backend import BACKEND
from backends.mnn.lower.table import TABLE
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.ir.graph import Graph
from compiler.metrics import agreement
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from tests.helpers.mnn_convert import mnn_op_types

FLOAT_MAX_REL = 1e-6
_rng = np.random.default_rng(11)


def _model(
    node: onnx.NodeProto,
    ins: Mapping[str, tuple[int, list[int]]],
    inits: Mapping[str, np.ndarray],
    outs: Mapping[str, int],
) -> onnx.ModelProto:
    vis = [oh.make_tensor_value_info(n, t, s) for n, (t, s) in ins.items()]
    ovs = [oh.make_tensor_value_info(n, t, None) for n, t in outs.items()]
    graph = oh.make_graph([node], "g", vis, ovs, [nh.from_array(a, n) for n, a in inits.items()])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _graph(model: onnx.ModelProto, tmp_path: Path, legalize: bool = True) -> tuple[Graph, Path]:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    legal = BACKEND.legalization("mnn", None) if legalize else []
    PassManager([*pipeline("default"), *legal]).run(graph)
    return graph, path


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], mnn_op: str, tmp_path: Path) -> list[str]:
    graph, path = _graph(model, tmp_path)
    mnn = write_mnn(graph, tmp_path / "m.mnn", MnnOptions())[-1]
    got, ref = run_mnn(mnn, feeds), run_onnxruntime(path, feeds)
    assert sorted(got) == sorted(ref)
    for k, r in ref.items():
        assert got[k].shape == r.shape, k
        if r.dtype.kind == "f":
            assert agreement(got[k], r).max_rel <= FLOAT_MAX_REL, k
        else:
            assert np.array_equal(got[k], r), k
    types = mnn_op_types(mnn)
    assert types.count(mnn_op) == 1, types
    return types


_X = {"x": (T.FLOAT, [3, 4, 5])}


def _x() -> dict[str, np.ndarray]:
    # distinct values except one deliberate tie per row of the last axis
    x = _rng.permutation(60).reshape(3, 4, 5).astype(np.float32) - 30
    x[..., 3] = x[..., 1]
    return {"x": x}


@pytest.mark.parametrize(("axis", "largest", "k"), [(-1, 1, 3), (1, 0, 2), (0, 1, 3)])
def test_topk(axis: int, largest: int, k: int, tmp_path: Path) -> None:
    """The values alone: one TopKV2, the index decomposition must not fire."""
    node = oh.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    model = _model(node, _X, {"k": np.array([k], np.int64)}, {"v": T.FLOAT})
    feeds = {"x": np.round(_x()["x"] / 8)}  # many ties
    types = _check(model, feeds, "TopKV2", tmp_path)
    assert "CumSum" not in types and "ArgMax" not in types


@pytest.mark.parametrize(
    ("shape", "axis", "largest", "k"),
    [
        ([3, 4, 5], -1, 1, 3),
        ([3, 4, 5], 1, 0, 2),
        ([3, 4, 5], 0, 1, 3),
        ([2, 40], 1, 0, 10),
        ([4, 7, 9], 1, 1, 7),
    ],
)
def test_topk_indices_in_onnx_tie_order(
    shape: list[int], axis: int, largest: int, k: int, tmp_path: Path
) -> None:
    """Indices read: MNN's TopKV2 ties are arbitrary (observed), so topk-stable-indices counts
    occurrences; values and indices equal onnxruntime's exactly, ties and infinities included."""
    node = oh.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    model = _model(
        node, {"x": (T.FLOAT, shape)}, {"k": np.array([k], np.int64)}, {"v": T.FLOAT, "i": T.INT64}
    )
    x = _rng.integers(-4, 4, shape).astype(np.float32) * 0.75  # ties everywhere, both signs
    x[x == 2.25], x[x == -3] = np.inf, -np.inf
    types = _check(model, {"x": x}, "TopKV2", tmp_path)
    assert types.count("CumSum") == 1 and types.count("ArgMax") == 1


def test_topk_indices_of_integers(tmp_path: Path) -> None:
    """int64 values (MNN int32): the same occurrence count, exact."""
    node = oh.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0)
    model = _model(
        node, {"x": (T.INT64, [3, 4, 5])}, {"k": np.array([2], np.int64)}, {"v": T.INT64, "i": T.INT64}
    )
    _check(model, {"x": _rng.integers(-3, 3, (3, 4, 5)).astype(np.int64)}, "TopKV2", tmp_path)


@pytest.mark.parametrize(("op", "axis", "keepdims"), [("ArgMax", -1, 1), ("ArgMin", 1, 0), ("ArgMax", 0, 0)])
def test_arg_reduce(op: str, axis: int, keepdims: int, tmp_path: Path) -> None:
    model = _model(oh.make_node(op, ["x"], ["i"], axis=axis, keepdims=keepdims), _X, {}, {"i": T.INT64})
    x = np.round(_x()["x"] / 8)  # ties: ONNX and MNN both take the first extremum
    types = _check(model, {"x": x}, op, tmp_path)
    assert types.count("Reshape") == keepdims


@pytest.mark.parametrize("dtype", [T.FLOAT, T.INT64])
def test_tile(dtype: int, tmp_path: Path) -> None:
    node = oh.make_node("Tile", ["x", "r"], ["y"])
    model = _model(node, {"x": (dtype, [2, 3])}, {"r": np.array([3, 2], np.int64)}, {"y": dtype})
    x = _rng.standard_normal((2, 3)) * 10
    _check(model, {"x": x.astype(np.float32 if dtype == T.FLOAT else np.int64)}, "Tile", tmp_path)


_GE_IDX = np.array([[[0, -1, 2], [3, -4, 1]]], np.int64)  # [1, 2, 3], indexes axis 1 of [1, 4, 3]


@pytest.mark.parametrize("const_indices", [True, False])
def test_gather_elements(const_indices: bool, tmp_path: Path) -> None:
    node = oh.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    ins = {"x": (T.FLOAT, [1, 4, 3])}
    feeds: dict[str, np.ndarray] = {"x": _rng.standard_normal((1, 4, 3)).astype(np.float32)}
    inits = {"i": _GE_IDX} if const_indices else {}
    if not const_indices:
        ins["i"] = (T.INT64, list(_GE_IDX.shape))
        feeds["i"] = _GE_IDX
    types = _check(_model(node, ins, inits, {"y": T.FLOAT}), feeds, "GatherElements", tmp_path)
    assert types.count("BinaryOp") == (0 if const_indices else 3)  # the wrap of negative indices


_ND_IDX = np.array([[0, -1], [2, 1], [-3, 0]], np.int64)  # rows of [3, 4, 5]


@pytest.mark.parametrize("const_indices", [True, False])
def test_gather_nd(const_indices: bool, tmp_path: Path) -> None:
    node = oh.make_node("GatherND", ["x", "i"], ["y"])
    ins, feeds = dict(_X), _x()
    inits = {"i": _ND_IDX} if const_indices else {}
    if not const_indices:
        ins["i"] = (T.INT64, list(_ND_IDX.shape))
        feeds["i"] = _ND_IDX
    types = _check(_model(node, ins, inits, {"y": T.FLOAT}), feeds, "GatherND", tmp_path)
    assert "Concat" not in types  # batch_dims = 0: gathernd-batch must not fire


@pytest.mark.parametrize(
    ("dshape", "ishape", "batch_dims", "const_indices"),
    [
        ([2, 3, 4], [2, 1], 1, True),
        ([2, 3, 4], [2, 1], 1, False),
        ([2, 3, 4, 5], [2, 3, 2], 1, False),  # MNN's own converter gets this one wrong
        ([2, 3, 4, 5], [2, 3, 1], 2, False),
        ([2, 3, 4, 5], [2, 3, 4, 2], 2, True),
        ([3, 4], [3, 2, 1], 1, False),
    ],
)
def test_gather_nd_batch_dims(
    dshape: list[int], ishape: list[int], batch_dims: int, const_indices: bool, tmp_path: Path
) -> None:
    """batch_dims > 0 as gathernd-batch: one GatherND of the flattened data with a batch column;
    negative indices included, exact."""
    m = ishape[-1]
    cols = [_rng.integers(-dshape[batch_dims + j], dshape[batch_dims + j], ishape[:-1]) for j in range(m)]
    idx = np.stack(cols, -1).astype(np.int64)
    node = oh.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    ins = {"x": (T.FLOAT, dshape)}
    feeds: dict[str, np.ndarray] = {"x": _rng.standard_normal(dshape).astype(np.float32)}
    inits = {"i": idx} if const_indices else {}
    if not const_indices:
        ins["i"] = (T.INT64, ishape)
        feeds["i"] = idx
    types = _check(_model(node, ins, inits, {"y": T.FLOAT}), feeds, "GatherND", tmp_path)
    assert types.count("Concat") == (0 if const_indices else 1)
    assert types.count("Reshape") == (0 if batch_dims == 1 else 2 + (not const_indices))


@pytest.mark.parametrize(("axis", "exclusive", "reverse"), [(1, 0, 0), (-1, 1, 1), (0, 1, 0), (2, 0, 1)])
def test_cumsum(axis: int, exclusive: int, reverse: int, tmp_path: Path) -> None:
    node = oh.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
    model = _model(node, _X, {"a": np.array(axis, np.int64)}, {"y": T.FLOAT})
    _check(model, {"x": (_rng.integers(-8, 8, (3, 4, 5)) * 0.25).astype(np.float32)}, "CumSum", tmp_path)


@pytest.mark.parametrize(
    ("axis", "vals"), [(-1, np.array([0.0, 1.0], np.float32)), (0, np.array([-2, 5], np.int64))]
)
def test_onehot(axis: int, vals: np.ndarray, tmp_path: Path) -> None:
    idx = np.array([[0, 3, -1], [-4, 2, 1]], np.int64)  # depth 4: -1 and -4 wrap
    node = oh.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis)
    out = T.FLOAT if vals.dtype == np.float32 else T.INT64
    model = _model(node, {"i": (T.INT64, [2, 3])}, {"d": np.array(4, np.int64), "v": vals}, {"y": out})
    types = _check(model, {"i": idx}, "OneHot", tmp_path)
    assert types.count("BinaryOp") == 3


@pytest.mark.parametrize(
    ("node", "ins", "reason"),
    [
        (
            oh.make_node("ArgMax", ["x"], ["i"], axis=1, select_last_index=1),
            {"x": (T.FLOAT, [2, 3])},
            "select_last_index=1 (MNN returns the first extremum)",
        ),
        (
            oh.make_node("GatherND", ["x", "j"], ["i"], batch_dims=1),
            {"x": (T.FLOAT, [2, 3]), "j": (T.INT64, [2, 1])},
            "batch_dims != 0 (MNN's GatherND has none; see gathernd-batch)",
        ),
        (
            oh.make_node("TopK", ["x", "k"], ["v", "i"]),
            {"x": (T.FLOAT, [2, 3])},
            "the indices output (MNN 3.6.1's TopKV2 orders ties arbitrarily; see topk-stable-indices)",
        ),
        (
            oh.make_node("CumSum", ["x", "j"], ["i"]),
            {"x": (T.FLOAT, [2, 3]), "j": (T.INT32, [])},
            "axis must be constant",
        ),
    ],
)
def test_refusals(
    node: onnx.NodeProto, ins: Mapping[str, tuple[int, list[int]]], reason: str, tmp_path: Path
) -> None:
    outs = {o: T.FLOAT for o in node.output}
    inits = {"k": np.array([2], np.int64)} if node.op_type == "TopK" else {}
    graph, _ = _graph(_model(node, ins, inits, outs), tmp_path, legalize=False)
    (n,) = [n for n in graph.ops() if n.op == node.op_type]
    assert TABLE.reason(graph, n) == reason


def test_topk_index_rewrite_refuses_a_huge_table(tmp_path: Path) -> None:
    """topk-stable-indices needs k x n intermediates: above TABLE_CAP elements it refuses, by name."""
    from compiler.backend import get_backend
    from passes.decompositions import choose_decomposition
    from passes.decompositions.indexing import TABLE_CAP

    node = oh.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    model = _model(
        node, {"x": (T.FLOAT, [2, 4096])}, {"k": np.array([4096], np.int64)}, {"v": T.FLOAT, "i": T.INT64}
    )
    graph, _ = _graph(model, tmp_path, legalize=False)
    (n,) = [n for n in graph.ops() if n.op == "TopK"]
    why = choose_decomposition(get_backend("mnn").capabilities("mnn"), graph, n)
    assert (
        why
        == f"topk-stable-indices: the k x n occurrence table would hold {2 * 4096 * 4096} elements (cap {TABLE_CAP})"
    )
