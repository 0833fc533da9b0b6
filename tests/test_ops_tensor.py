"""Data-movement, cast and logic ops: registry references and inferred types against onnxruntime.

Each case runs one op in onnxruntime (opset 21, CPU, no graph optimization),
calls the registry reference directly, and builds a Kiln node whose
value-determining inputs are constants; values must match exactly (floats
within explicit tolerances) and the inferred types must equal the actual ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.ir.types import DType, TensorType
from compiler.ir.verifier import verify
from compiler.ops import get_op
from compiler.ops.registry import Layout, QuantPolicy, ShapeError
from compiler.ops.shapes import UNKNOWN, slice_bounds
from tests.helpers.numerics import assert_close
from tests.helpers.single_op import kiln_node, run_ort

I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min
F32 = DType.FLOAT32


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def f32(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def ints(shape: tuple[int, ...], seed: int = 0, lo: int = -3, hi: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(np.int64)


def bools(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape) > 0.5


@dataclass
class Case:
    """One op application; ``consts`` are the inputs that are constants in the Kiln graph."""

    op: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    n_out: int = 1
    consts: tuple[int, ...] | None = None  # default: every input but the first
    tol: tuple[float, float] = (0.0, 0.0)  # (rtol, atol) for float outputs

    def __post_init__(self) -> None:
        self.inputs = [None if x is None else np.asarray(x) for x in self.inputs]

    def __str__(self) -> str:
        shapes = ",".join("-" if x is None else "x".join(map(str, x.shape)) for x in self.inputs)
        return f"{self.op}({shapes}){self.attrs or ''}"


x234 = f32((2, 3, 4))
CASES = [
    # ----- tensor_shape
    Case("Reshape", [x234, i64(0, -1)]),
    Case("Reshape", [x234, i64(-1)]),
    Case("Reshape", [x234, i64(4, 0, 2)]),
    Case("Reshape", [f32((0, 3)), i64(3, 0)], {"allowzero": 1}),
    Case("Flatten", [x234], {"axis": 0}),
    Case("Flatten", [x234], {"axis": 2}),
    Case("Flatten", [x234], {"axis": -1}),
    Case("Flatten", [x234], {"axis": 3}),
    Case("Transpose", [x234]),
    Case("Transpose", [f32((2, 3, 4, 5))], {"perm": (0, 2, 3, 1)}),
    Case("Squeeze", [f32((2, 1, 3, 1)), i64(1, -1)]),
    Case("Squeeze", [f32((1, 2, 1, 3))]),
    Case("Unsqueeze", [f32((2, 3)), i64(0, -1)]),
    Case("Unsqueeze", [f32((2, 3)), i64(3, 1)]),
    Case("Expand", [f32((3, 1)), i64(2, 1, 4)]),
    Case("Expand", [f32((1, 4)), i64(3, 1)]),
    Case("Shape", [x234]),
    Case("Shape", [x234], {"start": 1, "end": -1}),
    Case("Shape", [x234], {"start": -10}),
    Case("Shape", [x234], {"end": 10}),
    Case("Shape", [x234], {"start": 2, "end": 1}),
    Case("Size", [x234]),
    # ----- tensor_data
    Case("Concat", [f32((2, 1)), f32((2, 3), 1), f32((2, 2), 2)], {"axis": 1}),
    Case("Concat", [ints((2, 3)), ints((1, 3), 1)], {"axis": -2}),
    Case("Concat", [f32((2, 0)), f32((2, 2))], {"axis": 1}),
    Case("Split", [f32((2, 6)), i64(1, 2, 3)], {"axis": 1}, n_out=3),
    Case("Split", [f32((7, 2))], {"num_outputs": 3}, n_out=3),
    Case("Split", [f32((2, 6))], {"axis": -1, "num_outputs": 2}, n_out=2),
    Case("Split", [f32((2, 6)), i64(0, 6)], {"axis": 1}, n_out=2),
    Case("Split", [f32((4,))], {"num_outputs": 3}, n_out=3),
    Case("Slice", [x234, i64(1), i64(I64_MAX), i64(1)]),
    Case("Slice", [x234, i64(-1), i64(I64_MIN), i64(2), i64(-1)]),
    Case("Slice", [x234, i64(4, 10), i64(0, -100), i64(2, 0), i64(-2, -1)]),
    Case("Slice", [f32((5,)), i64(-10), i64(I64_MIN), i64(0), i64(-1)]),
    Case("Slice", [f32((5,)), i64(10), i64(-10), i64(0), i64(-2)]),
    Case("Slice", [f32((9, 2)), i64(0), i64(100), None, i64(3)]),
    Case("Slice", [x234, i64(1, -3), i64(2, 3)]),
    Case("Slice", [x234, i64(3), i64(1), i64(-1)]),
    Case("Slice", [x234, i64(2, 3), i64(I64_MAX, 2**31 - 1), i64(1, 2), i64(-1, -2)]),
    Case("Slice", [x234, i64(-2, 0), i64(-1, I64_MAX), i64(-1, 0), i64(1, 1)]),
    Case("Gather", [x234, i64(-1, 0, 1)]),
    Case("Gather", [x234, np.array([[0, -1], [2, 1]], np.int32)], {"axis": 1}),
    # A scalar index stays a graph input: Graph.add_constant stores 0-d arrays as 1-d.
    Case("Gather", [x234, i64(-2).reshape(())], {"axis": -1}, consts=()),
    Case("GatherElements", [f32((3, 4)), np.array([[0, -1, 2], [3, 1, -4]], np.int64)], {"axis": 1}),
    Case("GatherElements", [f32((3, 4)), i64(2, -3, 0, 1).reshape(1, 4)]),
    Case("Pad", [f32((2, 3)), i64(1, 2, 0, 1), np.float32(1.5)]),
    Case("Pad", [f32((3, 4)), i64(2, 1, 1, 3)], {"mode": "reflect"}),
    Case("Pad", [f32((3, 4)), i64(2, 1, 1, 3)], {"mode": "edge"}),
    Case("Pad", [f32((3, 4)), i64(2, 1, 1, 5)], {"mode": "wrap"}),
    Case("Pad", [x234, i64(1, 2, 0, 1), None, i64(-1, 0)]),
    Case("Pad", [f32((4, 5)), i64(-1, 2, 1, -2)]),
    Case("Pad", [f32((3, 4)), i64(0, -1, 0, 2)], {"mode": "reflect"}),
    Case("Pad", [f32((3, 4)), i64(0, 2, 0, -1)], {"mode": "edge"}),
    Case("Pad", [f32((5,)), i64(-1, 2)], {"mode": "wrap"}),  # crop first, then wrap what is left
    Case("Pad", [f32((5,)), i64(-3, 1)], {"mode": "constant"}),
    Case("Pad", [f32((4, 2)), i64(1, -3, 3, 3)], {"mode": "constant"}),  # the crop reaches into the padding
    Case("Pad", [ints((2, 3)), i64(0, 1, 1, 0), i64(7)]),
    Case("Tile", [x234, i64(2, 1, 3)]),
    Case("Tile", [ints((2, 2)), i64(1, 0)]),
    Case("Where", [bools((2, 1)), f32((1, 3)), f32((), 1)], consts=()),
    Case("Where", [bools((4,)), ints((4,)), ints((3, 1), 1)], consts=()),
    Case("ConstantOfShape", [i64(2, 3)], consts=(0,)),
    Case("ConstantOfShape", [i64(2, 0)], {"value": np.array([7], np.int64)}, consts=(0,)),
    Case("ConstantOfShape", [i64()], {"value": np.array([2.5], np.float32)}, consts=(0,)),
    Case("Range", [np.int64(0), np.int64(10), np.int64(3)], consts=(0, 1, 2)),
    Case("Range", [np.int32(10), np.int32(2), np.int32(-3)], consts=(0, 1, 2)),
    Case("Range", [np.int64(5), np.int64(1), np.int64(1)], consts=(0, 1, 2)),
    Case("Range", [np.float32(1.0), np.float32(2.0), np.float32(0.3)], consts=(0, 1, 2), tol=(1e-6, 1e-6)),
    Case("Range", [np.float32(-1.5), np.float32(-4.0), np.float32(-0.5)], consts=(0, 1, 2), tol=(1e-6, 1e-6)),
    Case("Range", [np.float64(0.0), np.float64(1.0), np.float64(0.1)], consts=(0, 1, 2)),
    Case("Cast", [np.array([-2.7, -0.5, 0.5, 2.7, 100.9], np.float32)], {"to": int(DType.INT32)}),
    Case("Cast", [np.array([-2.7, -0.5, 0.5, 2.7, 100.9], np.float32)], {"to": int(DType.INT64)}),
    Case("Cast", [np.array([0.0, -0.0, 0.1, -3.0, np.inf], np.float32)], {"to": int(DType.BOOL)}),
    Case("Cast", [np.array([0.5, 1.7, 200.2, 255.0], np.float32)], {"to": int(DType.UINT8)}),
    Case("Cast", [ints((2, 3), lo=-70000, hi=70000)], {"to": int(DType.FLOAT16)}),
    Case("Cast", [np.array([True, False])], {"to": int(DType.FLOAT32)}),
    Case("Cast", [f32((3,)).astype(np.float64)], {"to": int(DType.FLOAT32)}),
    Case("Cast", [np.array([-1, 0, 7], np.int32)], {"to": int(DType.BOOL)}),
    Case("Cast", [np.array([300, -1, 255], np.int64)], {"to": int(DType.UINT8)}),
    Case("Cast", [np.array([1.5, -1e5, 2.0**-20, 1 / 3], np.float64)], {"to": int(DType.FLOAT16)}),
    Case("CastLike", [np.array([-2.7, 0.5, 3.9], np.float32), np.zeros(1, np.int64)]),
    Case("Dropout", [x234]),
    Case("Dropout", [x234, np.float32(0.3), np.array(False)], n_out=2),
    Case("TopK", [np.array([[3, 1, 3, 2], [0, 5, 5, 5]], np.float32), i64(2)], n_out=2),
    Case("TopK", [np.array([[3, 1, 3, 2], [0, 1, 1, 5]], np.int64), i64(3)], {"largest": 0}, n_out=2),
    Case("TopK", [f32((4, 3)), i64(4)], {"axis": 0}, n_out=2),
    Case("NonZero", [np.array([[0, 1.5, 0], [2.0, 0, -1.0]], np.float32)], consts=(0,)),
    Case("NonZero", [np.array([[True, False], [False, True]])], consts=(0,)),
    Case("NonZero", [np.array(3, np.int32)], consts=(0,)),
    # ----- logic
    *[
        Case(op, [ints((2, 3)), ints((3,), 1)], consts=())
        for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
    ],
    Case("Less", [f32((2, 1)), f32((1, 3), 1)], consts=()),
    Case("Not", [bools((2, 3))]),
    *[Case(op, [bools((2, 3)), bools((2, 1), 1)], consts=()) for op in ("And", "Or", "Xor")],
    *[Case(op, [f32((2, 3))], consts=()) for op in ("Min", "Max", "Sum", "Mean")],
    *[
        Case(op, [f32((2, 3)), f32((3,), 1), f32((2, 1), 2)], consts=(), tol=(1e-6, 1e-6))
        for op in ("Min", "Max", "Sum", "Mean")
    ],
    Case("Max", [ints((2, 3)), ints((1,), 1)], consts=()),
    Case("Mean", [np.array([1, 2], np.float16), np.array([3.3, 0.1], np.float16)], consts=()),
    Case("Mean", [np.array(v, np.float16) for v in ([1, 2], [3.3], [0.1])], consts=()),
    Case("Equal", [bools((3,)), bools((3,), 1)], consts=()),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_reference_and_types_match_onnxruntime(case: Case) -> None:
    expected = run_ort(case.op, case.inputs, case.attrs, case.n_out)
    op = get_op(case.op)
    got = op.reference(list(case.inputs), op.make_attrs(case.attrs), case.n_out)
    consts = case.consts if case.consts is not None else tuple(range(1, len(case.inputs)))
    node = kiln_node(case.op, case.inputs, case.attrs, case.n_out, consts)
    assert len(got) == len(expected) == case.n_out
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype, f"output {i}: dtype {g.dtype} != {e.dtype}"
        assert g.shape == e.shape, f"output {i}: shape {g.shape} != {e.shape}"
        if e.dtype.kind in "fc":
            rtol, atol = case.tol
            assert_close(g, e, rtol=rtol, atol=atol, what=f"{case} output {i}")
        else:
            np.testing.assert_array_equal(g, e, err_msg=f"{case} output {i}")
        assert node.output_types[i] == TensorType.of(e), f"output {i}: inferred {node.output_types[i]}"


# ----------------------------------------------------------------- symbolic dims
def _sym_graph() -> tuple[Graph, Any]:
    g = Graph()
    return g, g.add_input("x", TensorType(F32, ("N", 3, 4, 4)))


def test_symbolic_dims_flow_through_shape_ops() -> None:
    g, x = _sym_graph()
    c = g.add_constant

    def out(op: str, ins: list[Any], attrs: dict[str, Any] | None = None, n: int | None = None) -> Any:
        return g.add_node(op, ins, attrs, num_outputs=n)

    r = out("Reshape", [x, c(i64(0, -1))])
    assert r.output_types[0].shape == ("N", 48)
    assert out("Reshape", [x, c(i64(-1, 16))]).output_types[0].shape == (UNKNOWN, 16)
    assert out("Reshape", [x, c(i64(-1, 48))]).output_types[0].shape == ("N", 48)
    assert out("Reshape", [x, c(i64(0, 3, -1))]).output_types[0].shape == ("N", 3, 16)
    assert out("Reshape", [x, c(i64(-1))]).output_types[0].shape == (UNKNOWN,)
    assert out("Reshape", [x, c(i64(2, -1))]).output_types[0].shape == (2, UNKNOWN)
    t = out("Transpose", [x], {"perm": (0, 2, 3, 1)})
    assert t.output_types[0].shape == ("N", 4, 4, 3)
    assert out("Transpose", [x]).output_types[0].shape == (4, 4, 3, "N")
    cat = out("Concat", [x, x], {"axis": 1})
    assert cat.output_types[0].shape == ("N", 6, 4, 4)
    assert out("Concat", [x, x], {"axis": 0}).output_types[0].shape == (UNKNOWN, 3, 4, 4)
    assert out("Flatten", [x]).output_types[0].shape == ("N", 48)
    assert out("Flatten", [x], {"axis": 2}).output_types[0].shape == (UNKNOWN, 16)
    assert out("Flatten", [x], {"axis": 0}).output_types[0].shape == (1, UNKNOWN)
    shape = out("Shape", [x])
    assert shape.output_types[0] == TensorType(DType.INT64, (4,))
    assert out("Size", [x]).output_types[0] == TensorType(DType.INT64, ())
    full = out("Slice", [x, c(i64(0, 1)), c(i64(I64_MAX, 3)), c(i64(0, 1))])
    assert full.output_types[0].shape == ("N", 2, 4, 4)
    assert out("Slice", [x, c(i64(1)), c(i64(I64_MAX))]).output_types[0].shape == (UNKNOWN, 3, 4, 4)
    rev = out("Slice", [x, c(i64(-1)), c(i64(I64_MIN)), c(i64(0)), c(i64(-1))])
    assert rev.output_types[0].shape == ("N", 3, 4, 4)
    rev_max = out("Slice", [x, c(i64(-1)), c(i64(I64_MAX)), c(i64(0)), c(i64(-1))])
    assert rev_max.output_types[0].shape == ("N", 3, 4, 4)
    parts = out("Split", [x, c(i64(1, 2))], {"axis": 1}, n=2)
    assert [t.shape for t in parts.output_types] == [("N", 1, 4, 4), ("N", 2, 4, 4)]
    halves = out("Split", [x], {"axis": 0, "num_outputs": 2}, n=2)
    assert [t.shape for t in halves.output_types] == [(UNKNOWN, 3, 4, 4)] * 2
    assert out("Unsqueeze", [x, c(i64(1))]).output_types[0].shape == ("N", 1, 3, 4, 4)
    sq = out("Squeeze", [g.value(out("Unsqueeze", [x, c(i64(-1))])), c(i64(4))])
    assert sq.output_types[0].shape == ("N", 3, 4, 4)
    assert out("Squeeze", [x]).output_types[0].shape is None  # "N" might be 1
    assert out("Expand", [x, c(i64(2, 1, 1, 1, 1))]).output_types[0].shape == (2, "N", 3, 4, 4)
    assert out("Gather", [g.value(shape), c(i64(0))]).output_types[0] == TensorType(DType.INT64, (1,))
    assert out("Gather", [x, c(ints((5, 2)))], {"axis": 1}).output_types[0].shape == ("N", 5, 2, 4, 4)
    assert out("Pad", [x, c(i64(0, 1, 0, 0, 0, 0, 2, 0))]).output_types[0].shape == ("N", 4, 6, 4)
    assert out("Pad", [x, c(i64(1, 1)), None, c(i64(0))]).output_types[0].shape == (UNKNOWN, 3, 4, 4)
    assert out("Tile", [x, c(i64(1, 2, 1, 1))]).output_types[0].shape == ("N", 6, 4, 4)
    half = out("Cast", [x], {"to": int(DType.FLOAT16)})
    assert half.output_types[0] == TensorType(DType.FLOAT16, ("N", 3, 4, 4))
    y = g.add_input("y", TensorType(F32, (1, 3, 1, 1)))
    assert out("Less", [x, y]).output_types[0] == TensorType(DType.BOOL, ("N", 3, 4, 4))
    assert out("Sum", [y, x, y]).output_types[0].shape == ("N", 3, 4, 4)
    cond = g.value(out("Greater", [x, y]))
    assert out("Where", [cond, y, x]).output_types[0] == TensorType(F32, ("N", 3, 4, 4))
    topk = out("TopK", [x, c(i64(2))], {"axis": 1}, n=2)
    assert topk.output_types == [TensorType(F32, ("N", 2, 4, 4)), TensorType(DType.INT64, ("N", 2, 4, 4))]
    assert out("NonZero", [x]).output_types[0] == TensorType(DType.INT64, (4, UNKNOWN))
    drop = out("Dropout", [x], n=2)
    assert drop.output_types == [x.type, TensorType(DType.BOOL, ("N", 3, 4, 4))]


def test_non_constant_value_inputs_keep_rank() -> None:
    g, x = _sym_graph()
    shp = g.add_input("shape", TensorType(DType.INT64, (3,)))
    any_shape = g.add_input("dyn", TensorType(DType.INT64, ("K",)))
    idx = g.add_input("i", TensorType(DType.INT64, (2,)))
    reshape = g.add_node("Reshape", [x, shp])
    assert reshape.output_types[0].shape == (UNKNOWN,) * 3
    assert g.add_node("Reshape", [x, any_shape]).output_types[0].shape is None
    assert g.add_node("Expand", [x, shp]).output_types[0].shape == ("N", 3, 4, 4)
    wide = g.add_input("wide", TensorType(DType.INT64, (5,)))
    assert g.add_node("Expand", [x, wide]).output_types[0].shape == (UNKNOWN, UNKNOWN, 3, 4, 4)
    assert g.add_node("Unsqueeze", [x, idx]).output_types[0].shape == (UNKNOWN,) * 6
    assert g.add_node("Squeeze", [x, idx]).output_types[0].shape == (UNKNOWN,) * 2
    sl = g.add_node("Slice", [x, idx, idx, g.add_constant(i64(1, 3))])
    assert sl.output_types[0].shape == ("N", UNKNOWN, 4, UNKNOWN)
    assert g.add_node("Slice", [x, idx, idx, idx]).output_types[0].shape == (UNKNOWN,) * 4
    pad = g.add_node("Pad", [x, g.add_input("p", TensorType(DType.INT64, (8,)))])
    assert pad.output_types[0].shape == (UNKNOWN,) * 4
    tile = g.add_node("Tile", [x, g.add_input("r", TensorType(DType.INT64, (4,)))])
    assert tile.output_types[0].shape == (UNKNOWN,) * 4
    assert g.add_node("ConstantOfShape", [shp]).output_types[0] == TensorType(F32, (UNKNOWN,) * 3)
    split = g.add_node("Split", [x, idx], num_outputs=2)
    assert [t.shape for t in split.output_types] == [(UNKNOWN, 3, 4, 4)] * 2
    s = g.add_input("s", TensorType(DType.INT64, ()))
    assert g.add_node("Range", [s, s, s]).output_types[0] == TensorType(DType.INT64, (UNKNOWN,))
    unk = g.add_input("u", TensorType(F32, None))
    assert g.add_node("Transpose", [unk]).output_types[0].shape is None
    assert g.add_node("Transpose", [unk], {"perm": (1, 0)}).output_types[0].shape == (UNKNOWN, UNKNOWN)
    assert g.add_node("Shape", [unk]).output_types[0] == TensorType(DType.INT64, (UNKNOWN,))
    assert g.add_node("Reshape", [unk, g.add_constant(i64(2, -1))]).output_types[0].shape == (2, UNKNOWN)
    assert g.add_node("Concat", [unk, x], {"axis": 1}).output_types[0].shape == ("N", UNKNOWN, 4, 4)
    assert g.add_node("Add", [unk, x]).output_types[0].shape is None
    assert g.add_node("Equal", [unk, x]).output_types[0] == TensorType(DType.BOOL, None)


# ----------------------------------------------------------------- must fail
BAD = [
    ("Reshape", [x234, i64(4, 2)], {}),
    ("Reshape", [x234, i64(-1, -1)], {}),
    ("Reshape", [x234, i64(5, -1)], {}),
    ("Reshape", [x234, i64(0, 0, 0, 0)], {}),
    ("Reshape", [f32((0, 3)), i64(0, -1)], {"allowzero": 1}),
    ("Flatten", [x234], {"axis": 4}),
    ("Transpose", [x234], {"perm": (0, 0, 1)}),
    ("Squeeze", [x234, i64(1)], {}),
    ("Squeeze", [f32((1, 2)), i64(0, -2)], {}),
    ("Unsqueeze", [x234, i64(1, 1)], {}),
    ("Unsqueeze", [x234, i64(5)], {}),
    ("Expand", [f32((3, 2)), i64(4, 1)], {}),
    ("Concat", [f32((2, 3)), f32((2, 3, 1))], {"axis": 0}),
    ("Concat", [f32((2, 3)), f32((3, 3))], {"axis": 1}),
    ("Concat", [f32((2, 3)), ints((2, 3))], {"axis": 0}),
    ("Concat", [f32((2, 3))], {"axis": 2}),
    ("Split", [f32((2, 6)), i64(1, 2)], {"axis": 1}),
    ("Slice", [x234, i64(0), i64(1), i64(0), i64(0)], {}),
    ("Slice", [x234, i64(0), i64(1), i64(3)], {}),
    ("Slice", [x234, i64(0, 0), i64(1, 1), i64(1, -2)], {}),
    ("Gather", [x234, i64(0)], {"axis": 3}),
    ("Gather", [x234, np.zeros(1, np.float32)], {}),
    ("GatherElements", [x234, i64(0)], {}),
    ("Pad", [x234, i64(1, 1)], {}),
    ("Pad", [x234, i64(0, 0, 0, 0, -4, 0)], {}),
    ("Pad", [x234, i64(0, 0, 0, 0, 0, 0)], {"mode": "mirror"}),
    ("Pad", [f32((3, 4)), i64(0, 4, 0, 0)], {"mode": "reflect"}),
    ("Pad", [f32((5,)), i64(-3, 3)], {"mode": "reflect"}),
    ("Pad", [f32((2, 4)), i64(3, 3, -3, 3)], {"mode": "edge"}),
    ("Tile", [x234, i64(2, 2)], {}),
    ("Where", [f32((2,)), f32((2,)), f32((2,))], {}),
    ("Where", [bools((2,)), f32((2,)), ints((2,))], {}),
    ("Where", [bools((3,)), f32((2,)), f32((2,))], {}),
    ("ConstantOfShape", [i64(2, -1)], {}),
    ("Range", [np.int64(0), np.int64(4), np.int64(0)], {}),
    ("Range", [np.int64(0), np.int32(4), np.int64(1)], {}),
    ("Cast", [x234], {"to": int(DType.STRING)}),
    ("Cast", [x234], {"to": 99}),
    ("Dropout", [x234, np.float32(0.5), np.array(True)], {}),
    ("TopK", [f32((2, 3)), i64(4)], {}),
    ("Equal", [f32((2,)), ints((2,))], {}),
    ("Less", [f32((2,)), f32((3,))], {}),
    ("And", [ints((2,)), ints((2,))], {}),
    ("Not", [f32((2,))], {}),
    ("Mean", [ints((2,))], {}),
    ("Sum", [ints((2,)), ints((2,))], {}),
    ("Max", [f32((2, 3)), f32((2, 3)), f32((4,))], {}),
]


@pytest.mark.parametrize(("op", "inputs", "attrs"), BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_invalid_shapes_fail_inference(op: str, inputs: list[np.ndarray], attrs: dict[str, Any]) -> None:
    consts = tuple(range(len(inputs))) if op in ("ConstantOfShape", "Range") else tuple(range(1, len(inputs)))
    with pytest.raises(ShapeError, match=op):
        kiln_node(op, inputs, attrs, None, consts)


def test_split_needs_one_way_to_size_its_outputs() -> None:
    with pytest.raises(ShapeError, match="num_outputs"):
        kiln_node("Split", [f32((6,))], {"num_outputs": 3}, 2)
    with pytest.raises(ShapeError, match="exactly one"):
        kiln_node("Split", [f32((6,))], {}, 2)
    with pytest.raises(ShapeError, match="exactly one"):
        kiln_node("Split", [f32((6,)), i64(3, 3)], {"num_outputs": 2}, 2, consts=(1,))
    with pytest.raises(ShapeError, match="parts"):
        kiln_node("Split", [f32((5,))], {"num_outputs": 4}, 4)


# ----------------------------------------------------------------- odds and ends
def test_slice_bounds_follow_onnx_clamping() -> None:
    assert slice_bounds(5, -10, I64_MIN, -1) == (0, -1, 1)
    assert slice_bounds(5, I64_MAX, I64_MIN, -1) == (4, -1, 5)
    assert slice_bounds(5, 0, I64_MAX, 2) == (0, 5, 3)
    assert slice_bounds(0, 0, 10, 1) == (0, 0, 0)
    assert slice_bounds(0, -1, I64_MIN, -1)[2] == 0
    # ONNX Runtime reads an end of exactly INT32/INT64 max as "to the end", also for negative steps.
    assert slice_bounds(5, 3, I64_MAX, -1) == (3, -1, 4)
    assert slice_bounds(5, 3, 2**31 - 1, -2) == (3, -1, 2)
    assert slice_bounds(5, 3, 10, -1) == (3, 4, 0)


def test_cast_to_bfloat16_rounds_to_nearest_even() -> None:
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, np.nan], np.float32)
    (bits,) = get_op("Cast").reference([x], get_op("Cast").make_attrs({"to": 16}), 1)
    assert bits.dtype == np.uint16
    assert [hex(b) for b in bits[:4]] == ["0x3f80", "0x3f80", "0x3f82", "0xc020"]
    assert bits[4] & 0x7F80 == 0x7F80 and bits[4] & 0x7F


def test_constant_of_shape_attrs_compare_by_value() -> None:
    op = get_op("ConstantOfShape")
    a, b = op.make_attrs({"value": np.array([1.0], np.float32)}), op.make_attrs({"value": [1.0]})
    assert op.make_attrs({}) == op.make_attrs({"value": np.zeros(1, np.float32)})
    assert a != b  # float32 vs float64
    assert hash(a) == hash(op.make_attrs({"value": np.array([1.0], np.float32)}))
    with pytest.raises(ValueError, match="one element"):
        op.make_attrs({"value": np.zeros(2, np.float32)})


def test_policies() -> None:
    for name in ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather", "Split"):
        assert get_op(name).quant is QuantPolicy.PASSTHROUGH, name
        assert get_op(name).layout is Layout.FIXED, name
    assert get_op("Concat").quant is QuantPolicy.ACTIVATION
    assert get_op("Pad").quant is QuantPolicy.NONE
    for name in ("Equal", "Not", "And", "Where", "Cast", "Dropout", "Min", "Mean"):
        assert get_op(name).layout is Layout.AGNOSTIC, name
    assert all(get_op(n).deterministic for n in ("Dropout", "NonZero", "TopK", "Range"))


# ----------------------------------------------------------------- properties and graphs
_BOUND = st.one_of(st.integers(-8, 8), st.sampled_from([I64_MAX, I64_MIN, 2**31 - 1, -(2**31)]))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    dim=st.integers(0, 6),
    start=_BOUND,
    end=_BOUND,
    step=st.sampled_from([1, 2, 3, -1, -2, -5, I64_MAX, I64_MIN]),
)
def test_slice_matches_onnxruntime_on_random_bounds(dim: int, start: int, end: int, step: int) -> None:
    inputs: list[np.ndarray | None] = [
        np.arange(dim * 2, dtype=np.float32).reshape(dim, 2),
        i64(start),
        i64(end),
        i64(0),
        i64(step),
    ]
    (expected,) = run_ort("Slice", inputs)
    op = get_op("Slice")
    (got,) = op.reference(inputs, op.make_attrs({}), 1)
    np.testing.assert_array_equal(got, expected)
    assert got.shape == expected.shape
    node = kiln_node("Slice", inputs, {}, 1, consts=(1, 2, 3, 4))
    assert node.output_types[0] == TensorType.of(expected)


def test_dynamic_reshape_pattern_runs_in_the_interpreter() -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write flatten(x, 1)."""
    g, x = _sym_graph()
    c = g.add_constant
    shape = g.value(g.add_node("Shape", [x]))
    batch = g.value(g.add_node("Gather", [shape, c(i64(0))]))
    target = g.value(g.add_node("Concat", [batch, c(i64(-1))], {"axis": 0}))
    flat = g.add_node("Reshape", [x, target])
    assert flat.output_types[0].shape == (UNKNOWN, UNKNOWN)
    top = g.add_node("TopK", [g.value(flat), c(i64(5))], {"axis": 1}, num_outputs=2)
    mask = g.add_node("Greater", [g.value(top, 0), c(np.zeros((1, 1), np.float32))])
    vals = g.add_node("Where", [g.value(mask), g.value(top, 0), c(np.zeros((1, 1), np.float32))])
    g.set_outputs([g.value(vals), g.value(top, 1)])
    verify(g)
    feed = f32((3, 3, 4, 4), 7)
    out = run_graph(g, {"x": feed})
    flat_np = feed.reshape(3, -1)
    idx = np.argsort(-flat_np, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(out[g.value(top, 1).name], idx)
    expected = np.maximum(np.take_along_axis(flat_np, idx, axis=1), 0)
    assert_close(out[g.value(vals).name], expected, rtol=0, atol=0)
