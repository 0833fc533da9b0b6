"""A zoo of small ONNX models that covers the ops the MNN writer lowers (ONNX text format).

Each builder is deterministic (weights from a seeded generator). :data:`ZOO` maps a name
to its builder; :func:`zoo_feeds` gives seeded inputs for every graph input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import numpy_helper, parser

__all__ = ["ZOO", "zoo_feeds"]

Spec = tuple[int, ...] | np.ndarray
"""An initializer: a shape (seeded N(0, 1/fan_in) weights) or the array itself."""


def _model(text: str, weights: Mapping[str, Spec], seed: int) -> onnx.ModelProto:
    model = parser.parse_model(text)
    rng = np.random.default_rng(seed)
    for name, spec in weights.items():
        if isinstance(spec, np.ndarray):
            arr = spec
        else:
            fan_in = int(np.prod(spec[1:])) if len(spec) > 1 else 1
            arr = (rng.standard_normal(spec) / np.sqrt(max(fan_in, 1))).astype(np.float32)
        model.graph.initializer.append(numpy_helper.from_array(arr, name))
    for i, n in enumerate(model.graph.node):
        n.name = f"{n.op_type.lower()}_{i}"
    onnx.checker.check_model(model, full_check=True)
    return model


_HEAD = '<ir_version: 8, opset_import: ["" : 14]>'


def conv_family() -> onnx.ModelProto:
    """Conv + fused Relu / Clip(0,6) / HardSwish / Sigmoid / LeakyRelu; depthwise, grouped,
    dilated, SAME-padded stride-2 convs, a residual add with ReLU, a Conv without bias."""
    text = f"""{_HEAD}
    convs (float[1,8,17,15] x) => (float[1,16,9,8] y, float[1,8,17,15] r) {{
        c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
        a1 = Relu (c1)
        d1 = Conv <group = 8, pads = [1,1,1,1]> (a1, wd, bd)
        a2 = Clip (d1, lo, hi)
        g1 = Conv <group = 2, pads = [2,2,2,2], dilations = [2,2]> (a2, wg, bg)
        a3 = HardSwish (g1)
        s1 = Conv (a3, w1x1)
        a4 = Sigmoid (s1)
        m = Add (a4, x)
        r = Relu (m)
        c2 = Conv <strides = [2,2], auto_pad = "SAME_UPPER"> (r, w2, b2)
        y = LeakyRelu <alpha = 0.1> (c2)
    }}
    """
    w: dict[str, Spec] = {
        "w1": (8, 8, 3, 3),
        "b1": (8,),
        "wd": (8, 1, 3, 3),
        "bd": (8,),
        "wg": (8, 4, 3, 3),
        "bg": (8,),
    }
    w |= {"w1x1": (8, 8, 1, 1), "w2": (16, 8, 3, 3), "b2": (16,)}
    w |= {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    return _model(text, w, 1)


def deconv() -> onnx.ModelProto:
    """ConvTranspose: stride 2 with pads and output_padding; a depthwise one; a grouped one."""
    text = f"""{_HEAD}
    deconv (float[1,6,5,7] x) => (float[1,4,10,14] y, float[1,6,11,15] z, float[1,4,7,9] u) {{
        y = ConvTranspose <strides = [2,2], pads = [1,1,1,1], output_padding = [1,1]> (x, w1, b1)
        z = ConvTranspose <group = 6, strides = [2,2]> (x, wd, bd)
        u = ConvTranspose <group = 2> (x, wg)
    }}
    """
    w: dict[str, Spec] = {"w1": (6, 4, 3, 3), "b1": (4,), "wd": (6, 1, 3, 3), "bd": (6,), "wg": (6, 2, 3, 3)}
    return _model(text, w, 2)


def gemm_matmul() -> onnx.ModelProto:
    """Flatten -> Gemm(transB, alpha, beta) -> Relu -> Gemm -> Softmax; MatMul with a constant
    3-D input and a variable-by-variable MatMul (2-D and batched)."""
    text = f"""{_HEAD}
    fc (float[2,3,4,4] x, float[2,5,6] s, float[6,3] t, float[2,6,4] v) =>
       (float[2,7] y, float[2,5,9] m, float[10,3] p, float[2,5,4] q) {{
        f = Flatten (x)
        g1 = Gemm <transB = 1, alpha = 0.5, beta = 2.0> (f, wa, ba)
        a = Relu (g1)
        g2 = Gemm (a, wb, bb)
        y = Softmax (g2)
        m = MatMul (s, wc)
        s2 = Reshape (s, shp)
        p = MatMul (s2, t)
        q = MatMul (s, v)
    }}
    """
    w: dict[str, Spec] = {"wa": (10, 48), "ba": (10,), "wb": (10, 7), "bb": (1, 7), "wc": (6, 9)}
    w |= {"shp": np.array([-1, 6], np.int64)}
    model = _model(text, w, 3)
    return model


def pooling() -> onnx.ModelProto:
    """Max/Average pools (pads, ceil mode, count_include_pad), global pools, reductions."""
    text = f"""{_HEAD}
    pools (float[1,5,13,11] x) => (float[1,5,7,6] a, float[1,5,7,6] b, float[1,5,7,6] c, float[1,5,7,6] d,
                                   float[1,5,1,1] e, float[1,5,1,1] f, float[1,5,1,1] g, float[1,13,11] h,
                                   float[1,5,13,1] i) {{
        a = MaxPool <kernel_shape = [3,3], strides = [2,2], pads = [1,1,1,1]> (x)
        b = MaxPool <kernel_shape = [2,2], strides = [2,2], ceil_mode = 1> (x)
        c = AveragePool <kernel_shape = [3,3], strides = [2,2], pads = [1,1,1,1]> (x)
        d = AveragePool <kernel_shape = [3,3], strides = [2,2], pads = [1,1,1,1], count_include_pad = 1> (x)
        e = GlobalAveragePool (x)
        f = GlobalMaxPool (x)
        g = ReduceMean <keepdims = 1, axes = [2, 3]> (x)
        h = ReduceSum <keepdims = 0> (x, one)
        i = ReduceMax <keepdims = 1, axes = [-1]> (x)
    }}
    """
    return _model(text, {"one": np.array([1], np.int64)}, 4)


def resize() -> onnx.ModelProto:
    """Resize: nearest (asymmetric/floor, half_pixel/round_prefer_floor) and linear
    (align_corners, half_pixel, pytorch_half_pixel, asymmetric), integer and fractional sizes."""
    text = f"""{_HEAD}
    resize (float[1,3,5,6] x) => (float[1,3,10,12] a, float[1,3,9,13] b, float[1,3,10,12] c,
                                  float[1,3,7,9] d, float[1,3,8,11] e, float[1,3,10,12] f) {{
        a = Resize <mode = "nearest", coordinate_transformation_mode = "asymmetric", nearest_mode = "floor"> (x, , sc2)
        b = Resize <mode = "nearest"> (x, , , szb)
        c = Resize <mode = "linear", coordinate_transformation_mode = "align_corners"> (x, , sc2)
        d = Resize <mode = "linear"> (x, , , szd)
        e = Resize <mode = "linear", coordinate_transformation_mode = "pytorch_half_pixel"> (x, , , sze)
        f = Resize <mode = "linear", coordinate_transformation_mode = "asymmetric"> (x, , sc2)
    }}
    """
    w: dict[str, Spec] = {
        "sc2": np.array([1, 1, 2, 2], np.float32),
        "szb": np.array([1, 3, 9, 13], np.int64),
        "szd": np.array([1, 3, 7, 9], np.int64),
        "sze": np.array([1, 3, 8, 11], np.int64),
    }
    return _model(text, w, 5)


def concat_softmax() -> onnx.ModelProto:
    """Concat of conv outputs on channels and of 3-D tensors; Softmax on 4-D (axis 1) and 3-D."""
    text = f"""{_HEAD}
    cat (float[1,4,6,6] x) => (float[1,7,6,6] y, float[1,36,7] z) {{
        c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
        c2 = Conv (x, w2, b2)
        k = Concat <axis = 1> (c1, c2, x)
        y = Softmax <axis = 1> (k)
        t = Transpose <perm = [0,2,3,1]> (y)
        r = Reshape (t, shp)
        z = Softmax <axis = -1> (r)
    }}
    """
    w: dict[str, Spec] = {
        "w1": (2, 4, 3, 3),
        "b1": (2,),
        "w2": (1, 4, 1, 1),
        "b2": (1,),
        "shp": np.array([1, -1, 7], np.int64),
    }
    return _model(text, w, 6)


def shape_ops() -> onnx.ModelProto:
    """Slice (steps, negative step, clamped ends), Gather (scalar and vector indices), Pad
    (constant value, reflect, edge), Split, Squeeze/Unsqueeze, Cast, Transpose."""
    text = f"""{_HEAD}
    shapes (float[2,6,5,4] x) => (float[2,4,5,2] a, float[2,6,4] b, float[2,2,5,4] c, float[2,6,7,6] d,
                                  float[2,6,7,4] e, float[2,6,5,6] f, float[2,2,5,4] g, float[2,4,5,4] h,
                                  float[1,2,6,5,4] i, float[6,2,4,5] j, float[2,6,5,4] k) {{
        a = Slice (x, st, en, ax, sp)
        b = Gather <axis = 2> (x, i0)
        c = Gather <axis = 1> (x, iv)
        d = Pad <mode = "constant"> (x, pd, pv)
        e = Pad <mode = "reflect"> (x, pr)
        f = Pad <mode = "edge"> (x, pe)
        g, h = Split <axis = 1> (x, sz)
        u = Unsqueeze (x, ua)
        i = Squeeze (u, ua2)
        j = Transpose <perm = [1,0,3,2]> (x)
        q = Cast <to = 6> (x)
        k = Cast <to = 1> (q)
    }}
    """
    w: dict[str, Spec] = {
        "st": np.array([3, -1], np.int64),
        "en": np.array([-100, -10], np.int64),
        "ax": np.array([1, 3], np.int64),
        "sp": np.array([-1, -2], np.int64),
        "i0": np.array(-2, np.int64),
        "iv": np.array([5, 0], np.int64),
        "pd": np.array([0, 0, 1, 0, 0, 0, 1, 2], np.int64),
        "pv": np.array(0.5, np.float32),
        "pr": np.array([0, 0, 1, 0, 0, 0, 1, 0], np.int64),
        "pe": np.array([0, 0, 0, 1, 0, 0, 0, 1], np.int64),
        "sz": np.array([2, 4], np.int64),
        "ua": np.array([0, 1], np.int64),
        "ua2": np.array([1], np.int64),
    }
    return _model(text, w, 7)


def elementwise() -> onnx.ModelProto:
    """Broadcasting binary ops with scalar, per-channel and variable operands; unary math;
    HardSigmoid, PRelu, Clip with other bounds."""
    text = f"""{_HEAD}
    elem (float[1,4,5,6] x, float[1,4,1,1] s, float[6] v) => (float[1,4,5,6] y, float[1,4,5,6] z,
                                                           float[1,4,5,6] u, float[1,4,5,6] w) {{
        c = Conv <pads = [1,1,1,1]> (x, wc, bc)
        a = Add (c, x)
        m = Mul (a, s)
        d = Div (m, two)
        e = Sub (d, chan)
        p = Max (e, v)
        q = Min (p, three)
        y = Pow (q, two)
        ex = Exp (q)
        ab = Abs (x)
        sq = Sqrt (ab)
        th = Tanh (sq)
        z = Add (ex, th)
        hs = HardSigmoid <alpha = 0.3, beta = 0.4> (c)
        u = PRelu (hs, sl)
        ng = Neg (x)
        cl = Clip (ng, lo, hi)
        w = Mul (cl, c)
    }}
    """
    w: dict[str, Spec] = {"wc": (4, 4, 3, 3), "bc": (4,)}
    w |= {
        "two": np.array(2.0, np.float32),
        "three": np.array(3.0, np.float32),
        "chan": np.array([0.1, -0.2, 0.3, 0.5], np.float32).reshape(4, 1, 1),
        "sl": np.array([0.1, 0.2, 0.3, -0.5], np.float32).reshape(4, 1, 1),
        "lo": np.array(-1.0, np.float32),
        "hi": np.array(2.0, np.float32),
    }
    return _model(text, w, 8)


ZOO: dict[str, Callable[[], onnx.ModelProto]] = {
    "conv_family": conv_family,
    "deconv": deconv,
    "gemm_matmul": gemm_matmul,
    "pooling": pooling,
    "resize": resize,
    "concat_softmax": concat_softmax,
    "shape_ops": shape_ops,
    "elementwise": elementwise,
}


def zoo_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded N(0, 1) float32 inputs for every non-initializer graph input."""
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        if vi.name not in inits:
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds
