"""Comparisons, logic, Mod, IsNaN and Where as MNN's own BinaryOp / Select kernels.

Each small graph goes through Kiln's default pipeline and the MNN legalization, is written as
``.mnn``, runs in MNN 3.6.1's runtime and must equal onnxruntime exactly (bool outputs come
back from MNN as int32 0 / 1). MNN's per-op callback shows that the op runs as itself. The
refusals name their reason, and one graph goes through ``kiln compile --emit mnn`` end to end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from backends.mnn.backend import BACKEND
from backends.mnn.lower.table import TABLE
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.cli import main as kiln
from compiler.ir.graph import Graph
from compiler.onnx_export import export_onnx, model_bytes
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from frontends.mnn.loader import load_mnn
from tests.helpers.mnn_callback import executed_ops
from tests.helpers.mnn_convert import mnn_op_types

_NP: dict[int, type] = {T.FLOAT: np.float32, T.INT64: np.int64, T.INT32: np.int32, T.BOOL: np.bool_}


def _model(
    op: str, in_types: list[int], shapes: list[list[int]], out_type: int, **attrs: Any
) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(len(in_types))]
    ins = [oh.make_tensor_value_info(n, t, s) for n, t, s in zip(names, in_types, shapes, strict=True)]
    node = oh.make_node(op, names, ["y"], **attrs)
    graph = oh.make_graph([node], "g", ins, [oh.make_tensor_value_info("y", out_type, None)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _feed(t: int, shape: list[int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if t == T.BOOL:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if t == T.FLOAT:
        return rng.integers(-3, 4, shape).astype(np.float32) * 0.5  # small grid: many ties
    return rng.integers(-7, 8, shape).astype(_NP[t])


def _graph(model: onnx.ModelProto, tmp_path: Path, legalize: bool = True) -> tuple[Graph, Path]:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    legal = BACKEND.legalization("mnn", None) if legalize else []
    PassManager([*pipeline("default"), *legal]).run(graph)
    return graph, path


def _run(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: Path
) -> tuple[Path, np.ndarray, np.ndarray]:
    graph, path = _graph(model, tmp_path)
    mnn = write_mnn(graph, tmp_path / "m.mnn", MnnOptions())[-1]
    return mnn, run_mnn(mnn, feeds)["y"], run_onnxruntime(path, feeds)["y"]


def _assert_exact(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape
    if ref.dtype == np.bool_:
        assert set(np.unique(got).tolist()) <= {0, 1}, "MNN's bool tensor is not 0 / 1"
        got = got.astype(np.bool_)
    assert np.array_equal(got, ref.astype(got.dtype) if ref.dtype != np.bool_ else ref)


_BROADCAST = [[2, 3, 4], [3, 1]]
CASES = [
    *[(op, [T.FLOAT, T.FLOAT], _BROADCAST, T.BOOL, {}) for op in ("Equal", "Less", "Greater")],
    *[(op, [T.FLOAT, T.FLOAT], [[4, 5], [4, 5]], T.BOOL, {}) for op in ("Equal", "Less")],
    *[(op, [T.FLOAT, T.FLOAT], _BROADCAST, T.BOOL, {}) for op in ("LessOrEqual", "GreaterOrEqual")],
    ("Equal", [T.INT64, T.INT64], _BROADCAST, T.BOOL, {}),
    ("Less", [T.INT32, T.INT32], [[4, 5], [4, 5]], T.BOOL, {}),
    ("Equal", [T.BOOL, T.BOOL], [[4, 5], [4, 5]], T.BOOL, {}),
    *[(op, [T.BOOL, T.BOOL], _BROADCAST, T.BOOL, {}) for op in ("Or", "Xor", "And")],
    ("Not", [T.BOOL], [[3, 7]], T.BOOL, {}),
    ("Mod", [T.INT64, T.INT64], [[4, 6], [4, 6]], T.INT64, {}),
    ("Mod", [T.FLOAT, T.FLOAT], [[4, 6], [4, 6]], T.FLOAT, {"fmod": 1}),
    ("Where", [T.BOOL, T.FLOAT, T.FLOAT], [[2, 1, 4], [3, 4], [2, 3, 1]], T.FLOAT, {}),
    ("Where", [T.BOOL, T.INT64, T.INT64], [[3, 4], [3, 4], [4]], T.INT64, {}),
]


@pytest.mark.parametrize(("op", "types", "shapes", "out", "attrs"), CASES, ids=lambda v: str(v))
def test_native_and_exact(
    op: str, types: list[int], shapes: list[list[int]], out: int, attrs: dict[str, object], tmp_path: Path
) -> None:
    model = _model(op, types, shapes, out, **attrs)
    feeds = {f"x{i}": _feed(t, s, seed=i) for i, (t, s) in enumerate(zip(types, shapes, strict=True))}
    if op == "Mod":  # no zero divisors, both signs on both sides
        feeds["x1"] = np.where(feeds["x1"] == 0, 3, feeds["x1"]).astype(feeds["x1"].dtype)
        feeds["x0"] = (feeds["x0"] * 3.7).astype(feeds["x0"].dtype)
    if op == "Mod":  # fmod and floor-mod differ on these feeds
        a, b = feeds["x0"], feeds["x1"]
        assert np.any(np.fmod(a, b) != np.mod(a, b))
    mnn, got, ref = _run(model, feeds, tmp_path)
    kind = "Select" if op == "Where" else "BinaryOp"
    written = mnn_op_types(mnn)
    float_equal = op == "Equal" and types[0] == T.FLOAT  # (a >= b) * (a <= b), see below
    assert written.count(kind) == (3 if float_equal else 1) and written.count("Input") == len(types)
    # MNN 3.6.1's Select misreads a broadcast non-scalar y: Kiln broadcasts it first
    assert written.count("BroadcastTo") == (op == "Where" and shapes[2] != list(ref.shape))
    ran = {k for k, _ in executed_ops(mnn, feeds)}
    # same shapes: the kernel itself; broadcasting: MNN's geometry adds Raster copies or loops it
    assert ran & {kind, "While"} and ran <= {kind, "While", "Raster"}
    _assert_exact(got, ref)


_SPECIAL_X = np.array([-0.0, np.nan, np.nan, 1.0, np.inf, -np.inf, -0.54, 0.0, -3.0, 2.5], np.float32)
_SPECIAL_Y = np.array([0.0, np.nan, 1.0, np.nan, np.inf, -np.inf, -0.62, -0.0, -1.0, 2.5], np.float32)


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_float_comparisons_of_special_values(op: str, tmp_path: Path) -> None:
    """NaN, -0, infinities and negatives: MNN 3.6.1's float LESS compares the bits as int32 and its
    float EQUAL compares bits, so Kiln writes Less(a, b) as GREATER(b, a) and Equal as
    (a >= b) * (a <= b); both are exact on these values."""
    feeds = {"x0": _SPECIAL_X, "x1": _SPECIAL_Y}
    mnn, got, ref = _run(_model(op, [T.FLOAT, T.FLOAT], [[10], [10]], T.BOOL), feeds, tmp_path)
    _assert_exact(got, ref)
    assert mnn_op_types(mnn).count("BinaryOp") == (3 if op == "Equal" else 1)


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_float_comparisons_broadcast_on_both_sides(op: str, tmp_path: Path) -> None:
    """[2, 1, 5] against [2, 3, 1]: MNN 3.6.1 compares such floats' bit patterns as int32 (negative
    values order backwards), so Kiln BroadcastTo's a to the output shape first; exact."""
    rng = np.random.default_rng(4)
    feeds = {
        k: -np.abs(rng.standard_normal(s)).astype(np.float32)
        for k, s in (("x0", (2, 1, 5)), ("x1", (2, 3, 1)))
    }
    feeds["x1"][0, 0, 0] = feeds["x0"][0, 0, 0]  # one tie
    mnn, got, ref = _run(_model(op, [T.FLOAT, T.FLOAT], [[2, 1, 5], [2, 3, 1]], T.BOOL), feeds, tmp_path)
    _assert_exact(got, ref)
    assert mnn_op_types(mnn).count("BroadcastTo") == 1


