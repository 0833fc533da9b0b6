"""The MNN reader on ops only MNN's converter writes (issue 5): Pooling3D, Scale, Shape, Rank,
SliceTf, Raster, InnerProduct, Deconvolution, PReLU (and the Slice/Flatten/Squeeze/GatherV2/Select
ops around them).

The ``.mnn`` files are made by MNN's own converter library (``tests.helpers.mnn_convert``) from
small ONNX models, or, for the two ops its ONNX front end never writes (Raster, InnerProduct),
from MNN's JSON form of a net. Each file is imported with Kiln's reader; Kiln's interpreter and
the ONNX export in onnxruntime are compared with MNN's runtime on the same file and with
onnxruntime on the source model (max abs error / max |ref| <= 1e-4).

MNN 3.6.1's runtime is left out where it is itself wrong on the converter's file (measured):
3-D MaxPool and unpadded 3-D AveragePool crash it, padded 3-D AveragePool is off by 0.39
relative, a single grouped Deconvolution (``--groupConvNative``) and a stand-alone InnerProduct
give garbage. There Kiln is checked against onnxruntime / numpy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.mnn.runtime import run_mnn
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.onnx_export import export_onnx
from frontends.mnn.lifters_converter import raster_index
from frontends.mnn.loader import load_mnn
from tests.helpers.mnn_convert import json_to_mnn, mnn_op_types, onnx_to_mnn

RTOL = 1e-4
_rng = np.random.default_rng(5)


def _r(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


@dataclass
class Case:
    nodes: list[onnx.NodeProto]
    inputs: dict[str, list[int]]
    outputs: list[str]
    inits: dict[str, np.ndarray]
    expect: set[str]  # MNN op types the converter must have written
    flags: tuple[str, ...] = ()
    mnn_runs: bool = True  # MNN's runtime is right on this file
    kiln_ops: set[str] = field(default_factory=set)


def _i64(*v: int) -> np.ndarray:
    return np.asarray(v, np.int64)


N = helper.make_node
CASES = {
    "prelu": Case(
        [N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), N("PRelu", ["c", "s"], ["y"])],
        {"x": [1, 3, 8, 8]},
        ["y"],
        {"w": _r(4, 3, 3, 3), "s": _r(1, 4, 1, 1)},
        {"PReLU"},
        kiln_ops={"PRelu"},
    ),
    "prelu_select": Case(
        [N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), N("PRelu", ["c", "s"], ["y"])],
        {"x": [1, 3, 8, 8]},
        ["y"],
        {"w": _r(4, 3, 3, 3), "s": _r(4, 1, 1)},
        {"Select", "BinaryOp"},
    ),
    "deconv_groups_split": Case(
        [
            N(
                "ConvTranspose",
                ["x", "w", "b"],
                ["y"],
                group=2,
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                output_padding=[1, 1],
            )
        ],
        {"x": [1, 4, 5, 5]},
        ["y"],
        {"w": _r(4, 3, 3, 3), "b": _r(6)},
        {"Slice", "Deconvolution", "Concat"},
        kiln_ops={"ConvTranspose", "Split"},
    ),
    "deconv_groups_native": Case(
        [
            N(
                "ConvTranspose",
                ["x", "w", "b"],
                ["t"],
                group=2,
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                output_padding=[1, 1],
            ),
            N("Relu", ["t"], ["y"]),
        ],
        {"x": [1, 4, 5, 5]},
        ["y"],
        {"w": _r(4, 3, 3, 3), "b": _r(6)},
        {"Deconvolution"},
        flags=("--groupConvNative",),
        mnn_runs=False,
    ),
    "gemm": Case(
        [N("Flatten", ["x"], ["f"]), N("Gemm", ["f", "w", "b"], ["y"], transB=1)],
        {"x": [1, 2, 3, 4]},
        ["y"],
        {"w": _r(5, 24), "b": _r(5)},
        {"Flatten", "Shape", "Rank", "SliceTf", "Unsqueeze", "Convolution"},
    ),
    "matmul_3d": Case(
        [N("MatMul", ["x", "w"], ["y"])],
        {"x": [2, 3, 4]},
        ["y"],
        {"w": _r(4, 6)},
        {"Shape", "Rank", "SliceTf"},
    ),
    "batchnorm": Case(
        [N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
        {"x": [1, 3, 4, 5]},
        ["y"],
        {"s": _r(3), "b": _r(3), "m": _r(3), "v": np.abs(_r(3)) + 0.5},
        {"Scale"},
        kiln_ops={"Mul", "Add"},
    ),
    "shape_gather_reshape": Case(
        [
            N("Shape", ["x"], ["s"]),
            N("Gather", ["s", "i"], ["g"], axis=0),
            N("Concat", ["g", "m1"], ["ns"], axis=0),
            N("Reshape", ["x", "ns"], ["y"]),
        ],
        {"x": [2, 3, 4, 5]},
        ["y"],
        {"i": _i64(0), "m1": _i64(-1)},
        {"Shape", "Rank", "GatherV2", "StridedSlice", "Squeeze"},
        kiln_ops={"Reshape"},
    ),
    "slice_steps": Case(
        [N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
        {"x": [1, 6, 8, 8]},
        ["y"],
        {"st": _i64(1, 2), "en": _i64(5, 7), "ax": _i64(1, 3), "sp": _i64(2, 1)},
        {"StridedSlice"},
    ),
    "transpose_concat_split": Case(
        [
            N("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
            N("Transpose", ["x2"], ["t2"], perm=[0, 2, 1, 3]),
            N("Concat", ["t", "t2"], ["c"], axis=1),
            N("Split", ["c"], ["a", "b"], axis=1),
            N("Concat", ["b", "a"], ["y"], axis=2),
        ],
        {"x": [1, 3, 4, 5], "x2": [1, 5, 2, 3]},
        ["y"],
        {},
        {"Permute", "Slice", "Concat"},
    ),
    "global_avgpool": Case(
        [N("GlobalAveragePool", ["x"], ["y"])],
        {"x": [1, 3, 5, 5]},
        ["y"],
        {},
        {"Pooling3D"},
        kiln_ops={"GlobalAveragePool"},
    ),
    "pool3d": Case(
        [
            N("MaxPool", ["x"], ["a"], kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
            N("AveragePool", ["x"], ["b"], kernel_shape=[3, 3, 3], strides=[1, 2, 2], pads=[1] * 6),
        ],
        {"x": [1, 2, 4, 6, 6]},
        ["a", "b"],
        {},
        {"Pooling3D"},
        mnn_runs=False,
        kiln_ops={"MaxPool", "AveragePool"},
    ),
}


def _model(name: str, case: Case) -> onnx.ModelProto:
    g = helper.make_graph(
        case.nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in case.inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in case.outputs],
        [numpy_helper.from_array(v, k) for k, v in case.inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds), strict=True))


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return float(np.abs(got.astype(np.float64) - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def _check(
    graph: Graph, path: Path, feeds: dict[str, np.ndarray], ref: dict[str, np.ndarray], mnn: bool
) -> None:
    kiln = run_graph(graph, feeds)
    exported = _ort(export_onnx(graph), feeds)
    mnn_out = run_mnn(path, feeds) if mnn else {}
    for name, want in ref.items():
        assert _rel(kiln[name], want) <= RTOL, name
        assert _rel(exported[name], want) <= RTOL, name
        if mnn:
            assert _rel(mnn_out[name], want) <= RTOL, name
            assert _rel(kiln[name], mnn_out[name]) <= RTOL, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_converter_file(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    model = _model(name, case)
    src = tmp_path / f"{name}.onnx"
    onnx.save(model, str(src))
    path = onnx_to_mnn(src, tmp_path / f"{name}.mnn", *case.flags)
    assert case.expect <= set(mnn_op_types(path))
    graph = load_mnn(path)
    ops = {n.op for n in graph.ops()}
    assert case.kiln_ops <= ops
    feeds = {k: _r(*s) for k, s in case.inputs.items()}
    _check(graph, path, feeds, _ort(model, feeds), case.mnn_runs)


# ------------------------------------------------------------------- JSON-made files
def _input(name: str, dims: list[int], idx: int) -> dict[str, object]:
    main = {"dims": dims, "dtype": "DT_FLOAT", "dformat": "NCHW"}
    return {"type": "Input", "main_type": "Input", "main": main, "name": name, "outputIndexes": [idx]}


def _net(tmp_path: Path, name: str, ops: list[dict[str, object]], tensors: list[str]) -> Path:
    net = {"oplists": ops, "tensorName": tensors, "sourceType": "ONNX", "outputName": [tensors[-1]]}
    src = tmp_path / f"{name}.json"
    src.write_text(json.dumps(net))
    return json_to_mnn(src, tmp_path / f"{name}.mnn")


def _raster_op(ins: list[int], out: int, shape: list[int], regions: list[list[int]]) -> dict[str, object]:
    attrs = [{"key": "shape", "list": {"i": shape}}, {"key": "region", "list": {"i": sum(regions, [])}}]
    return {
        "type": "Raster",
        "main_type": "Extra",
        "main": {"attr": attrs},
        "name": "y",
        "inputIndexes": ins,
        "outputIndexes": [out],
    }


def test_raster_permute_concat(tmp_path: Path) -> None:
    """out[2, 7, 3] = concat(transpose(x[2, 3, 4], (0, 2, 1)), z[2, 3, 3]) along axis 1, as two regions."""
    regions = [[0, 12, 1, 4, 0, 21, 3, 1, 2, 4, 3], [0, 9, 3, 1, 12, 21, 3, 1, 2, 3, 3]]
    ops = [_input("x", [2, 3, 4], 0), _input("z", [2, 3, 3], 1), _raster_op([0, 1], 2, [2, 7, 3], regions)]
    path = _net(tmp_path, "raster", ops, ["x", "z", "y"])
    assert mnn_op_types(path) == ["Input", "Input", "Raster"]
    feeds = {"x": _r(2, 3, 4), "z": _r(2, 3, 3)}
    want = np.concatenate([feeds["x"].transpose(0, 2, 1), feeds["z"]], 1)
    graph = load_mnn(path)
    assert {n.op for n in graph.ops()} == {"Gather", "Reshape", "Concat"}
    _check(graph, path, feeds, {"y": want}, mnn=True)


def test_raster_slice_with_zero_fill(tmp_path: Path) -> None:
    """A slice x[:, 1:3, ::2] written into the middle of a zeroed [1, 4, 3] output (one region)."""
    regions = [[6, 30, 6, 2, 3, 12, 3, 1, 1, 2, 3]]  # src offset 1*6, strides 6, 2; dst rows 1..2
    ops = [_input("x", [1, 5, 6], 0), _raster_op([0], 1, [1, 4, 3], regions)]
    path = _net(tmp_path, "raster_slice", ops, ["x", "y"])
    feeds = {"x": _r(1, 5, 6)}
    want = np.zeros((1, 4, 3), np.float32)
    want[0, 1:3] = feeds["x"][0, 1:3, ::2]
    regions_np = raster_index([1, 4, 3], regions, [30])
    assert (regions_np.reshape(-1)[[0, 1, 2, 9, 10, 11]] == 30).all()
    _check(load_mnn(path), path, feeds, {"y": want}, mnn=True)


def test_inner_product(tmp_path: Path) -> None:
    """InnerProduct(axis 1) on a 4-D input = flatten @ W^T + b (MNN's runtime is wrong on it)."""
    w, b = _r(5, 12), _r(5)
    main = {
        "outputCount": 5,
        "biasTerm": 1,
        "weightSize": 60,
        "weight": w.ravel().tolist(),
        "bias": b.tolist(),
        "axis": 1,
    }
    ip: dict[str, object] = {
        "type": "InnerProduct",
        "main_type": "InnerProduct",
        "main": main,
        "name": "y",
        "inputIndexes": [0],
        "outputIndexes": [1],
    }
    path = _net(tmp_path, "inner_product", [_input("x", [2, 3, 2, 2], 0), ip], ["x", "y"])
    assert "InnerProduct" in mnn_op_types(path)
    feeds = {"x": _r(2, 3, 2, 2)}
    graph = load_mnn(path)
    assert "Gemm" in {n.op for n in graph.ops()}
    _check(graph, path, feeds, {"y": feeds["x"].reshape(2, 12) @ w.T + b}, mnn=False)
