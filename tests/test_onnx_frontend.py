"""The ONNX frontend on generated models: round trips through the exporter and every error path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.errors import ConversionError, InputShapeError, ModelFileError, UnsupportedOpsError
from compiler.ir import run_graph, verify
from compiler.onnx_export import export_onnx, model_bytes
from frontends.onnx import load_onnx
from frontends.registry import detect_format, load_model
from tests.helpers import models
from tests.helpers.conformance import ort_session
from tests.helpers.numerics import assert_close

RTOL = 1e-5  # exported model in ORT vs the original in ORT (same kernels)
ATOL = 1e-6
INTERP_RTOL = 1e-4  # Kiln's numpy references vs ORT's kernels
INTERP_ATOL = 1e-5


@pytest.mark.parametrize("name", sorted(models.ROUND_TRIP))
def test_round_trip_matches_onnxruntime(name: str) -> None:
    model = models.ROUND_TRIP[name]()
    feeds = models.random_feeds(model)
    ref = ort_session(model).run(None, feeds)
    graph = load_onnx(model)
    verify(graph)
    exported = export_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    got = ort_session(model_bytes(exported)).run(None, feeds)
    assert [o.name for o in exported.graph.output] == [o.name for o in model.graph.output]
    for o, g, r in zip(model.graph.output, got, ref, strict=True):
        assert_close(g, r, rtol=RTOL, atol=ATOL, what=f"{name}:{o.name} (exported)")
    res = run_graph(graph, feeds)
    for o, r in zip(model.graph.output, ref, strict=True):
        what = f"{name}:{o.name} (interpreter)"
        assert_close(res[o.name], r, rtol=INTERP_RTOL, atol=INTERP_ATOL, what=what)


def test_names_metadata_and_initializer_inputs() -> None:
    graph = load_onnx(models.opset9_initializer_inputs_upsample())
    assert [v.name for v in graph.inputs] == ["x"]  # initializers listed as inputs are constants
    assert {n.name for n in graph.ops()} == {"conv1", "up", "conv2"}
    assert graph.find_value("c1").producer.name == "conv1"
    assert [v.name for v in graph.outputs] == ["y"]
    assert graph.metadata["opset"] == "9" and graph.metadata["ir_version"] == "4"
    resize = graph.find_value("u").producer
    assert resize.op == "Resize"
    assert resize.attrs.coordinate_transformation_mode == "asymmetric"
    assert resize.attrs.nearest_mode == "floor"


def test_softmax11_is_flattened_unless_last_axis() -> None:
    graph = load_onnx(models.softmax11_axis1())
    assert [n.op for n in graph.ops()] == ["Flatten", "Softmax", "Reshape"]
    assert graph.outputs[0].name == "y" and graph.outputs[0].type.shape == (2, 3, 4, 5)
    last = helper.make_model(
        helper.make_graph(
            [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        ),
        opset_imports=[helper.make_opsetid("", 11)],
    )
    assert [n.op for n in load_onnx(last).ops()] == ["Softmax"]


def test_symbolic_batch_stays_symbolic_and_input_shapes_fix_it() -> None:
    model = models.symbolic_batch()
    graph = load_onnx(model)
    assert graph.inputs[0].type.shape == ("N", 3, 8, 8)
    assert graph.outputs[0].type.shape == ("N", 5)
    exported = export_onnx(graph)
    assert exported.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    fixed = load_onnx(model, input_shapes={"x": (4, 3, 8, 8)})
    assert fixed.outputs[0].type.shape == (4, 5)
    assert all(t.is_static for n in fixed.nodes() for t in n.output_types)


def test_unknown_dims_get_symbols() -> None:
    graph = load_onnx(models.static_input([0, "?", 3]))
    shape = graph.inputs[0].type.shape
    assert shape is not None and shape[2] == 3
    assert all(isinstance(d, str) and d for d in shape[:2]) and shape[0] != shape[1]


def test_shape_chains_fold_to_constants() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1,3,4,5] x) => (float[1,60] y) {
        s = Shape (x)
        n = Gather <axis = 0> (s, zero)
        nu = Unsqueeze (n, axes0)
        shp = Concat <axis = 0> (nu, minus1)
        y = Reshape (x, shp)
    }
    """
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "axes0"),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus1"),
        ]
    )
    graph = load_onnx(model)
    assert [n.op for n in graph.ops()] == ["Reshape"]
    assert graph.find_value("shp").const is not None
    assert graph.outputs[0].type.shape == (1, 60)


