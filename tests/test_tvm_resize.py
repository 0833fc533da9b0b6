"""TVM's Resize lowering (backends/tvm/lowering/resize.py) against onnxruntime, fp32 1e-5.

Every coordinate mode, nearest rounding, cubic, antialias, tf_crop_and_resize with roi and
extrapolation, scales that differ from the size ratio, and the blocked NCHW{b}c path (a conv in
front makes choose-layout block the resize) as two passes, columns then rows, the rows fused with
the unpack that follows them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.numerics import assert_close
from tests.helpers.single_op import run_ort
from tests.test_tvm_ops import run_tvm_op

R = np.random.default_rng(3)
TOL = 1e-5


def _f(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def _sizes(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def _scales(*v: float) -> np.ndarray:
    return np.array(v, np.float32)


X = _f(1, 3, 7, 9)
# (name, inputs [X, roi, scales, sizes], attrs)
CASES: list[tuple[str, list[np.ndarray | None], dict[str, Any]]] = [
    ("linear_up_sizes", [X, None, None, _sizes(1, 3, 20, 33)], {"mode": "linear"}),
    ("linear_down_scale_not_ratio", [X, None, _scales(1, 1, 0.6, 0.7)], {"mode": "linear"}),
    (
        "linear_align_corners",
        [X, None, None, _sizes(1, 3, 11, 5)],
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    ),
    (
        "linear_asymmetric",
        [X, None, _scales(1, 1, 2.5, 1.5)],
        {"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
    ),
    (
        "linear_pytorch_half_pixel_to_1",
        [X, None, None, _sizes(1, 3, 1, 12)],
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    ),
    (
        "linear_half_pixel_symmetric",
        [X, None, _scales(1, 1, 1.7, 0.8)],
        {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
    ),
    ("linear_identity_rows", [X, None, _scales(1, 1, 1, 2)], {"mode": "linear"}),
    (
        "nearest_asymmetric_floor",
        [X, None, _scales(1, 1, 2, 3)],
        {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    ),
    (
        "nearest_half_pixel_prefer_ceil",
        [X, None, None, _sizes(1, 3, 10, 13)],
        {"nearest_mode": "round_prefer_ceil"},
    ),
    (
        "nearest_tf_half_pixel_ceil",
        [X, None, _scales(1, 1, 0.5, 1.5)],
        {"coordinate_transformation_mode": "tf_half_pixel_for_nn", "nearest_mode": "ceil"},
    ),
    ("cubic", [X, None, None, _sizes(1, 3, 15, 12)], {"mode": "cubic"}),
    (
        "cubic_exclude_outside",
        [X, None, _scales(1, 1, 1.5, 0.75)],
        {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
    ),
    ("linear_antialias_down", [X, None, None, _sizes(1, 3, 3, 4)], {"mode": "linear", "antialias": 1}),
    (
        "tf_crop_and_resize",
        [X, np.array([0, 0, 0.1, -0.2, 1, 1, 0.8, 1.3], np.float32), None, _sizes(1, 3, 6, 8)],
        {
            "mode": "linear",
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": 2.5,
        },
    ),
    (
        "keep_aspect_not_larger_axes",
        [X, None, None, _sizes(14, 12)],
        {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
    ),
]


@pytest.mark.parametrize(("name", "inputs", "attrs"), CASES, ids=[c[0] for c in CASES])
def test_resize_matches_onnxruntime(
    name: str, inputs: list[np.ndarray | None], attrs: dict[str, Any]
) -> None:
    consts = {i for i in range(1, len(inputs)) if inputs[i] is not None}
    got = run_tvm_op("Resize", inputs, attrs, consts, 1)[0]
    ref = run_ort("Resize", inputs, attrs)[0]
    assert_close(got, ref, rtol=TOL, atol=TOL, what=name)


def test_uint8_nearest_is_exact() -> None:
    x = R.integers(0, 256, (1, 2, 5, 6), dtype=np.uint8)
    inputs: list[np.ndarray | None] = [x, None, _scales(1, 1, 2.5, 1.5)]
    got = run_tvm_op("Resize", inputs, {}, {2}, 1)[0]
    ref = run_ort("Resize", inputs, {})[0]
    assert got.dtype == np.uint8
    assert_close(got, ref, rtol=0, atol=0, what="uint8 nearest")


def _conv_resize_model(w: np.ndarray, out_hw: tuple[int, int]) -> Any:
    n, c = 1, int(w.shape[0])
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    resize = helper.make_node("Resize", ["y", "", "", "sizes"], ["z"], mode="linear")
    sizes = numpy_helper.from_array(np.array([n, c, *out_hw], np.int64), "sizes")
    graph = helper.make_graph(
        [conv, resize],
        "conv_resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, int(w.shape[1]), 10, 10])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [n, c, *out_hw])],
        [numpy_helper.from_array(w, "w"), sizes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_blocked_resize_fused_with_unpack_matches_onnxruntime() -> None:
    import onnxruntime as ort
    import tvm
    from tvm import relax

    from backends.tvm.build import compile_module
    from backends.tvm.emit import prepare_graph
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target
    from frontends.onnx.loader import load_onnx

    w = _f(21, 32, 1, 1)  # 21 channels: the blocked tensor has padded lanes
    model = _conv_resize_model(w, (33, 40))
    x = _f(1, 32, 10, 10)
    target = resolve_target("cpu")
    legal, _ = prepare_graph(load_onnx(model), target)
    resize = next(n for n in legal.nodes() if n.op == "Resize")
    src = legal.inputs_of(resize)[0]
    assert src is not None and len(src.type.shape or ()) == 5  # runs in NCHW{b}c
    mod = lower_graph(legal, target).mod
    funcs = {gv.name_hint: f for gv, f in mod.functions.items() if "kiln_resize" in gv.name_hint}
    assert sorted(funcs) == ["kiln_resize", "kiln_resize_cols"]  # separable: columns, then rows
    assert int(funcs["kiln_resize"].attrs["op_pattern"]) == 2  # injective: FuseOps fuses the unpack in
    vm = relax.VirtualMachine(compile_module(mod, target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x})[0]
    assert_close(got, ref, rtol=TOL, atol=TOL, what="conv -> blocked resize")


def test_nearest_and_one_axis_resizes_are_one_pass() -> None:
    from backends.tvm.emit import prepare_graph
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target
    from compiler.ir.graph import Graph
    from compiler.ir.types import TensorType

    target = resolve_target("cpu")
    for attrs, scales in (({}, _scales(1, 1, 2, 3)), ({"mode": "linear"}, _scales(1, 1, 1, 2))):
        g = Graph("resize")
        x = g.add_input("x", TensorType.of(X))
        node = g.add_node("Resize", [x, None, g.add_constant(scales, "scales")], attrs, num_outputs=1)
        g.set_outputs(g.outputs_of(node))
        legal, _ = prepare_graph(g, target)
        names = [gv.name_hint for gv in lower_graph(legal, target).mod.functions if "resize" in gv.name_hint]
        assert names == ["kiln_resize"], (attrs, names)  # no separate column pass
