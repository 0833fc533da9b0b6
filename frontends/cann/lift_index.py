"""Lifters of GE index-producing ops and AddN: TopKV2, ArgMaxV2, ArgMin, AddN.

The inverses of ``backends/cann/lower_index.py``:

* ``TopKV2(x, k)``, ``k`` a one-element integer Const, attributes ``dim`` (default -1),
  ``largest`` and ``sorted`` (default true), becomes ``TopK`` with ``k`` as a 1-D int64
  constant; GE's int32 ``indices`` output is ``Cast(indices, int32)`` of ONNX's int64 ones.
* ``ArgMaxV2(x, dimension)`` / ``ArgMin(x, dimension)``, ``dimension`` a one-element integer
  Const and ``dtype`` int32 or int64 (default int32), become ``ArgMax`` / ``ArgMin`` with
  ``keepdims = 0`` (GE drops the axis), followed by a ``Cast`` to int32 for ``dtype`` int32.
* ``AddN(x_0, .., x_{N-1})`` becomes ``Sum``; ``N`` must count the inputs.
* ``FloorMod(a, b)`` / ``Mod(a, b)`` become ``Mod`` with ``fmod`` 0 / 1.
* ``OneHot(i, depth, on, off)``, all but ``i`` one-element Consts, becomes ``OneHot`` with the
  values constant ``[off, on]``. GE's (TensorFlow's) OneHot gives all ``off`` for a negative
  index, which ONNX counts from the back, so unless ``i`` is a Const without negatives it is
  first ``Where(i < 0, depth, i)`` (an index past the end: all ``off`` in ONNX too).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.ir.graph import Value
from compiler.ir.types import DType
from frontends.cann.lift import Lifter, LiftError, lifter
from schemas.cann.codes import CPP_DTYPE, dtype_from
from schemas.cann.om_graph import OmOp

__all__: list[str] = []


def _one_int(lf: Lifter, op: OmOp, port: int, what: str) -> int:
    c = lf.const(op, port, what)
    if c.dtype.kind not in "iu" or c.size != 1:
        raise LiftError(f"{what} must be a one-element integer constant")
    return int(c.reshape(-1)[0])


def _x(lf: Lifter, op: OmOp, n: int) -> Value:
    if len(op.inputs) != n:
        raise LiftError(f"{op.type} has {n} inputs, not {len(op.inputs)}")
    x = lf.value(op.inputs[0])
    if x is None:
        raise LiftError(f"{op.type} needs its input x")
    return x


def _flag(lf: Lifter, op: OmOp, key: str, default: bool) -> int:
    v = lf.attr(op, key, "b", default)
    return int(bool(v))


@lifter("TopKV2", multi_output=True)
def _topk(lf: Lifter, op: OmOp) -> Sequence[Value | None]:
    x = _x(lf, op, 2)
    k = _one_int(lf, op, 1, "k")
    if len(op.outputs) != 2:
        raise LiftError(f"TopKV2 has 2 outputs (values, indices), not {len(op.outputs)}")
    dim = lf.attr(op, "dim", "i", -1)
    attrs = {"axis": dim, "largest": _flag(lf, op, "largest", True), "sorted": _flag(lf, op, "sorted", True)}
    kc = lf.g.add_constant(np.array([k], np.int64), f"{op.name}/k")
    values, indices = lf.multi("TopK", [x, kc], attrs, [op.name, f"{op.name}/indices64"])
    return [values, lf.node("Cast", [indices], {"to": int(DType.INT32)}, f"{op.name}/indices")]


@lifter("ArgMaxV2", "ArgMin")
def _arg(lf: Lifter, op: OmOp) -> Value:
    x = _x(lf, op, 2)
    axis = _one_int(lf, op, 1, "dimension")
    code = lf.attr(op, "dtype", "i", CPP_DTYPE[DType.INT32])
    dtype = dtype_from(CPP_DTYPE, int(code))  # type: ignore[call-overload]
    if dtype not in (DType.INT32, DType.INT64):
        raise LiftError(f"dtype {code} (ArgMax / ArgMin give int32 or int64)")
    kop = "ArgMax" if op.type == "ArgMaxV2" else "ArgMin"
    attrs = {"axis": axis, "keepdims": 0}
    if dtype is DType.INT64:
        return lf.node(kop, [x], attrs, op.name)
    wide = lf.node(kop, [x], attrs, f"{op.name}/int64")
    return lf.node("Cast", [wide], {"to": int(DType.INT32)}, op.name)


@lifter("AddN")
def _add_n(lf: Lifter, op: OmOp) -> Value:
    ins = lf.inputs(op)
    if not ins or any(v is None for v in ins):
        raise LiftError("AddN needs at least one input and no empty ones")
    n = lf.attr(op, "N", "i", len(ins))
    if n != len(ins):
        raise LiftError(f"attribute N={n} but {len(ins)} inputs")
    return lf.node("Sum", ins, None, op.name)


@lifter("OneHot")
def _onehot(lf: Lifter, op: OmOp) -> Value:
    idx = _x(lf, op, 4)
    depth = lf.const(op, 1, "depth")
    on, off = lf.const(op, 2, "on_value"), lf.const(op, 3, "off_value")
    if depth.size != 1 or on.size != 1 or off.size != 1 or on.dtype != off.dtype:
        raise LiftError("depth, on_value and off_value must be one-element constants (on, off of one type)")
    n = int(depth.reshape(-1)[0])
    if idx.const is None or idx.const.min(initial=0) < 0:
        # GE: a negative index gives all off; ONNX would count it from the back -> make it n (off)
        dt = idx.type.dtype.numpy
        zero = lf.g.add_constant(np.array(0, dt), f"{op.name}/zero")
        past = lf.g.add_constant(np.array(n, dt), f"{op.name}/past_end")
        neg = lf.node("Less", [idx, zero], None, f"{op.name}/negative")
        idx = lf.node("Where", [neg, past, idx], None, f"{op.name}/indices")
    values = lf.g.add_constant(
        np.array([off.reshape(-1)[0], on.reshape(-1)[0]], on.dtype), f"{op.name}/values"
    )
    d = lf.g.add_constant(depth.reshape(()), f"{op.name}/depth")
    return lf.node("OneHot", [idx, d, values], {"axis": lf.attr(op, "axis", "i", -1)}, op.name)


@lifter("FloorMod", "Mod")
def _mod(lf: Lifter, op: OmOp) -> Value:
    a = _x(lf, op, 2)
    b = lf.value(op.inputs[1])
    if b is None:
        raise LiftError(f"{op.type} needs two inputs")
    return lf.node("Mod", [a, b], {"fmod": int(op.type == "Mod")}, op.name)
