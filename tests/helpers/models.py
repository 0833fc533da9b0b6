"""Small generated ONNX models for frontend and exporter tests (onnx.helper and the ONNX text parser).

Every builder is deterministic (weights from a seeded generator) and returns a
checked ModelProto; :data:`ROUND_TRIP` maps a name to ``(builder, feeds)`` for
the import -> export -> onnxruntime round trip.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, parser

__all__ = [
    "conv_bn_relu",
    "residual_add",
    "opset9_initializer_inputs_upsample",
    "symbolic_batch",
    "unknown_ops",
    "softmax11_axis1",
    "opset9_upgrades",
    "resize10",
    "yolo_split_concat_head",
    "static_input",
    "random_feeds",
    "ROUND_TRIP",
]


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _init(name: str, shape: tuple[int, ...], seed: int, *, positive: bool = False) -> onnx.TensorProto:
    a = _rng(seed).standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    onnx.checker.check_model(model, full_check=True)
    return model


def conv_bn_relu() -> onnx.ModelProto:
    """x[1,3,16,16] -> Conv 3x3 (8 ch, pads 1) -> BatchNormalization -> Relu, opset 13."""
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["c"], name="conv1", pads=[1, 1, 1, 1], kernel_shape=[3, 3]
        ),
        helper.make_node(
            "BatchNormalization", ["c", "g", "beta", "mu", "var"], ["n"], name="bn1", epsilon=1e-3
        ),
        helper.make_node("Relu", ["n"], ["y"], name="relu1"),
    ]
    inits = [
        _init("w", (8, 3, 3, 3), 1),
        _init("b", (8,), 2),
        _init("g", (8,), 3),
        _init("beta", (8,), 4),
        _init("mu", (8,), 5),
        _init("var", (8,), 6, positive=True),
    ]
    g = helper.make_graph(
        nodes,
        "conv_bn_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        initializer=inits,
    )
    return _checked(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))


def residual_add() -> onnx.ModelProto:
    """A residual block: y = Relu(x + Conv(Relu(Conv(x)))), written in the ONNX text format."""
    text = """
    <ir_version: 8, opset_import: ["" : 13], producer_name: "kiln-tests">
    residual (float[1,4,8,8] x) => (float[1,4,8,8] y) {
        c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
        r1 = Relu (c1)
        c2 = Conv <pads = [1,1,1,1]> (r1, w2, b2)
        s = Add (x, c2)
        y = Relu (s)
    }
    """
    model = parser.parse_model(text)
    model.graph.initializer.extend(
        [
            _init("w1", (4, 4, 3, 3), 11),
            _init("b1", (4,), 12),
            _init("w2", (4, 4, 3, 3), 13),
            _init("b2", (4,), 14),
        ]
    )
    for i, n in enumerate(model.graph.node):
        n.name = f"{n.op_type.lower()}_{i}"
    return _checked(model)


def opset9_initializer_inputs_upsample() -> onnx.ModelProto:
    """IR 4, opset 9, every initializer also a graph input; Conv -> Upsample(nearest, x2) -> Conv."""
    inits = [
        _init("w1", (4, 3, 3, 3), 21),
        _init("b1", (4,), 22),
        _init("w2", (2, 4, 1, 1), 23),
        numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 2.0], dtype=np.float32), "scales"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Upsample", ["c1", "scales"], ["u"], name="up", mode="nearest"),
        helper.make_node("Conv", ["u", "w2"], ["y"], name="conv2"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])] + [
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits
    ]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 12, 12])
    g = helper.make_graph(nodes, "opset9_upsample", inputs, [out], initializer=inits)
    return _checked(helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)], ir_version=4))


def symbolic_batch() -> onnx.ModelProto:
    """x[N,3,8,8] -> Conv -> GlobalAveragePool -> Flatten -> Gemm -> y[N,5]; batch stays symbolic."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    inits = [_init("w", (6, 3, 3, 3), 31), _init("fc_w", (5, 6), 32), _init("fc_b", (5,), 33)]
    g = helper.make_graph(
        nodes,
        "symbolic_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        initializer=inits,
    )
    return _checked(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))


