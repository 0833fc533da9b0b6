"""Small networks for the SmoothQuant and recurrent int8 tests (onnx text syntax and onnx.helper)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.onnx_text import rand, text_model

__all__ = [
    "smooth_block",
    "channel_moves",
    "attention_block",
    "channel_mixes",
    "scaled_input",
    "outlier_net",
    "recurrent_net",
]


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


def _outlier_columns(rows: int, cols: int, seed: int, big: float, picks: tuple[int, ...]) -> np.ndarray:
    w = rand(rows, cols, seed=seed, scale=0.2)
    w[:, list(picks)] *= big  # V's outlier channels: the out projection's input inherits them
    return w


def attention_block(*, fused: bool = False) -> onnx.ModelProto:
    """Pre-norm self-attention, x[1,16,32] -> y[1,16,32], 4 heads of 8, V with outlier channels.

    q, k, v = LN(x) W + b (``fused``: one MatMul to 96 columns and a Split, as GPT-2 writes it);
    heads by Reshape [1,16,4,8] and Transpose [0,2,1,3]; c = softmax(q k^T / sqrt(8)) v; back by
    Transpose and Reshape to ctx [1,16,32]; y = ctx W_o + b_o + x. Groups: n (LN, read by the
    projections) and ctx (folded into v's columns and bias through the heads and the MatMul).
    """
    heads = """
             qh = Reshape(q, hs)
             kh = Reshape(k, hs)
             vh = Reshape(v, hs)
             qt = Transpose<perm=[0,2,1,3]>(qh)
             kt = Transpose<perm=[0,2,3,1]>(kh)
             vt = Transpose<perm=[0,2,1,3]>(vh)
             sc = MatMul(qt, kt)
             sd = Mul(sc, scale)
             pr = Softmax<axis=-1>(sd)
             c = MatMul(pr, vt)
             ct = Transpose<perm=[0,2,1,3]>(c)
             ctx = Reshape(ct, cs)
             o = MatMul(ctx, wo)
             ob = Add(o, bo)
             y = Add(ob, x)
           }"""
    common: dict[str, np.ndarray] = {
        "g1": (1.0 + 0.2 * rand(32, seed=41)).astype(np.float32),
        "b1": rand(32, seed=42, scale=0.1),
        "hs": np.array([1, 16, 4, 8], np.int64),
        "cs": np.array([1, 16, 32], np.int64),
        "scale": np.array(8**-0.5, np.float32),
        "wo": rand(32, 32, seed=43, scale=0.2),
        "bo": rand(32, seed=44, scale=0.1),
    }
    if fused:
        wqkv = _outlier_columns(32, 96, 45, 12.0, (64 + 5, 64 + 20))
        fused_inits = {
            "wqkv": wqkv,
            "bqkv": rand(96, seed=46, scale=0.1),
            "parts": np.array([32, 32, 32], np.int64),
        }
        return text_model(
            """g (float[1,16,32] x) => (float[1,16,32] y) {
             n = LayerNormalization<axis=-1>(x, g1, b1)
             m = MatMul(n, wqkv)
             mb = Add(m, bqkv)
             q, k, v = Split<axis=2>(mb, parts)"""
            + heads,
            17,
            8,
            **fused_inits,
            **common,
        )
    inits = {
        "wq": rand(32, 32, seed=47, scale=0.2),
        "bq": rand(32, seed=48, scale=0.1),
        "wk": rand(32, 32, seed=49, scale=0.2),
        "bk": rand(32, seed=50, scale=0.1),
        "wv": _outlier_columns(32, 32, 51, 12.0, (5, 20)),
        "bv": rand(32, seed=52, scale=0.1),
    }
    return text_model(
        """g (float[1,16,32] x) => (float[1,16,32] y) {
             n = LayerNormalization<axis=-1>(x, g1, b1)
             qm = MatMul(n, wq)
             q = Add(qm, bq)
             km = MatMul(n, wk)
             k = Add(km, bk)
             vm = MatMul(n, wv)
             v = Add(vm, bv)"""
        + heads,
        17,
        8,
        **inits,
        **common,
    )


def channel_mixes() -> onnx.ModelProto:
    """Paths that mix channels, x[1,16,32]: none of m1, m2, m3 can be smoothed into v's projection.

    m1 = v G: v's channels are contracted (G = softmax(n^T n), the columns come from it);
    m2 = reshape(a a^T, [1,4,1024]) with a = reshape(v2, [1,64,8]): a channel of m2 is a row and a
    column of the product (the channel index lies on both);
    m3 = reshape(v, [1,8,64]): two tokens per row, so a channel of m3 is v's channel j or 32 + j
    by the token's parity (a reshape that does not permute the channels);
    m4 = one head of 8 expanded to 4 (grouped-query attention's repeat): 4 channels of m4 share
    each channel of v4, which can take only one scale.
    """
    return text_model(
        """g (float[1,16,32] x) => (float[1,16,24] y1, float[1,4,24] y2, float[1,8,24] y3,
                                   float[1,16,24] y4) {
             n = LayerNormalization<axis=-1>(x, g, b)
             v = MatMul(n, wv)
             nt = Transpose<perm=[0,2,1]>(n)
             gg = MatMul(nt, n)
             gm = Softmax<axis=-1>(gg)
             m1 = MatMul(v, gm)
             y1 = MatMul(m1, w1)
             v2 = MatMul(n, wv2)
             a = Reshape(v2, s4)
             at = Transpose<perm=[0,2,1]>(a)
             aa = MatMul(a, at)
             m2 = Reshape(aa, s2)
             y2 = MatMul(m2, w2)
             v3 = MatMul(n, wv3)
             m3 = Reshape(v3, s3)
             y3 = MatMul(m3, w3)
             v4 = MatMul(n, wv4)
             h4 = Reshape(v4, s41)
             e4 = Expand(h4, s44)
             m4 = Reshape(e4, s40)
             y4 = MatMul(m4, w1)
           }""",
        g=(1.0 + 0.2 * rand(32, seed=61)).astype(np.float32),
        b=rand(32, seed=62, scale=0.1),
        wv=_outlier_columns(32, 32, 63, 12.0, (5,)),
        w1=rand(32, 24, seed=64, scale=0.2),
        wv2=_outlier_columns(32, 32, 65, 12.0, (5,)),
        s4=np.array([1, 64, 8], np.int64),
        s2=np.array([1, 4, 1024], np.int64),
        w2=rand(1024, 24, seed=66, scale=0.05),
        wv3=_outlier_columns(32, 32, 67, 12.0, (5,)),
        s3=np.array([1, 8, 64], np.int64),
        w3=rand(64, 24, seed=68, scale=0.2),
        wv4=_outlier_columns(32, 8, 69, 12.0, (5,)),
        s41=np.array([1, 16, 1, 8], np.int64),
        s44=np.array([1, 16, 4, 8], np.int64),
        s40=np.array([1, 16, 32], np.int64),
    )


def scaled_input() -> onnx.ModelProto:
    """x[1,32,64] -> x * c (two outlier channels of c) -> MatMul -> y[1,32,48]: X's tails are x's."""
    c = (1.0 + 0.2 * rand(64, seed=71)).astype(np.float32)
    c[[3, 11]] = 20.0
    return text_model(
        """g (float[1,32,64] x) => (float[1,32,48] y) {
             h = Mul(x, c)
             y = MatMul(h, w)
           }""",
        c=c,
        w=rand(64, 48, seed=72, scale=0.2),
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
