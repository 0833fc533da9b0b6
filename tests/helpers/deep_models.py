"""A small model on which float32 rounding matters: large-mean BatchNorms and an attention tail.

:func:`bn_attention_model` is an OCR-recognizer-shaped network (a data BatchNorm on an input
with per-channel means ~``mean``, conv + BN chains whose BN statistics are those of their real,
large-variance activations, a residual BN before a padded conv, then self-attention over the
feature columns). Its sharp softmaxes amplify every rounding, so onnxruntime itself is ~1e-4 from
the float64 result: the case the verification's rule relative to exact and fold-batchnorm's
centered BN form are for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from compiler.runners import run_onnxruntime

__all__ = ["bn_attention_model"]

C, H, W = 16, 8, 32


def _build(
    stats: dict[str, tuple[np.ndarray, np.ndarray]], data: tuple[np.ndarray, np.ndarray], seed: int
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, a: object, dtype: type = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(a, dtype), name))
        return name

    def node(op: str, ins: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def conv(x: str, k: int, out: str, scale: float = 1.0, shift: float = 0.1) -> str:
        w = init(f"{out}_w", scale * rng.standard_normal((C, C, k, k)) / np.sqrt(C * k * k))
        b = init(f"{out}_b", shift * rng.standard_normal(C))
        return node("Conv", [x, w, b], out, pads=[k // 2] * 4)

    def bn(x: str, out: str, default: tuple[np.ndarray, np.ndarray] = (np.zeros(C), np.ones(C))) -> str:
        g = init(f"{out}_g", 1 + 0.3 * rng.standard_normal(C))
        beta = init(f"{out}_beta", 0.3 * rng.standard_normal(C))
        mu, var = stats.get(x, default)
        return node("BatchNormalization", [x, g, beta, init(f"{out}_mu", mu), init(f"{out}_var", var)], out)

    t = bn("x", "bn0", data)  # data BN: |mu| / sigma ~ mean
    t = node("Relu", [conv(t, 1, "c0")], "a0")
    for i in (1, 2):  # conv + BN on large-variance activations (weights x30, biases x20)
        t = node("HardSwish", [bn(conv(t, 3, f"c{i}", scale=30.0, shift=20.0), f"bn{i}")], f"a{i}")
    s = node("Add", [t, conv(t, 3, "c3", shift=20.0)], "res")  # BN on a residual sum -> padded conv
    t = node("Relu", [conv(bn(s, "bn3"), 3, "c4")], "a4")
    tok = node(
        "Transpose",
        [node("Reshape", [t, init("shape", [0, C, -1], np.int64)], "flat")],
        "tok",
        perm=[0, 2, 1],
    )
    q, k, v = (
        node("MatMul", [tok, init(f"w{n}", 3 * rng.standard_normal((C, C)) / np.sqrt(C))], n) for n in "qkv"
    )
    att = node(
        "Softmax",
        [node("MatMul", [q, node("Transpose", [k], "kt", perm=[0, 2, 1])], "logits")],
        "att",
        axis=-1,
    )
    o = node(
        "MatMul",
        [node("MatMul", [att, v], "ctx"), init("wo", rng.standard_normal((C, 40)) / np.sqrt(C))],
        "o",
    )
    node("Softmax", [o], "y", axis=-1)
    graph = helper.make_graph(
        nodes,
        "bn_attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, H * W, 40])]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, C, H, W]) for n in _BN_INPUTS],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


_BN_INPUTS = ("c1", "c2", "res")  # the BNs whose statistics come from their activations


def bn_attention_model(mean: float = 100.0, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model and its input (per-channel means ~``mean``); every BN's running statistics are
    the mean and variance of its input on that input, set one BN at a time."""
    rng = np.random.default_rng(seed)
    mu0 = mean * (1 + 0.2 * rng.standard_normal(C))
    sd0 = np.exp(0.3 * rng.standard_normal(C))
    noise = np.random.default_rng(seed + 1).standard_normal((1, C, H, W))
    feeds = {"x": (mu0.reshape(1, C, 1, 1) + sd0.reshape(1, C, 1, 1) * noise).astype(np.float32)}
    stats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in _BN_INPUTS:
        prefix = _build(stats, (mu0, sd0**2), seed + 2).SerializeToString()
        act = run_onnxruntime(prefix, feeds)[name].astype(np.float64)
        stats[name] = (act.mean(axis=(0, 2, 3)), act.var(axis=(0, 2, 3)))
    model = _build(stats, (mu0, sd0**2), seed + 2)
    del model.graph.output[1:]
    onnx.checker.check_model(model, full_check=True)
    return model, feeds