def unknown_ops() -> onnx.ModelProto:
    """Two unsupported default-domain ``FooBar`` nodes, a custom-domain op and supported ops between them."""
    nodes = [
        helper.make_node("FooBar", ["x"], ["a"], name="foo_1"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("FooBar", ["b"], ["c"], name="foo_2"),
        helper.make_node("Frobnicate", ["c"], ["y"], name="frob", domain="com.example"),
    ]
    g = helper.make_graph(
        nodes,
        "unknown_ops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)]
    return helper.make_model(g, opset_imports=opsets, ir_version=8)


def softmax11_axis1() -> onnx.ModelProto:
    """Softmax-11 with axis=1 on a rank-4 input (the input is coerced to 2-D at axis 1)."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=1)]
    g = helper.make_graph(
        nodes,
        "softmax11",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 5])],
    )
    return _checked(helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], ir_version=6))


def opset9_upgrades() -> onnx.ModelProto:
    """Opset-9 forms with attributes that later became inputs: Clip, Slice, Pad, Squeeze/Unsqueeze,
    ReduceMean, Split, TopK, plus Softmax's default axis and an old Dropout."""
    text = """
    <ir_version: 4, opset_import: ["" : 9]>
    upgrades (float[2,3,6,6] x) => (float[2,3,5,1] y, float[2,3,2,6] s0, float[2,3,3,6] s1, float[2,3,5,2] tv,
                                    int64[2,3,5,2] ti, float[2,108] sm) {
        c = Clip <min = -0.5, max = 0.75> (x)
        sl = Slice <starts = [1, 0], ends = [6, 5], axes = [2, 3]> (c)
        p = Pad <pads = [0, 0, 0, 1, 0, 0, 0, 0], value = 0.25> (sl)
        r = ReduceMean <axes = [3], keepdims = 1> (p)
        u = Unsqueeze <axes = [0]> (r)
        y = Squeeze <axes = [0]> (u)
        s0, s1 = Split <axis = 2, split = [2, 3]> (p)
        tv, ti = TopK <k = 2, axis = 3> (sl)
        d = Dropout <ratio = 0.3> (x)
        f = Reshape (d, shape)
        sm = Softmax (f)
    }
    """
    model = parser.parse_model(text)
    model.graph.initializer.append(numpy_helper.from_array(np.array([2, -1], dtype=np.int64), "shape"))
    for i, n in enumerate(model.graph.node):
        n.name = f"{n.op_type.lower()}_{i}"
    return _checked(model)


def resize10(mode: str) -> onnx.ModelProto:
    """Resize-10 ``(X, scales)`` with non-integer scales (asymmetric coordinates)."""
    scales = numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 1.5], dtype=np.float32), "scales")
    nodes = [helper.make_node("Resize", ["x", "scales"], ["y"], name="resize", mode=mode)]
    g = helper.make_graph(
        nodes,
        f"resize10_{mode}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 7])],
        initializer=[scales],
    )
    return _checked(helper.make_model(g, opset_imports=[helper.make_opsetid("", 10)], ir_version=5))


def yolo_split_concat_head() -> onnx.ModelProto:
    """A YOLOv8-style neck and head on x[1,8,16,16] -> y[1,256,12], opset 13.

    A C2f block (1x1 conv + SiLU, Split in two, a 3x3 conv + SiLU on the second half, Concat of
    all three) then a head (1x1 conv, Split into box [4] / cls [8], Sigmoid on cls, Concat back,
    Reshape to [1,12,256], Transpose to anchors-major). Each Split output and the first Concat's
    inputs are read by more than one block after fusion.
    """
    text = """
    <ir_version: 8, opset_import: ["" : 13], producer_name: "kiln-tests">
    yolo_head (float[1,8,16,16] x) => (float[1,256,12] y) {
        c0 = Conv <kernel_shape = [1,1]> (x, w0, b0)
        g0 = Sigmoid (c0)
        a0 = Mul (c0, g0)
        p1, p2 = Split <axis = 1> (a0, split_c2f)
        c1 = Conv <kernel_shape = [3,3], pads = [1,1,1,1]> (p2, w1, b1)
        g1 = Sigmoid (c1)
        a1 = Mul (c1, g1)
        cat = Concat <axis = 1> (p1, p2, a1)
        c2 = Conv <kernel_shape = [1,1]> (cat, w2, b2)
        box, cls = Split <axis = 1> (c2, split_head)
        score = Sigmoid (cls)
        det = Concat <axis = 1> (box, score)
        flat = Reshape (det, flat_shape)
        y = Transpose <perm = [0,2,1]> (flat)
    }
    """
    model = parser.parse_model(text)
    model.graph.initializer.extend(
        [
            _init("w0", (16, 8, 1, 1), 41),
            _init("b0", (16,), 42),
            _init("w1", (8, 8, 3, 3), 43),
            _init("b1", (8,), 44),
            _init("w2", (12, 24, 1, 1), 45),
            _init("b2", (12,), 46),
            numpy_helper.from_array(np.array([8, 8], np.int64), "split_c2f"),
            numpy_helper.from_array(np.array([4, 8], np.int64), "split_head"),
            numpy_helper.from_array(np.array([1, 12, 256], np.int64), "flat_shape"),
        ]
    )
    for i, n in enumerate(model.graph.node):
        n.name = f"{n.op_type.lower()}_{i}"
    return _checked(model)


def static_input(dims: list[int | str]) -> onnx.ModelProto:
    """A one-node Relu model whose single input ``x`` has the given declared dims."""
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "static_input",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def random_feeds(model: onnx.ModelProto, seed: int = 0, batch: int = 2) -> dict[str, np.ndarray]:
    """Seeded float32 inputs for every non-initializer graph input (symbolic dims become ``batch``)."""
    inits = {t.name for t in model.graph.initializer}
    rng = _rng(seed)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


ROUND_TRIP: dict[str, Callable[[], onnx.ModelProto]] = {
    "conv_bn_relu": conv_bn_relu,
    "residual_add": residual_add,
    "opset9_initializer_inputs_upsample": opset9_initializer_inputs_upsample,
    "symbolic_batch": symbolic_batch,
    "softmax11_axis1": softmax11_axis1,
    "opset9_upgrades": opset9_upgrades,
    "resize10_nearest": lambda: resize10("nearest"),
    "resize10_linear": lambda: resize10("linear"),
}