def test_old_training_attributes_are_dropped() -> None:
    nodes = [
        helper.make_node(
            "BatchNormalization",
            ["x", "s", "b", "m", "v"],
            ["n"],
            name="bn",
            spatial=1,
            is_test=1,
            consumed_inputs=[0, 0, 0, 1, 1],
        ),
        helper.make_node("Dropout", ["n"], ["d"], name="drop", is_test=1, ratio=0.5),
        helper.make_node("Upsample", ["d"], ["y"], name="up", scales=[1.0, 1.0, 2.0, 2.0]),
    ]
    params = [
        numpy_helper.from_array(np.full(2, v, dtype=np.float32), n)
        for n, v in (("s", 2.0), ("b", 1.0), ("m", 0.5), ("v", 1.0))
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
            initializer=params,
        ),
        opset_imports=[helper.make_opsetid("", 9)],
    )
    graph = load_onnx(model)
    assert [n.op for n in graph.ops()] == ["BatchNormalization", "Dropout", "Resize"]
    x = np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2)
    n = (x - 0.5) / np.sqrt(1.0 + 1e-5) * 2.0 + 1.0
    want = n.repeat(2, axis=2).repeat(2, axis=3)
    assert_close(run_graph(graph, {"x": x})["y"], want, rtol=1e-6, atol=1e-6)


def test_folded_outputs_keep_their_names() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"), helper.make_node("Relu", ["x"], ["r"])]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [
                helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
                helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3]),
            ],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    graph = load_onnx(model)
    assert graph.outputs[0].const is not None and graph.outputs[0].name == "s"
    exported = export_onnx(graph)
    assert [o.name for o in exported.graph.output] == ["s", "r"]
    feeds = {"x": np.ones((2, 3), dtype=np.float32)}
    got = ort_session(model_bytes(exported)).run(None, feeds)
    np.testing.assert_array_equal(got[0], np.array([2, 3], dtype=np.int64))


def test_constant_node_variants() -> None:
    nodes = [
        helper.make_node("Constant", [], ["a"], value_float=2.0),
        helper.make_node("Constant", [], ["b"], value_ints=[1, 2, 3]),
        helper.make_node(
            "Constant",
            [],
            ["c"],
            sparse_value=helper.make_sparse_tensor(
                numpy_helper.from_array(np.array([5.0], dtype=np.float32), "v"),
                numpy_helper.from_array(np.array([2], dtype=np.int64), "i"),
                [3],
            ),
        ),
        helper.make_node("Mul", ["x", "a"], ["xa"]),
        helper.make_node("Add", ["xa", "c"], ["y"]),
        helper.make_node("Identity", ["b"], ["z"]),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
            [
                helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
                helper.make_tensor_value_info("z", TensorProto.INT64, [3]),
            ],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    graph = load_onnx(model)
    res = run_graph(graph, {"x": np.array([1.0, 2.0, 3.0], dtype=np.float32)})
    np.testing.assert_array_equal(res["y"], np.array([2.0, 4.0, 11.0], dtype=np.float32))
    np.testing.assert_array_equal(res["z"], np.array([1, 2, 3], dtype=np.int64))


def test_cast_with_string_to() -> None:
    node = helper.make_node("Cast", ["x"], ["y"], name="cast", to="INT32")
    model = helper.make_model(
        helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    res = run_graph(load_onnx(model), {"x": np.array([1.7, -2.2], dtype=np.float32)})
    np.testing.assert_array_equal(res["y"], np.array([1, -2], dtype=np.int32))


def test_external_data_is_loaded_relative_to_the_file(tmp_path: Path) -> None:
    model = models.conv_bn_relu()
    feeds = models.random_feeds(model)
    ref = ort_session(model).run(None, feeds)
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(
        models.conv_bn_relu(),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    res = run_graph(load_model(path), feeds)
    assert_close(res["y"], ref[0], rtol=INTERP_RTOL, atol=INTERP_ATOL, what="y")
    (path.parent / "weights.bin").unlink()
    with pytest.raises(ModelFileError, match="model.onnx"):
        load_onnx(path)


# ----------------------------------------------------------------------------- errors
def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.onnx"
    with pytest.raises(ModelFileError, match="nope.onnx"):
        load_onnx(path)
    with pytest.raises(ModelFileError, match="nope.onnx"):
        load_model(path)


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.7, 0.95])
def test_truncated_file(tmp_path: Path, fraction: float) -> None:
    data = models.conv_bn_relu().SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelFileError, match="truncated.onnx"):
        load_onnx(path)


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "random.onnx"
    path.write_bytes(np.random.default_rng(seed).bytes(4096))
    with pytest.raises(ModelFileError, match="random.onnx"):
        load_model(path)


