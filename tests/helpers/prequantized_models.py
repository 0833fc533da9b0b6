"""Small float models for the pre-quantized ONNX tests (quantized by onnxruntime in the tests).

* :func:`cnn_model`: Conv/Relu/MaxPool, a 1x1 Conv branch added back, GlobalAveragePool, Gemm;
* :func:`matmul_lstm_model`: MatMul -> LSTM -> Squeeze -> MatMul (Y and Y_h are outputs);
* :func:`bert_model`: BERT-like encoder layers as PyTorch exports them (Q/K/V MatMul + Add,
  Reshape/Transpose heads, scaled scores + the (1 - mask) * -10000 mask, Softmax, output
  projection, residual Add + LayerNormalization, a feed-forward block whose GELU is the erf
  form (layer 0) or the tanh form (layer 1)): onnxruntime's transformer optimizer turns them
  into Attention, SkipLayerNormalization, BiasGelu and FastGelu.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["cnn_model", "matmul_lstm_model", "bert_model", "BERT_HEADS", "BERT_HIDDEN"]

BERT_HEADS = 2
BERT_HIDDEN = 8


def _model(
    nodes: list[onnx.NodeProto],
    name: str,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto],
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _f32(rng: np.random.Generator, name: str, shape: tuple[int, ...], std: float) -> onnx.TensorProto:
    return numpy_helper.from_array(rng.normal(0, std, shape).astype(np.float32), name)


def cnn_model(seed: int = 0) -> onnx.ModelProto:
    """x [1, 3, 16, 16] -> y [1, 5]."""
    rng = np.random.default_rng(seed)
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        mk("Relu", ["c1"], ["r1"], name="relu1"),
        mk("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        mk("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        mk("Relu", ["c2"], ["r2"], name="relu2"),
        mk("Conv", ["p1", "w3"], ["p1b"], name="conv3"),
        mk("Add", ["r2", "p1b"], ["a2"], name="add"),
        mk("GlobalAveragePool", ["a2"], ["gap"], name="gap"),
        mk("Flatten", ["gap"], ["f"], name="flatten"),
        mk("Gemm", ["f", "wg", "bg"], ["y"], transB=1, name="fc"),
    ]
    inits = [
        _f32(rng, "w1", (8, 3, 3, 3), 0.3),
        _f32(rng, "b1", (8,), 0.1),
        _f32(rng, "w2", (8, 8, 3, 3), 0.2),
        _f32(rng, "b2", (8,), 0.1),
        _f32(rng, "w3", (8, 8, 1, 1), 0.3),
        _f32(rng, "wg", (5, 8), 0.3),
        _f32(rng, "bg", (5,), 0.1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])
    return _model(nodes, "cnn", [x], [y], inits)


def matmul_lstm_model(seed: int = 0, *, lstm: bool = True) -> onnx.ModelProto:
    """x [7, 2, 4] -> MatMul -> LSTM(hidden 6) -> Squeeze -> MatMul -> y [7, 2, 3] (and Y_h)."""
    rng = np.random.default_rng(seed)
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "wm"], ["m"], name="proj")]
    inits = [_f32(rng, "wm", (4, 5), 0.5), _f32(rng, "wo", (6 if lstm else 5, 3), 0.4)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 2, 3])]
    if lstm:
        nodes += [
            mk("LSTM", ["m", "W", "R", "B"], ["Y", "Yh", "Yc"], hidden_size=6, name="lstm"),
            mk("Squeeze", ["Y", "ax"], ["ys"], name="squeeze"),
            mk("MatMul", ["ys", "wo"], ["y"], name="head"),
        ]
        inits += [
            _f32(rng, "W", (1, 24, 5), 0.4),
            _f32(rng, "R", (1, 24, 6), 0.4),
            _f32(rng, "B", (1, 48), 0.1),
            numpy_helper.from_array(np.array([1], np.int64), "ax"),
        ]
        outputs.append(helper.make_tensor_value_info("Yh", TensorProto.FLOAT, [1, 2, 6]))
    else:
        nodes.append(mk("MatMul", ["m", "wo"], ["y"], name="head"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 2, 4])
    return _model(nodes, "matmul_lstm" if lstm else "matmul", [x], outputs, inits)


def _bert_layer(
    i: int, x: str, mask: str, rng: np.random.Generator, batch: int, seq: int, tanh_gelu: bool
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    d, n = BERT_HIDDEN, BERT_HEADS
    h = d // n
    p = f"l{i}_"
    mk = helper.make_node
    nodes: list[onnx.NodeProto] = []
    inits = [
        numpy_helper.from_array(np.array([batch, seq, n, h], np.int64), p + "heads"),
        numpy_helper.from_array(np.array([batch, seq, d], np.int64), p + "merged"),
        numpy_helper.from_array(np.array(math.sqrt(h), np.float32), p + "sqrt_h"),
    ]
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        inits += [_f32(rng, f"{p}w{t}", (d, d), 0.4), _f32(rng, f"{p}b{t}", (d,), 0.1)]
        nodes += [
            mk("MatMul", [x, f"{p}w{t}"], [f"{p}{t}_mm"]),
            mk("Add", [f"{p}{t}_mm", f"{p}b{t}"], [f"{p}{t}_add"]),
            mk("Reshape", [f"{p}{t}_add", p + "heads"], [f"{p}{t}_r"]),
            mk("Transpose", [f"{p}{t}_r"], [f"{p}{t}_t"], perm=perm),
        ]
    inits += [
        _f32(rng, p + "wo", (d, d), 0.4),
        _f32(rng, p + "bo", (d,), 0.1),
        _f32(rng, p + "w1", (d, 2 * d), 0.4),
        _f32(rng, p + "b1", (2 * d,), 0.1),
        _f32(rng, p + "w2", (2 * d, d), 0.4),
        _f32(rng, p + "b2", (d,), 0.1),
    ]
    for k in ("ln1", "ln2"):
        inits += [
            numpy_helper.from_array((1 + rng.normal(0, 0.1, d)).astype(np.float32), f"{p}{k}_g"),
            _f32(rng, f"{p}{k}_b", (d,), 0.1),
        ]
    nodes += [
        mk("MatMul", [p + "q_t", p + "k_t"], [p + "qk"]),
        mk("Div", [p + "qk", p + "sqrt_h"], [p + "scores"]),
        mk("Add", [p + "scores", mask], [p + "masked"]),
        mk("Softmax", [p + "masked"], [p + "probs"], axis=-1),
        mk("MatMul", [p + "probs", p + "v_t"], [p + "ctx"]),
        mk("Transpose", [p + "ctx"], [p + "ctx_t"], perm=[0, 2, 1, 3]),
        mk("Reshape", [p + "ctx_t", p + "merged"], [p + "ctx_r"]),
        mk("MatMul", [p + "ctx_r", p + "wo"], [p + "o_mm"]),
        mk("Add", [p + "o_mm", p + "bo"], [p + "o"]),
        mk("Add", [p + "o", x], [p + "res1"]),
        mk("LayerNormalization", [p + "res1", p + "ln1_g", p + "ln1_b"], [p + "ln1"], axis=-1, epsilon=1e-12),
        mk("MatMul", [p + "ln1", p + "w1"], [p + "f1_mm"]),
        mk("Add", [p + "f1_mm", p + "b1"], [p + "f1"]),
    ]
    f1, g = p + "f1", p + "gelu"
    if tanh_gelu:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        inits += [
            numpy_helper.from_array(np.array(v, np.float32), p + k)
            for k, v in (
                ("three", 3.0),
                ("c", 0.044715),
                ("s2pi", math.sqrt(2 / math.pi)),
                ("one", 1.0),
                ("half", 0.5),
            )
        ]
        nodes += [
            mk("Pow", [f1, p + "three"], [p + "x3"]),
            mk("Mul", [p + "x3", p + "c"], [p + "cx3"]),
            mk("Add", [f1, p + "cx3"], [p + "inner"]),
            mk("Mul", [p + "inner", p + "s2pi"], [p + "arg"]),
            mk("Tanh", [p + "arg"], [p + "th"]),
            mk("Add", [p + "th", p + "one"], [p + "th1"]),
            mk("Mul", [f1, p + "half"], [p + "xh"]),
            mk("Mul", [p + "xh", p + "th1"], [g]),
        ]
    else:  # x * 0.5 (1 + erf(x / sqrt 2))
        inits += [
            numpy_helper.from_array(np.array(v, np.float32), p + k)
            for k, v in (("sqrt2", math.sqrt(2.0)), ("one", 1.0), ("half", 0.5))
        ]
        nodes += [
            mk("Div", [f1, p + "sqrt2"], [p + "xs"]),
            mk("Erf", [p + "xs"], [p + "erf"]),
            mk("Add", [p + "erf", p + "one"], [p + "erf1"]),
            mk("Mul", [f1, p + "erf1"], [p + "xe"]),
            mk("Mul", [p + "xe", p + "half"], [g]),
        ]
    nodes += [
        mk("MatMul", [g, p + "w2"], [p + "f2_mm"]),
        mk("Add", [p + "f2_mm", p + "b2"], [p + "f2"]),
        mk("Add", [p + "f2", p + "ln1"], [p + "res2"]),
        mk("LayerNormalization", [p + "res2", p + "ln2_g", p + "ln2_b"], [p + "out"], axis=-1, epsilon=1e-12),
    ]
    return nodes, inits, p + "out"


def bert_model(seed: int = 0, *, batch: int = 2, seq: int = 5) -> onnx.ModelProto:
    """x [batch, seq, 8] float and attention_mask [batch, seq] int64 -> y, two encoder layers."""
    rng = np.random.default_rng(seed)
    mk = helper.make_node
    nodes = [
        mk("Unsqueeze", ["attention_mask", "ax1"], ["m1"]),
        mk("Unsqueeze", ["m1", "ax2"], ["m2"]),
        mk("Cast", ["m2"], ["mf"], to=TensorProto.FLOAT),
        mk("Sub", ["one", "mf"], ["inv"]),
        mk("Mul", ["inv", "neg"], ["mask_add"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array([2], np.int64), "ax2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(-10000.0, np.float32), "neg"),
    ]
    x = "x"
    for i in range(2):
        layer, layer_inits, x = _bert_layer(i, x, "mask_add", rng, batch, seq, tanh_gelu=i == 1)
        nodes += layer
        inits += layer_inits
    nodes.append(mk("Identity", [x], ["y"]))
    ins = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, BERT_HIDDEN]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, seq]),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, BERT_HIDDEN])]
    return _model(nodes, "bert", ins, outs, inits)