def test_isnan_is_native_and_exact(tmp_path: Path) -> None:
    x = np.array([[0.0, np.nan, np.inf, -np.inf], [-1.5, np.nan, 3.0, -0.0]], np.float32)
    mnn, got, ref = _run(_model("IsNaN", [T.FLOAT], [[2, 4]], T.BOOL), {"x0": x}, tmp_path)
    assert mnn_op_types(mnn) == ["Input", "BinaryOp"]
    _assert_exact(got, ref)


@pytest.mark.parametrize(
    ("op", "types", "attrs", "reason"),
    [
        ("Mod", [T.INT32, T.INT32], {"fmod": 1}, "fmod=1 of int32 tensors"),
        ("Equal", [T.UINT8, T.UINT8], {}, "uint8 inputs (MNN compares float32 and int32 tensors)"),
    ],
)
def test_refusals(op: str, types: list[int], attrs: dict[str, object], reason: str, tmp_path: Path) -> None:
    out = types[0] if op == "Mod" else T.BOOL
    graph, _ = _graph(_model(op, types, [[2, 3]] * len(types), out, **attrs), tmp_path, legalize=False)
    (node,) = [n for n in graph.ops() if n.op == op]
    assert TABLE.reason(graph, node) == reason


def test_where_const_branches_stay_select(tmp_path: Path) -> None:
    """An attention mask Where(c, 0, -FLT_MAX) is one Select, not the where-affine Cast/Mul/Add."""
    low = np.array(np.finfo(np.float32).min, np.float32)
    c = oh.make_tensor_value_info("c", T.BOOL, [2, 1, 5])
    node = oh.make_node("Where", ["c", "zero", "low"], ["y"])
    inits = [
        onnx.numpy_helper.from_array(np.array(0, np.float32), "zero"),
        onnx.numpy_helper.from_array(low, "low"),
    ]
    graph = oh.make_graph([node], "g", [c], [oh.make_tensor_value_info("y", T.FLOAT, None)], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    feeds = {"c": _feed(T.BOOL, [2, 1, 5], seed=3)}
    mnn, got, ref = _run(model, feeds, tmp_path)
    assert "Select" in mnn_op_types(mnn) and "Cast" not in mnn_op_types(mnn)
    _assert_exact(got, ref)


def test_compile_cli_emit_mnn(tmp_path: Path) -> None:
    """``kiln compile --emit mnn`` of a mask graph: Kiln's own check in MNN's runtime passes."""
    x = oh.make_tensor_value_info("x", T.FLOAT, [2, 6])
    nodes = [
        oh.make_node("Greater", ["x", "t"], ["g"]),
        oh.make_node("Not", ["g"], ["ng"]),
        oh.make_node("Less", ["x", "u"], ["l"]),
        oh.make_node("Or", ["ng", "l"], ["m"]),
        oh.make_node("Where", ["m", "x", "t"], ["y"]),
    ]
    inits = [onnx.numpy_helper.from_array(np.array(0.5, np.float32), n) for n in ("t",)]
    inits.append(onnx.numpy_helper.from_array(np.array(-0.5, np.float32), "u"))
    outs = [oh.make_tensor_value_info("y", T.FLOAT, None), oh.make_tensor_value_info("m", T.BOOL, None)]
    model = oh.make_model(
        oh.make_graph(nodes, "g", [x], outs, inits), opset_imports=[oh.make_opsetid("", 18)]
    )
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32))
    out = tmp_path / "out"
    args = [str(tmp_path / "m.onnx"), "-o", str(out), "--emit", "mnn", "--inputs", str(tmp_path / "x.npz")]
    assert kiln(["compile", *args]) == 0
    types = mnn_op_types(out / "model.mnn")
    assert types.count("BinaryOp") == 4 and types.count("Select") == 1
    # Kiln's MNN reader lifts the logic back (Not = EQUAL(a, 0), Or = LOGICALOR of bools)
    back = load_mnn(out / "model.mnn")
    assert {n.op for n in back.ops()} >= {"Greater", "Not", "Or", "Where"}
    feeds = dict(np.load(tmp_path / "x.npz"))
    got = run_onnxruntime(model_bytes(export_onnx(back)), feeds)
    ref = run_onnxruntime(tmp_path / "m.onnx", feeds)
    assert all(np.array_equal(got[k], ref[k]) for k in ref)


def test_integer_mod_reads_back(tmp_path: Path) -> None:
    """MNN's MOD of int32 takes the divisor's sign (ONNX fmod=0): the writer and the reader agree."""
    x = oh.make_tensor_value_info("x", T.FLOAT, [2, 6])
    nodes = [oh.make_node("Cast", ["x"], ["xi"], to=T.INT32), oh.make_node("Mod", ["xi", "d"], ["y"])]
    d = onnx.numpy_helper.from_array(np.array([3, -3, 5, -5, 7, -2], np.int32), "d")
    graph = oh.make_graph(nodes, "g", [x], [oh.make_tensor_value_info("y", T.INT32, None)], [d])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    feeds = {"x": np.array([[-7, 7, -8, 8, -9, 5], [4, -4, -11, 11, 13, -13]], np.float32)}
    mnn, got, ref = _run(model, feeds, tmp_path)
    assert np.array_equal(got, ref)
    back = load_mnn(mnn)
    (mod,) = [n for n in back.ops() if n.op == "Mod"]
    assert mod.attrs.fmod == 0
    assert np.array_equal(run_onnxruntime(model_bytes(export_onnx(back)), feeds)["y"], ref)
