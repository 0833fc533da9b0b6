"""Lifters of GE data-movement ops with constant operands: GatherV2 (and GatherV2D), Expand, PadV3.

The inverses of ``backends/cann/lower_tensor.py``:

* ``GatherV2(x, indices, axis)``, ``axis`` a one-element integer Const, and the deprecated
  ``GatherV2D(x, indices)`` with an ``axis`` attribute, become ``Gather``; ``batch_dims``
  must be 0. Kiln's Gather accepts negative indices, so ``negative_index_support`` is read
  as a promise about the indices, not as a change of meaning.
* ``Expand(x, shape)``, ``shape`` a 1-D integer Const, becomes ``Expand``.
* ``PadV3(x, paddings[, constant_values])`` becomes ``Pad`` with ONNX's pads
  ``[b_0, .., b_{r-1}, e_0, .., e_{r-1}]``: with ``paddings_contiguous = true`` (GE's default)
  the Const holds ``[b_0, e_0, b_1, e_1, ..]`` and is reordered, with false it is ONNX's
  order already. ``mode`` is constant, reflect or edge.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value
from frontends.cann.lift import Lifter, LiftError, lifter
from schemas.cann.om_graph import OmOp

__all__: list[str] = []

_PAD_MODES = ("constant", "reflect", "edge")


def _int_const(lf: Lifter, op: OmOp, port: int, what: str) -> list[int]:
    c = lf.const(op, port, what)
    if c.dtype.kind not in "iu" or c.ndim > 1:
        raise LiftError(f"{what} must be a 0-D or 1-D integer constant")
    return [int(v) for v in c.reshape(-1)]


def _operands(lf: Lifter, op: OmOp, n: int) -> list[Value]:
    """The op's first ``n`` inputs, which must all be present."""
    vals = [lf.value(r) for r in op.inputs[:n]]
    if len(vals) != n or any(v is None for v in vals):
        raise LiftError(f"{op.type} needs its first {n} inputs")
    return [v for v in vals if v is not None]


@lifter("GatherV2", "GatherV2D")
def _gather(lf: Lifter, op: OmOp) -> Value:
    if lf.attr(op, "batch_dims", "i", 0) != 0:
        raise LiftError("only batch_dims=0 is supported")
    if op.type == "GatherV2":
        if len(op.inputs) != 3:
            raise LiftError(f"GatherV2 has 3 inputs (x, indices, axis), not {len(op.inputs)}")
        axis = _int_const(lf, op, 2, "axis")
        if len(axis) != 1:
            raise LiftError(f"axis must hold one value, not {len(axis)}")
        ax = axis[0]
    else:
        if len(op.inputs) != 2:
            raise LiftError(f"GatherV2D has 2 inputs (x, indices), not {len(op.inputs)}")
        v = lf.attr(op, "axis", "i")
        if not isinstance(v, int):
            raise LiftError("attribute 'axis' must be an int")
        ax = v
    return lf.node("Gather", _operands(lf, op, 2), {"axis": ax}, op.name)


@lifter("Expand")
def _expand(lf: Lifter, op: OmOp) -> Value:
    if len(op.inputs) != 2:
        raise LiftError(f"Expand has 2 inputs (x, shape), not {len(op.inputs)}")
    _int_const(lf, op, 1, "shape")
    return lf.node("Expand", _operands(lf, op, 2), None, op.name)


@lifter("PadV3")
def _pad(lf: Lifter, op: OmOp) -> Value:
    mode = lf.attr(op, "mode", "s", "constant")
    if mode not in _PAD_MODES:
        raise LiftError(f"mode {mode!r} (Kiln reads {', '.join(_PAD_MODES)})")
    if len(op.inputs) not in (2, 3):
        raise LiftError(f"PadV3 has 2 or 3 inputs (x, paddings, constant_values), not {len(op.inputs)}")
    x = _operands(lf, op, 1)[0]
    flat = _int_const(lf, op, 1, "paddings")
    rank = x.type.rank
    if rank is None or len(flat) != 2 * rank:
        raise LiftError(f"paddings has {len(flat)} values for an input of rank {rank}")
    pads = flat
    if lf.attr(op, "paddings_contiguous", "b", True):
        pads = flat[0::2] + flat[1::2]
    value = lf.value(op.inputs[2]) if len(op.inputs) > 2 else None
    p = lf.g.add_constant(np.array(pads, np.int64), f"{op.name}/pads")
    ins = [x, p] + ([value] if value is not None else [])
    return lf.node("Pad", ins, {"mode": mode}, op.name)


@lifter("SplitD", "SplitVD", multi_output=True)
def _split(lf: Lifter, op: OmOp) -> list[Value | None]:
    if len(op.inputs) != 1:
        raise LiftError(f"{op.type} has 1 input (x), not {len(op.inputs)}")
    x = _operands(lf, op, 1)[0]
    rank = x.type.rank
    axis = lf.attr(op, "split_dim", "i")
    n = lf.attr(op, "num_split", "i")
    if not isinstance(axis, int) or not isinstance(n, int) or rank is None or not -rank <= axis < rank:
        raise LiftError(f"split_dim {axis!r} / num_split {n!r} do not fit an input of rank {rank}")
    dim = x.type.static_shape[axis % rank]
    if op.type == "SplitD":
        if n < 1 or dim % n:
            raise LiftError(f"num_split {n} does not divide dim {dim}")
        sizes = [dim // n] * n
    else:
        sizes = list(lf.ints(op, "size_splits", n))
        if sizes.count(-1) == 1:
            sizes[sizes.index(-1)] = dim - sum(s for s in sizes if s != -1)
        if any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise LiftError(f"size_splits {sizes} do not cut dim {dim}")
    if len(op.outputs) != n:
        raise LiftError(f"{len(op.outputs)} output descriptors for num_split {n}")
    split = lf.g.add_constant(np.array(sizes, np.int64), f"{op.name}/split")
    names = [op.name] + [f"{op.name}_{i}" for i in range(1, n)]
    return list(lf.multi("Split", [x, split], {"axis": axis}, names))


_SCATTER_ND = {
    "ScatterNdUpdate": "none",
    "ScatterNdAdd": "add",
    "ScatterNdMax": "max",
    "ScatterNdMin": "min",
    "TensorScatterUpdate": "none",
    "TensorScatterAdd": "add",
    "TensorScatterMax": "max",
    "TensorScatterMin": "min",
}


@lifter(*_SCATTER_ND)
def _scatter_nd(lf: Lifter, op: OmOp) -> Value:
    """``ScatterNd{Update,Add,Max,Min}(var, indices, updates)`` (ATC's form, var = TensorMove(data))
    and the older ``TensorScatter*(x, indices, updates)`` become ONNX ScatterND."""
    if len(op.inputs) != 3:
        raise LiftError(f"{op.type} has 3 inputs (var/x, indices, updates), not {len(op.inputs)}")
    return lf.node("ScatterND", _operands(lf, op, 3), {"reduction": _SCATTER_ND[op.type]}, op.name)


@lifter("TensorMove")
def _tensor_move(lf: Lifter, op: OmOp) -> Value:
    """``TensorMove`` copies its input: Identity."""
    if len(op.inputs) != 1:
        raise LiftError(f"TensorMove has 1 input, not {len(op.inputs)}")
    return lf.node("Identity", _operands(lf, op, 1), None, op.name)
