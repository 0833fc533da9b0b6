"""Small networks shared by the quantization tests: a conv/relu/add/maxpool/gemm net, an encoder
block in decomposed form, and a near-cancellation that int8 must miss."""

from __future__ import annotations

import numpy as np
import onnx

from tests.helpers.onnx_text import rand, text_model

__all__ = ["conv_gemm_net", "encoder_block", "cancellation_net"]


def conv_gemm_net(*, pooled_output: bool = False) -> onnx.ModelProto:
    """x -> conv,relu -> conv + skip -> maxpool -> GAP -> flatten -> gemm -> y (and p, the pool, if asked)."""
    outputs = "float[1,8] y, float[1,4,4,4] p" if pooled_output else "float[1,8] y"
    return text_model(
        f"""g (float[1,3,8,8] x) => ({outputs}) {{
             c1 = Conv<pads=[1,1,1,1]>(x, w1, b1)
             r1 = Relu(c1)
             c2 = Conv<pads=[1,1,1,1]>(r1, w2, b2)
             s = Add(c2, r1)
             p = MaxPool<kernel_shape=[2,2],strides=[2,2]>(s)
             g = GlobalAveragePool(p)
             f = Flatten(g)
             y = Gemm<transB=1>(f, wf, bf)
           }}""",
        w1=rand(4, 3, 3, 3, seed=1, scale=0.4),
        b1=rand(4, seed=2),
        w2=rand(4, 4, 3, 3, seed=3, scale=0.3),
        b2=rand(4, seed=4),
        wf=rand(8, 4, seed=5),
        bf=rand(8, seed=6),
    )


def encoder_block() -> onnx.ModelProto:
    """A post-norm transformer block with every pattern of the quantization policy in decomposed form.

    x[1,8,16] -> q k^T / 4 + mask -> softmax -> @ v -> proj -> + x (residual) -> decomposed LayerNorm
    (mean, x - mean, square, mean, + eps, sqrt, divide, * gamma, + beta) -> dense -> GELU in Erf form
    (x/2 (1 + erf(x / sqrt 2))) -> dense -> y.
    """
    return text_model(
        """g (float[1,8,16] x, float[1,1,8,8] mask) => (float[1,8,16] y) {
             q = MatMul(x, wq)
             k = MatMul(x, wk)
             v = MatMul(x, wv)
             kt = Transpose<perm=[0,2,1]>(k)
             qk = MatMul(q, kt)
             sc = Div(qk, four)
             sc4 = Unsqueeze(sc, zero)
             sm = Add(sc4, mask)
             p4 = Softmax<axis=-1>(sm)
             p = Squeeze(p4, zero)
             a = MatMul(p, v)
             o = MatMul(a, wo)
             r = Add(o, x)
             mu = ReduceMean<axes=[-1]>(r)
             d = Sub(r, mu)
             d2 = Mul(d, d)
             var = ReduceMean<axes=[-1]>(d2)
             ve = Add(var, eps)
             sd = Sqrt(ve)
             n = Div(d, sd)
             ng = Mul(n, gamma)
             ln = Add(ng, beta)
             h = MatMul(ln, w1)
             hb = Add(h, b1)
             hs = Div(hb, sqrt2)
             e = Erf(hs)
             e1 = Add(e, one)
             hm = Mul(hb, e1)
             gl = Mul(hm, half)
             y = MatMul(gl, w2)
           }""",
        wq=rand(16, 16, seed=1, scale=0.25),
        wk=rand(16, 16, seed=2, scale=0.25),
        wv=rand(16, 16, seed=3, scale=0.25),
        wo=rand(16, 16, seed=4, scale=0.25),
        w1=rand(16, 32, seed=5, scale=0.25),
        b1=rand(32, seed=6, scale=0.1),
        w2=rand(32, 16, seed=7, scale=0.2),
        gamma=rand(16, seed=8, positive=True),
        beta=rand(16, seed=9, scale=0.1),
        four=np.array(4.0, np.float32),
        eps=np.array(1e-5, np.float32),
        sqrt2=np.array(np.sqrt(2.0), np.float32),
        one=np.array(1.0, np.float32),
        half=np.array(0.5, np.float32),
        zero=np.array([0], np.int64),
    )


def cancellation_net() -> onnx.ModelProto:
    """y = x W1^T - x W2^T with W2 = W1 (1 + 1e-4 noise): the output is a near-cancellation.

    Each Gemm's int8 weight rounding (about max|W|/254 per entry) is some 30 times the difference
    W1 - W2, so int8 must miss any SQNR floor above 0 dB, while float computes y exactly enough.
    """
    w1 = rand(8, 16, seed=11)
    w2 = (w1 * (1.0 + 1e-4 * rand(8, 16, seed=12))).astype(np.float32)
    return text_model(
        """g (float[1,16] x) => (float[1,8] y) {
             a = Gemm<transB=1>(x, w1)
             b = Gemm<transB=1>(x, w2)
             y = Sub(a, b)
           }""",
        w1=w1,
        w2=w2,
    )
