"""A small conv/relu/add/maxpool/gemm network shared by the quantization tests."""

from __future__ import annotations

import onnx

from tests.helpers.onnx_text import rand, text_model

__all__ = ["conv_gemm_net"]


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
