"""Small networks for the SmoothQuant and recurrent int8 tests (onnx text syntax and onnx.helper)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.onnx_text import rand, text_model

__all__ = ["smooth_block", "channel_moves", "outlier_net", "recurrent_net"]


def _outlier_gamma(k: int, seed: int, big: float) -> np.ndarray:
    g = (1.0 + 0.2 * rand(k, seed=seed)).astype(np.float32)
    g[[3, 11]] = big  # two outlier channels, as LayerNorm outputs of trained transformers have
    return g


def smooth_block() -> onnx.ModelProto:
    """Every case of the smooth-quant pass in one graph, x[1,16,32] -> y[1,16,32].

    Smoothed: n1 (LayerNormalization, read by q, k and v), ln2 (the Mul/Add tail of a decomposed
    LayerNorm, read by fc1), z's input y1 (a MatMul's output). Not smoothed: wo reads an Add of two
    computed values, fc2 reads a Relu, and n3 (post-norm) is also read by the residual Add.
    """
    return text_model(
        """g (float[1,16,32] x) => (float[1,16,32] y) {
             n1 = LayerNormalization<axis=-1>(x, g1, b1)
             q = MatMul(n1, wq)
             k = MatMul(n1, wk)
             v = MatMul(n1, wv)
             qk = Add(q, k)
             a = Add(qk, v)
             h = MatMul(a, wo)
             r = Add(h, x)
             mu = ReduceMean<axes=[-1]>(r)
             d = Sub(r, mu)
             d2 = Mul(d, d)
             var = ReduceMean<axes=[-1]>(d2)
             ve = Add(var, eps)
             sd = Sqrt(ve)
             nn = Div(d, sd)
             ng = Mul(nn, g2)
             ln2 = Add(ng, b2)
             f = MatMul(ln2, w1)
             rl = Relu(f)
             y1 = MatMul(rl, w2)
             z = MatMul(y1, w3)
             n3 = LayerNormalization<axis=-1>(z, g3, b3)
             p = MatMul(n3, w4)
             y = Add(p, n3)
           }""",
        g1=_outlier_gamma(32, 1, 12.0),
        b1=rand(32, seed=2, scale=0.1),
        wq=rand(32, 32, seed=3, scale=0.2),
        wk=rand(32, 32, seed=4, scale=0.2),
        wv=rand(32, 32, seed=5, scale=0.2),
        wo=rand(32, 32, seed=6, scale=0.2),
        eps=np.array(1e-5, np.float32),
        g2=_outlier_gamma(32, 7, 8.0),
        b2=rand(32, seed=8, scale=0.1),
        w1=rand(32, 64, seed=9, scale=0.2),
        w2=rand(64, 32, seed=10, scale=0.2),
        w3=rand(32, 32, seed=11, scale=0.2),
        g3=_outlier_gamma(32, 12, 1.0),
        b3=rand(32, seed=13, scale=0.1),
        w4=rand(32, 32, seed=14, scale=0.2),
    )


def channel_moves() -> onnx.ModelProto:
    """A class-token Gather keeps the channel axis (smoothed through it); a Transpose moves it (not)."""
    return text_model(
        """g (float[1,8,16] x) => (float[1,24] y, float[1,16,8] t) {
             n = LayerNormalization<axis=-1>(x, g, b)
             c = Gather<axis=1>(n, zero)
             y = MatMul(c, w)
             n2 = LayerNormalization<axis=-1>(x, g, b)
             tt = Transpose<perm=[0,2,1]>(n2)
             t = MatMul(tt, w2)
           }""",
        g=_outlier_gamma(16, 31, 10.0),
        b=rand(16, seed=32, scale=0.1),
        zero=np.array(0, np.int64),
        w=rand(16, 24, seed=33, scale=0.2),
        w2=rand(8, 8, seed=34, scale=0.2),
    )


def outlier_net() -> onnx.ModelProto:
    """x[1,32,64] -> LayerNorm with outlier gamma channels -> MatMul -> y: the per-tensor x grid suffers."""
    return text_model(
        """g (float[1,32,64] x) => (float[1,32,48] y) {
             n = LayerNormalization<axis=-1>(x, g, b)
             y = MatMul(n, w)
           }""",
        g=_outlier_gamma(64, 21, 40.0),
        b=rand(64, seed=22, scale=0.1),
        w=rand(64, 48, seed=23, scale=0.2),
    )


def recurrent_net(
    op: str, direction: str = "forward", *, hidden: int = 16, size: int = 12
) -> onnx.ModelProto:
    """x[seq=10, batch=1, size] -> ``op`` (LSTM or GRU) -> Y [10, dirs, 1, hidden] and Y_h, weights seeded."""
    gates = {"LSTM": 4, "GRU": 3}[op]
    nd = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(7)

    def f32(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    inits = [
        numpy_helper.from_array(f32(nd, gates * hidden, size, scale=0.4), "W"),
        numpy_helper.from_array(f32(nd, gates * hidden, hidden, scale=0.3), "R"),
        numpy_helper.from_array(f32(nd, 2 * gates * hidden, scale=0.1), "B"),
    ]
    node = helper.make_node(op, ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=hidden, direction=direction)
    graph = helper.make_graph(
        [node],
        op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (10, 1, size))],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, (10, nd, 1, hidden)),
            helper.make_tensor_value_info("y_h", TensorProto.FLOAT, (nd, 1, hidden)),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