def test_protobuf_that_is_not_a_model(tmp_path: Path) -> None:
    path = tmp_path / "tensor.onnx"
    path.write_bytes(numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "t").SerializeToString())
    with pytest.raises(ModelFileError, match="tensor.onnx"):
        load_onnx(path)


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "model.xyz"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelFileError, match="model.xyz"):
        load_model(path)
    onnx_file = tmp_path / "model.bin"
    onnx_file.write_bytes(models.conv_bn_relu().SerializeToString())
    assert detect_format(onnx_file) == "onnx"  # found by its magic bytes
    assert load_model(onnx_file).outputs[0].name == "y"


def test_unsupported_ops_lists_every_op_and_node() -> None:
    with pytest.raises(UnsupportedOpsError) as info:
        load_onnx(models.unknown_ops())
    assert info.value.ops == {"FooBar": ["foo_1", "foo_2"], "com.example::Frobnicate": ["frob"]}
    for text in ("FooBar", "foo_1", "foo_2", "Frobnicate", "frob"):
        assert text in str(info.value)


def test_unknown_attribute_names_the_node() -> None:
    node = helper.make_node("Relu", ["x"], ["y"], name="my_relu", bogus=3)
    model = helper.make_model(
        helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    with pytest.raises(ConversionError, match="my_relu.*bogus"):
        load_onnx(model)


def test_failed_shape_inference_names_node_and_op() -> None:
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="bad_add")]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
            initializer=[numpy_helper.from_array(np.ones(4, dtype=np.float32), "w")],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    with pytest.raises(ConversionError, match="bad_add.*Add"):
        load_onnx(model)


def test_input_shapes_unknown_name() -> None:
    with pytest.raises(InputShapeError, match="'image'.*inputs: x"):
        load_onnx(models.symbolic_batch(), input_shapes={"image": (1, 3, 8, 8)})


def test_input_shapes_wrong_rank() -> None:
    with pytest.raises(InputShapeError, match=r"'x'.*1x3x8.*Nx3x8x8"):
        load_onnx(models.symbolic_batch(), input_shapes={"x": (1, 3, 8)})


def test_input_shapes_conflict_with_static_dim() -> None:
    with pytest.raises(InputShapeError, match=r"'x'.*1x3x9x8.*Nx3x8x8"):
        load_onnx(models.symbolic_batch(), input_shapes={"x": (1, 3, 9, 8)})


def test_old_opset_is_upgraded() -> None:
    model = models.static_input([2])
    model.opset_import[0].version = 8
    graph = load_onnx(model)  # onnx.version_converter raises it to the oldest supported opset
    assert graph.metadata["opset"] == "9"
    assert [n.op for n in graph.nodes() if n.op == "Relu"] == ["Relu"]


def test_opset_too_old_when_the_upgrade_changes_the_model() -> None:
    # Scan-8 has a batch axis; version_converter's Scan-9 drops it, changing the inputs' shapes
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "x"], ["s2"]), helper.make_node("Identity", ["s2"], ["y"])],
        "body",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("s", "x")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("s2", "y")],
    )
    scan = helper.make_node("Scan", ["", "init", "xs"], ["final", "ys"], num_scan_inputs=1, body=body)
    g = helper.make_graph(
        [scan],
        "scan8",
        [
            helper.make_tensor_value_info("init", TensorProto.FLOAT, [1, 2]),
            helper.make_tensor_value_info("xs", TensorProto.FLOAT, [1, 3, 2]),
        ],
        [
            helper.make_tensor_value_info("final", TensorProto.FLOAT, [1, 2]),
            helper.make_tensor_value_info("ys", TensorProto.FLOAT, [1, 3, 2]),
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)], ir_version=8)
    with pytest.raises(ConversionError, match="opset 8 is not supported"):
        load_onnx(model)
