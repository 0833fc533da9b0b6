"""NN ops (conv, pooling, normalization, linalg, resize, reductions, Q/DQ) against onnxruntime.

Each case runs one op in onnxruntime (opset 21, CPU, no graph optimization),
calls the registry reference directly, and builds a Kiln node whose non-data
inputs are constants. Float32 outputs must agree within rtol=1e-5 and
atol=1e-5 * max(1, max|expected|); integer (quantized, index) outputs exactly.
The inferred output types must equal the actual ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.ir.types import DType, TensorType
from compiler.ir.verifier import verify
from compiler.ops import get_op
from compiler.ops.registry import Layout, QuantPolicy, ShapeError
from tests.helpers.numerics import assert_close
from tests.helpers.single_op import kiln_node, run_ort

F32, U8, I8 = DType.FLOAT32, DType.UINT8, DType.INT8
RTOL = 1e-5
P1 = (1, 1, 1, 1)
P_ASYM = (1, 0, 2, 1)


def f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def pos(*shape: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(shape) + 0.5).astype(np.float32)


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def fl(*v: float) -> np.ndarray:
    return np.array(v, dtype=np.float32)


@dataclass
class Case:
    """One op application; ``consts`` are the inputs that are constants in the Kiln graph."""

    op: str
    inputs: list[Any]  # arrays (numpy scalars allowed) or None for an omitted input
    attrs: dict[str, Any] = field(default_factory=dict)
    n_out: int = 1
    consts: tuple[int, ...] | None = None  # default: every input but the first

    def __str__(self) -> str:
        shapes = ",".join("-" if x is None else "x".join(map(str, x.shape)) for x in self.inputs)
        return f"{self.op}({shapes}){self.attrs or ''}"


x1 = f32(2, 4, 9, 11)
w_g2 = f32(6, 2, 3, 3, seed=1)
b6 = f32(6, seed=2)
w_dw = f32(8, 1, 3, 3, seed=3)
wt = f32(4, 3, 3, 3, seed=4)
img = f32(1, 3, 16, 20, seed=5)
pool_x = f32(2, 3, 10, 11, seed=6)
ch5 = [f32(5, seed=7), f32(5, seed=8), f32(5, seed=9), pos(5, seed=10)]
q_x = (f32(2, 4, 5, 6, seed=11) * 3).astype(np.float32)
q_x.reshape(-1)[:24] = np.arange(24, dtype=np.float32) * 0.25 - 3.0  # exact ties at scale 0.5
q_int8 = np.random.default_rng(12).integers(-128, 128, (2, 4, 5, 6)).astype(np.int8)
scale4 = (np.random.default_rng(13).random(4) * 0.1 + 0.01).astype(np.float32)
zp4 = np.array([-3, 0, 5, 7], dtype=np.int8)

CONV = [
    Case("Conv", [x1, w_g2, b6], {"group": 2, "strides": (2, 1), "pads": (1, 0, 2, 1), "dilations": (1, 2)}),
    Case("Conv", [x1, w_dw], {"group": 4, "pads": P1}),  # depthwise, channel multiplier 2
    Case("Conv", [x1, f32(4, 1, 3, 3, seed=14)], {"group": 4, "strides": (2, 2), "dilations": (2, 2)}),
    *[
        Case("Conv", [x1, w_g2], {"group": 2, "strides": (2, 3), "auto_pad": ap})
        for ap in ("SAME_UPPER", "SAME_LOWER", "VALID")
    ],
    Case("Conv", [img, f32(16, 3, 3, 3, seed=15), f32(16, seed=16)], {"kernel_shape": (3, 3), "pads": P1}),
    Case("Conv", [img, f32(8, 3, 1, 1, seed=17)]),
    Case("Conv", [f32(2, 4, 20), f32(5, 4, 4, seed=18)], {"strides": (3,), "pads": (2, 1)}),
    Case(
        "Conv",
        [f32(1, 2, 5, 6, 7), f32(3, 2, 2, 3, 2, seed=19)],
        {"strides": (1, 2, 1), "pads": (1, 0, 1, 0, 1, 1)},
    ),
    Case(
        "ConvTranspose",
        [x1, wt, b6],
        {"group": 2, "strides": (2, 3), "pads": (1, 0, 2, 1), "output_padding": (1, 0)},
    ),
    Case("ConvTranspose", [x1, wt, b6], {"group": 2, "strides": (2, 2), "dilations": (2, 1)}),
    Case("ConvTranspose", [x1, f32(4, 1, 3, 3, seed=20)], {"group": 4, "strides": (2, 2), "pads": P1}),
    *[
        Case("ConvTranspose", [x1, wt], {"group": 2, "strides": (2, 3), "auto_pad": ap})
        for ap in ("SAME_UPPER", "SAME_LOWER")
    ],
    *[
        Case(
            "ConvTranspose",
            [x1, wt],
            {"group": 2, "strides": (2, 2), "auto_pad": a, "output_shape": (18, 20)},
        )
        for a in ("NOTSET", "SAME_UPPER", "SAME_LOWER")
    ],
    Case("ConvTranspose", [f32(2, 3, 7), f32(3, 2, 4, seed=21)], {"strides": (3,), "output_shape": (23,)}),
]

POOL = [
    *[
        Case(op, [pool_x], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": P1, **extra})
        for op, extra in (("MaxPool", {}), ("AveragePool", {}), ("AveragePool", {"count_include_pad": 1}))
    ],
    *[
        Case(
            op, [pool_x], {"kernel_shape": (3, 2), "strides": (2, 3), "pads": P_ASYM, "ceil_mode": 1, **extra}
        )
        for op, extra in (("MaxPool", {}), ("AveragePool", {}), ("AveragePool", {"count_include_pad": 1}))
    ],
    *[
        Case(op, [pool_x], {"kernel_shape": (3, 3), "strides": (3, 3), "ceil_mode": 1, **extra})
        for op, extra in (("MaxPool", {}), ("AveragePool", {"count_include_pad": 1}))
    ],
    Case(
        "MaxPool",
        [pool_x],
        {
            "kernel_shape": (3, 3),
            "strides": (2, 2),
            "dilations": (2, 2),
            "pads": (1, 2, 1, 1),
            "ceil_mode": 1,
        },
    ),
    Case(
        "AveragePool",
        [pool_x],
        {"kernel_shape": (2, 3), "dilations": (2, 1), "pads": P1, "count_include_pad": 1},
    ),
    *[
        Case(op, [pool_x], {"kernel_shape": (3, 4), "strides": (2, 3), "auto_pad": ap})
        for op in ("MaxPool", "AveragePool")
        for ap in ("SAME_UPPER", "SAME_LOWER", "VALID")
    ],
    Case("MaxPool", [pool_x], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": P1}, n_out=2),
    Case(
        "MaxPool",
        [pool_x],
        {"kernel_shape": (3, 2), "strides": (2, 3), "pads": P_ASYM, "ceil_mode": 1, "storage_order": 1},
        n_out=2,
    ),
    Case("MaxPool", [f32(2, 3, 10)], {"kernel_shape": (3,), "strides": (2,), "pads": (1, 1)}, n_out=2),
    Case("MaxPool", [f32(1, 2, 5, 6, 7)], {"kernel_shape": (2, 2, 3), "strides": (2, 2, 2)}, n_out=2),
    Case("MaxPool", [q_int8], {"kernel_shape": (2, 2), "strides": (2, 2), "ceil_mode": 1}),
    Case("GlobalAveragePool", [pool_x]),
    Case("GlobalMaxPool", [pool_x]),
    Case("GlobalAveragePool", [f32(2, 3, 4, 5, 6)]),
]

NORM = [
    Case("BatchNormalization", [f32(2, 5, 6, 7), *ch5], {"epsilon": 1e-3}),
    Case("BatchNormalization", [f32(3, 5), *ch5]),
    Case("InstanceNormalization", [f32(2, 5, 6, 7), ch5[0], ch5[1]], {"epsilon": 1e-3}),
    *[Case("LRN", [f32(2, 5, 6, 7)], {"size": s, "alpha": 0.01, "beta": 0.6, "bias": 2.0}) for s in (3, 5)],
    Case("LayerNormalization", [f32(2, 5, 6, 7), f32(6, 7, seed=22), f32(7, seed=23)], {"axis": -2}, n_out=3),
]

LINALG = [
    Case("MatMul", [f32(2, 3, 4, 5), f32(5, 6, seed=24)]),
    Case("MatMul", [f32(2, 1, 4, 5), f32(3, 5, 6, seed=25)]),  # batch broadcast
    Case("MatMul", [f32(5), f32(2, 5, 6, seed=26)]),
    Case("MatMul", [f32(2, 3, 5), f32(5, seed=27)]),
    Case("MatMul", [f32(5), f32(5, seed=28)]),
    Case("MatMul", [np.arange(12, dtype=np.int32).reshape(3, 4), np.arange(8, dtype=np.int32).reshape(4, 2)]),
    Case("Gemm", [f32(3, 5), f32(5, 4, seed=29), f32(4, seed=30)]),
    Case(
        "Gemm",
        [f32(5, 3), f32(4, 5, seed=31), f32(3, 1, seed=32)],
        {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0},
    ),
    Case("Gemm", [f32(3, 5), f32(4, 5, seed=33), fl(1.5)], {"transB": 1}),
    Case("Gemm", [f32(3, 5), f32(5, 4, seed=34)], {"alpha": -1.0}),
    Case("Gemm", [f32(3, 5), f32(5, 4, seed=35), f32(1, 4, seed=36)], {"beta": 0.0}),
]

rx = f32(1, 2, 7, 9, seed=37)
RESIZE = [
    *[
        Case("Resize", [rx, None, fl(1, 1, *sc), None], {"mode": m, "coordinate_transformation_mode": cm})
        for m in ("nearest", "linear")
        for cm in ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric")
        for sc in ((2, 3), (0.5, 0.4), (1.7, 0.6))
    ],
    *[
        Case("Resize", [rx, None, None, i64(1, 2, *sz)], {"mode": m, "coordinate_transformation_mode": cm})
        for m in ("nearest", "linear", "cubic")
        for cm in ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
        for sz in ((14, 5), (1, 20), (4, 4))
    ],
    *[
        Case(
            "Resize",
            [rx, None, fl(1, 1, 0.6, 1.7), None],
            {"mode": "nearest", "nearest_mode": nm, "coordinate_transformation_mode": "asymmetric"},
        )
        for nm in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
    ],
    Case(
        "Resize",
        [rx, None, None, i64(1, 2, 4, 4)],
        {
            "mode": "nearest",
            "nearest_mode": "round_prefer_ceil",
            "coordinate_transformation_mode": "asymmetric",
        },
    ),
    Case(
        "Resize",
        [rx, None, fl(1, 1, 2, 3), None],
        {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5},
    ),
    *[
        Case(
            "Resize",
            [rx, fl(0, 0, 0.1, -0.2, 1, 1, 0.8, 1.3), None, i64(1, 2, 5, 8)],
            {"mode": m, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -7.0},
        )
        for m in ("nearest", "linear", "cubic")
    ],
    Case("Resize", [rx, None, None, i64(10, 4)], {"mode": "linear", "axes": (3, 2)}),
    Case("Resize", [rx, None, fl(1.5, 0.5), None], {"axes": (-1, -2)}),
    *[
        Case("Resize", [rx, None, None, i64(10, 13)], {"axes": (2, 3), "keep_aspect_ratio_policy": p})
        for p in ("not_larger", "not_smaller")
    ],
    *[
        Case(
            "Resize",
            [f32(1, 2, 17, 19, seed=38), None, fl(1, 1, 0.5, 0.3), None],
            {"mode": m, "antialias": 1},
        )
        for m in ("linear", "cubic")
    ],
    Case("Resize", [np.arange(63, dtype=np.uint8).reshape(1, 1, 7, 9), None, fl(1, 1, 2, 0.5), None]),
    Case("Resize", [f32(1, 2, 3, 4, 5), None, fl(1, 1, 2, 1.5, 0.6), None], {"mode": "linear"}),
]

ax = f32(2, 5, 6, 7, seed=39)
REDUCE = [
    *[
        Case(op, [pos(2, 5, 6, 7) * 0.9, axes], {"keepdims": kd, "noop_with_empty_axes": noop})
        for op in (
            "ReduceSum",
            "ReduceMean",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL1",
            "ReduceL2",
            "ReduceSumSquare",
            "ReduceLogSum",
            "ReduceLogSumExp",
        )
        for axes, kd, noop in ((None, 1, 0), (i64(1, -1), 0, 0), (i64(), 1, 1), (i64(2), 1, 0))
    ],
    Case("ReduceSum", [np.arange(24, dtype=np.int64).reshape(2, 3, 4), i64(1)], {"keepdims": 0}),
    *[Case(op, [ax], {"axis": a}) for op in ("Softmax", "LogSoftmax") for a in (-1, 1, 0)],
    *[
        Case(
            op,
            [np.random.default_rng(40).integers(0, 3, (3, 4, 5)).astype(np.int32)],
            {"axis": a, "keepdims": kd, "select_last_index": sl},
        )
        for op in ("ArgMax", "ArgMin")
        for a, kd, sl in ((0, 1, 0), (-1, 0, 1), (1, 1, 1))
    ],
    Case("ArgMax", [ax], {"axis": 1, "keepdims": 0}),
]

QUANT = [
    *[Case("QuantizeLinear", [q_x, fl(0.5), zp]) for zp in (np.uint8(128), np.int8(-3), np.int16(7))],
    Case("QuantizeLinear", [q_x, fl(0.5)]),
    Case("QuantizeLinear", [q_x, np.float32(0.5), np.uint8(10)]),  # scalar scale and zero point
    Case("QuantizeLinear", [q_x, scale4, zp4], {"axis": 1}),
    Case("QuantizeLinear", [q_x, scale4 * 3], {"axis": 1, "output_dtype": 3}),
    Case("QuantizeLinear", [q_x, (pos(6, seed=41) * 0.05), np.full(6, 120, np.uint8)], {"axis": -1}),
    Case(
        "QuantizeLinear",
        [
            q_x,
            pos(2, 4, 5, 2, seed=42) * 0.05,
            np.random.default_rng(43).integers(-5, 5, (2, 4, 5, 2)).astype(np.int8),
        ],
        {"axis": 3, "block_size": 4},
    ),
    Case("DequantizeLinear", [q_int8, fl(0.02), np.array([3], np.int8)]),
    Case("DequantizeLinear", [q_int8, scale4, zp4], {"axis": 1}),
    Case("DequantizeLinear", [q_int8.astype(np.uint8), np.float32(0.02)]),
    Case(
        "DequantizeLinear",
        [
            np.random.default_rng(44).integers(-(10**5), 10**5, (3, 4)).astype(np.int32),
            pos(4, seed=45) * 0.01,
        ],
        {"axis": 1},
    ),
    Case(
        "DequantizeLinear",
        [
            q_int8,
            pos(2, 4, 5, 2, seed=46) * 0.05,
            np.random.default_rng(47).integers(-5, 5, (2, 4, 5, 2)).astype(np.int8),
        ],
        {"axis": -1, "block_size": 4},
    ),
]

CASES = CONV + POOL + NORM + LINALG + RESIZE + REDUCE + QUANT


@pytest.mark.parametrize("case", CASES, ids=str)
def test_reference_and_types_match_onnxruntime(case: Case) -> None:
    inputs = [None if x is None else np.asarray(x) for x in case.inputs]
    expected = run_ort(case.op, inputs, case.attrs, case.n_out)
    op = get_op(case.op)
    got = op.reference(list(inputs), op.make_attrs(case.attrs), case.n_out)
    consts = case.consts if case.consts is not None else tuple(range(1, len(inputs)))
    node = kiln_node(case.op, inputs, case.attrs, case.n_out, consts)
    assert len(got) == len(expected) == case.n_out
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype, f"output {i}: dtype {g.dtype} != {e.dtype}"
        if e.dtype.kind == "f":
            scale = max(1.0, float(np.max(np.abs(e), initial=0.0)))
            assert_close(g, e, rtol=RTOL, atol=1e-5 * scale, what=f"{case} output {i}")
        else:
            assert_close(g, e, rtol=0, atol=0, what=f"{case} output {i}")
        assert node.output_types[i] == TensorType.of(e), f"output {i}: inferred {node.output_types[i]}"


# ----------------------------------------------------------------- must-fail shapes
BAD: list[tuple[str, list[Any], dict[str, Any], str]] = [
    ("Conv", [f32(1, 4, 8, 8), f32(6, 3, 3, 3)], {}, "channels"),
    ("Conv", [f32(1, 4, 8, 8), f32(6, 2, 3, 3)], {"group": 4}, "channels"),
    ("Conv", [f32(1, 4, 8, 8), f32(5, 2, 3, 3)], {"group": 2}, "divisible"),
    ("Conv", [f32(1, 4, 3, 3), f32(6, 4, 5, 5)], {}, "does not fit"),
    ("Conv", [f32(1, 4, 8, 8), f32(6, 4, 3)], {}, "rank"),
    ("Conv", [f32(1, 4, 8, 8), f32(6, 4, 3, 3), f32(5)], {}, "bias"),
    ("Conv", [f32(1, 4, 8, 8), f32(6, 4, 3, 3)], {"kernel_shape": (5, 5)}, "kernel_shape"),
    ("Conv", [f32(1, 4, 8, 8), f32(6, 4, 3, 3)], {"pads": (1, 1)}, "pads"),
    ("Conv", [f32(1, 4, 8, 8), f32(6, 4, 3, 3)], {"auto_pad": "SAME"}, "auto_pad"),
    ("Conv", [f32(4, 8), f32(6, 4, 3)], {}, "rank"),
    ("ConvTranspose", [f32(1, 4, 8, 8), f32(3, 2, 3, 3)], {}, "channels"),
    (
        "ConvTranspose",
        [f32(1, 4, 8, 8), f32(4, 2, 3, 3)],
        {"strides": (2, 2), "output_padding": (2, 0)},
        "output_padding",
    ),
    ("MaxPool", [f32(1, 2, 8, 8)], {}, "kernel_shape"),
    ("MaxPool", [f32(1, 2, 8, 8)], {"kernel_shape": (3, 3), "pads": (3, 0, 0, 0)}, "smaller than the kernel"),
    ("MaxPool", [f32(1, 2, 2, 2)], {"kernel_shape": (3, 3)}, "does not fit"),
    ("AveragePool", [q_int8], {"kernel_shape": (2, 2)}, "dtype"),
    ("GlobalAveragePool", [f32(2, 3)], {}, "rank"),
    ("BatchNormalization", [f32(2, 5, 4), f32(4), f32(5), f32(5), f32(5)], {}, "shape"),
    ("BatchNormalization", [f32(2, 5, 4), *ch5], {"training_mode": 1}, "training_mode"),
    ("InstanceNormalization", [f32(2, 5, 4), f32(5), f32(3)], {}, "shape"),
    ("MatMul", [f32(2, 3, 4), f32(5, 6)], {}, "inner dims"),
    ("MatMul", [f32(2, 3, 4), f32(3, 4, 6)], {}, "broadcast"),
    ("MatMul", [f32(3, 4), f32(4, 6).astype(np.float64)], {}, "dtype"),
    ("Gemm", [f32(3, 5), f32(4, 5)], {}, "inner dims"),
    ("Gemm", [f32(3, 5), f32(5, 4), f32(3)], {}, "broadcast"),
    ("Gemm", [f32(2, 3, 5), f32(5, 4)], {}, "2-D"),
    ("Resize", [rx, None, fl(1, 1, 2, 2), i64(1, 2, 14, 18)], {}, "exactly one"),
    ("Resize", [rx, None, fl(2, 2), None], {}, "2 scales/sizes for 4 axes"),
    ("Resize", [rx, None, fl(1, 1, 2, 0), None], {}, "> 0"),
    ("Resize", [rx, None, fl(1, 1, 2, 2), None], {"mode": "bilinear"}, "mode"),
    (
        "Resize",
        [rx, None, None, i64(1, 2, 4, 4)],
        {"coordinate_transformation_mode": "tf_crop_and_resize"},
        "roi",
    ),
    ("ReduceSum", [ax, i64(4)], {}, "out of range"),
    ("ReduceMean", [ax, i64(1, -3)], {}, "repeated"),
    ("Softmax", [ax], {"axis": 4}, "out of range"),
    ("ArgMax", [ax], {"axis": -5}, "out of range"),
    ("QuantizeLinear", [q_x, fl(0.1, 0.2, 0.3)], {"axis": 1}, "per-axis"),
    ("QuantizeLinear", [q_x, scale4, np.zeros(3, np.uint8)], {"axis": 1}, "zero point shape"),
    ("QuantizeLinear", [q_x, pos(2, 4, 5, 3)], {"axis": 3, "block_size": 4}, "blocked"),
    ("QuantizeLinear", [q_x, fl(0.1), np.uint8(0)], {"output_dtype": 3}, "output_dtype"),
    ("DequantizeLinear", [q_int8, fl(0.1), np.uint8(0)], {}, "zero point dtype"),
]


@pytest.mark.parametrize(("op", "inputs", "attrs", "match"), BAD, ids=[f"{b[0]}-{b[3]}" for b in BAD])
def test_invalid_shapes_fail_inference(op: str, inputs: list[Any], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        kiln_node(op, inputs, attrs, consts=range(1, len(inputs)))


def test_arity_is_checked() -> None:
    with pytest.raises(ShapeError, match="1 inputs, expected 2 to 3"):
        kiln_node("Conv", [f32(1, 2, 4, 4)])
    with pytest.raises(ShapeError, match="3 outputs"):
        kiln_node("MaxPool", [f32(1, 2, 4, 4)], {"kernel_shape": (2, 2)}, num_outputs=3)


# ----------------------------------------------------------------- symbolic dims
def _node_type(op: str, inputs: list[Any], attrs: dict[str, Any] | None = None, n: int | None = None) -> Any:
    return kiln_node(op, inputs, attrs, n, consts=range(1, len(inputs))).output_types


def test_symbolic_dims_stay_symbolic() -> None:
    xs = TensorType(F32, ("N", 3, 32, 32))
    w = f32(16, 3, 3, 3)
    assert _node_type("Conv", [xs, w], {"strides": (2, 2), "pads": P1})[0].shape == ("N", 16, 16, 16)
    hw = TensorType(F32, ("N", 3, "H", "W"))
    assert _node_type("Conv", [hw, w], {"pads": P1})[0].shape == ("N", 16, "H", "W")
    assert _node_type("Conv", [hw, w], {"auto_pad": "SAME_UPPER"})[0].shape == ("N", 16, "H", "W")
    assert _node_type("Conv", [hw, w], {"auto_pad": "SAME_UPPER", "strides": (2, 2)})[0].shape == (
        "N",
        16,
        "ceil(H/2)",
        "ceil(W/2)",
    )
    assert _node_type("Conv", [hw, w], {"strides": (2, 2), "pads": P1})[0].shape == (
        "N",
        16,
        "floor((H-1)/2)+1",
        "floor((W-1)/2)+1",
    )
    assert _node_type("Conv", [hw, w])[0].shape == ("N", 16, "H-2", "W-2")
    (ct,) = _node_type("ConvTranspose", [hw, f32(3, 4, 2, 2)], {"strides": (2, 2)})
    assert ct.shape == ("N", 4, "2*H", "2*W")
    assert _node_type("MaxPool", [hw], {"kernel_shape": (2, 2), "strides": (2, 2)})[0].shape == (
        "N",
        3,
        "floor((H-2)/2)+1",
        "floor((W-2)/2)+1",
    )
    assert _node_type("GlobalAveragePool", [hw])[0].shape == ("N", 3, 1, 1)
    assert _node_type("BatchNormalization", [hw, *[fl(1, 1, 1)] * 4])[0].shape == ("N", 3, "H", "W")
    assert _node_type("Resize", [hw, None, fl(1, 1, 2, 2)])[0].shape == ("N", 3, "2*H", "2*W")
    assert _node_type("Resize", [hw, None, None, i64(5, 7)], {"axes": (2, 3)})[0].shape == ("N", 3, 5, 7)
    seq = TensorType(F32, ("B", "S", 64))
    assert _node_type("MatMul", [seq, f32(64, 32)])[0].shape == ("B", "S", 32)
    (gm,) = _node_type("Gemm", [TensorType(F32, ("N", 128)), f32(10, 128)], {"transB": 1})
    assert gm.shape == ("N", 10)
    assert _node_type("ReduceMean", [seq, i64(-1)], {"keepdims": 0})[0].shape == ("B", "S")
    assert _node_type("ArgMax", [seq], {"axis": -1})[0] == TensorType(DType.INT64, ("B", "S", 1))
    assert _node_type("Softmax", [seq])[0].shape == ("B", "S", 64)
    assert _node_type("QuantizeLinear", [seq, fl(0.1), np.int8(0)])[0] == TensorType(I8, ("B", "S", 64))
    (dq,) = _node_type("DequantizeLinear", [TensorType(U8, ("B", 4)), scale4], {"axis": 1})
    assert dq == TensorType(F32, ("B", 4))


def test_non_constant_value_inputs_keep_rank() -> None:
    """Axes, scales or sizes computed at run time: the rank survives, the dims become unknown."""
    x = f32(2, 1, 6, 7)
    assert kiln_node("ReduceSum", [x, i64(1)], consts=()).output_types[0].shape == ("?", 1, "?", "?")
    (t,) = kiln_node("ReduceSum", [x, i64(1, 2)], {"keepdims": 0}, consts=()).output_types
    assert t.shape == ("?", "?")
    assert kiln_node("Resize", [x, None, fl(1, 1, 2, 2)], consts=()).output_types[0].shape == ("?",) * 4
    (t,) = kiln_node("Resize", [x, None, None, i64(3, 4)], {"axes": (2, 3)}, consts=()).output_types
    assert t == TensorType(F32, (2, 1, "?", "?"))


def test_policies() -> None:
    for name in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
        assert get_op(name).quant is QuantPolicy.WEIGHTED, name
    for name in ("AveragePool", "GlobalAveragePool", "Resize"):
        assert get_op(name).quant is QuantPolicy.ACTIVATION, name
    for name in ("MaxPool", "GlobalMaxPool"):  # max of int8 values keeps the input's scale
        assert get_op(name).quant is QuantPolicy.PASSTHROUGH, name
    for name in (
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "Resize",
        "BatchNormalization",
        "InstanceNormalization",
        "LRN",
    ):
        assert get_op(name).layout is Layout.SPATIAL, name
    for name in (
        "QuantizeLinear",
        "DequantizeLinear",
        "Softmax",
        "ReduceMean",
        "BatchNormalization",
    ):
        assert get_op(name).quant is QuantPolicy.NONE, name
    assert get_op("MaxPool").outputs == (1, 2)
    assert get_op("BatchNormalization").inputs == (5, 5)


# ----------------------------------------------------------------- a small CNN through the interpreter
def test_small_cnn_runs_through_the_interpreter() -> None:
    """Conv-BN-Relu-MaxPool-Resize-Conv(depthwise)-GAP-Gemm-Softmax, QDQ in the middle."""
    g = Graph("cnn")
    x = g.add_input("x", TensorType(F32, (1, 3, 64, 64)))
    c = g.add_constant

    def op(name: str, ins: list[Any], attrs: dict[str, Any] | None = None) -> Any:
        return g.value(g.add_node(name, ins, attrs))

    y = op(
        "Conv", [x, c(f32(8, 3, 3, 3, seed=50) * 0.3), c(f32(8, seed=51))], {"strides": (2, 2), "pads": P1}
    )
    y = op(
        "BatchNormalization",
        [y, c(ch5[0].repeat(2)[:8]), c(f32(8, seed=52)), c(f32(8, seed=53)), c(pos(8, seed=54))],
    )
    y = op("Relu", [y])
    y = op("MaxPool", [y], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": P1})
    q = op("QuantizeLinear", [y, c(fl(0.05)), c(np.array(0, np.uint8))])
    y = op("DequantizeLinear", [q, c(fl(0.05)), c(np.array(0, np.uint8))])
    y = op("Resize", [y, None, c(fl(1, 1, 2, 2))], {"mode": "linear"})
    y = op("Conv", [y, c(f32(8, 1, 3, 3, seed=55)), c(f32(8, seed=56))], {"group": 8, "pads": P1})
    y = op("GlobalAveragePool", [y])
    y = op("Reshape", [y, c(i64(1, 8))])
    y = op("Gemm", [y, c(f32(10, 8, seed=57)), c(f32(10, seed=58))], {"transB": 1})
    y = op("Softmax", [y])
    g.set_outputs([y])
    verify(g)
    feed = f32(1, 3, 64, 64, seed=59)
    got = run_graph(g, {"x": feed})[y.name]
    assert y.type == TensorType(F32, (1, 10))
    # The same graph, op by op, in onnxruntime.
    env: dict[Any, np.ndarray] = {(x.node, x.port): feed}
    for node in g.nodes():
        if node.op in ("Input",):
            continue
        if node.op == "Constant":
            env[(node.id, 0)] = node.attrs.value
            continue
        ins = [None if v is None else env[(v.node, v.port)] for v in g.inputs_of(node)]
        attrs = get_op(node.op).non_default_attrs(node.attrs)
        env[(node.id, 0)] = run_ort(node.op, ins, attrs)[0]
    assert_close(got, env[(y.node, y.port)], rtol=RTOL, atol=1e-6)


def test_conv_reference_runs_a_large_image() -> None:
    """The interpreter runs 512x512 CNN inputs (im2col) and matches onnxruntime."""
    x = f32(1, 3, 512, 512)
    w = f32(16, 3, 3, 3, seed=60)
    op = get_op("Conv")
    attrs = {"strides": (2, 2), "pads": P1}
    (y,) = op.reference([x, w, None], op.make_attrs(attrs), 1)
    assert y.shape == (1, 16, 256, 256) and y.dtype == np.float32
    assert_close(y, run_ort("Conv", [x, w], attrs)[0], rtol=RTOL, atol=1e-5)
