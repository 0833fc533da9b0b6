"""SmoothQuant paths: a per-channel scale carried back through ops that move values or mix tokens.

Dividing X [..., K] by s along its last axis is written as a *channel index* J: an int array of
X's rank, broadcastable to X's shape, with X / s = X / s[J] elementwise (s[-1] := 1: a position
that keeps its value). At X, J = arange(K) along the last axis. For an op out = f(in) on the path,
the index J_in of its input satisfies f(in / s[J_in]) = f(in) / s[J_out]; an op with no such
J_in ends the path (:func:`index_back` says why):

* Reshape, Flatten, Squeeze, Unsqueeze, Identity (row-major moves): J_in = reshape(J_out
  broadcast to out's shape, in's shape), then size 1 along every axis where it is constant;
* Transpose(perm), out = in.transpose(perm): J_in = J_out.transpose(perm^-1);
* Gather(in, idx, axis a): J_out must be 1 along idx's axes; J_in has a size-1 axis a there;
* Expand: J_in is J_out where the input is not broadcast (see below);
* Split along a, output i (offset o, length n): J_in along a is J_out on [o, o + n), -1 elsewhere
  (the other outputs keep their values);
* MatMul(A, B) of a computed B, the path at B: out = A B mixes B's rows (tokens, attention's
  probabilities times V) and keeps its columns, so J_out must be 1 along out's axis -2; J_B is
  J_out's batch axes, 1, J_out's last axis. The path at A: J_out must be 1 along the last axis
  (A's last axis is contracted); J_A is J_out's batch axes, J_out's axis -2, 1;
* batch axes broadcast: an operand of size 1 where out is not must have J_out of size 1 there.

A reshape that moves channel index into another axis (a "non-permuting" reshape) gives a J_in
that varies along that axis; no producer has parameters per position, so the path ends there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from compiler.ir.graph import Graph, Node, Value

__all__ = [
    "MOVES",
    "IDENTITY",
    "index_back",
    "reduce_index",
    "broadcast_index",
    "index_vector",
    "varying_axis",
]

IDENTITY = -1  # J's value at a position that keeps its value (s[-1] = 1)
_MAX_ELEMENTS = 1 << 24  # a reshape materializes J at the tensor's size: larger paths are not traced


def reduce_index(j: np.ndarray) -> np.ndarray:
    """``j`` with size 1 along every axis where it is constant (the same broadcast values)."""
    for axis in range(j.ndim):
        if j.shape[axis] > 1:
            first = np.take(j, [0], axis=axis)
            if np.array_equal(np.broadcast_to(first, j.shape), j):
                j = first
    return np.ascontiguousarray(j)


def broadcast_index(j: np.ndarray, out: Sequence[int], operand: Sequence[int]) -> np.ndarray | str:
    """J of an operand broadcast to ``out``: leading axes dropped, 1 where the operand is broadcast."""
    extra = len(out) - len(operand)
    if extra < 0 or any(d != 1 for d in j.shape[:extra]):
        return "the scale varies along an axis the operand broadcasts over"
    j = j.reshape(j.shape[extra:])
    for axis, (d_in, d_out) in enumerate(zip(operand, out[extra:], strict=True)):
        if d_in == 1 and d_out != 1 and j.shape[axis] != 1:
            return f"the scale varies along axis {axis}, which the operand broadcasts over"
    return j


def index_vector(j: np.ndarray, channels: int) -> np.ndarray | None:
    """J as a vector along the last axis (length ``channels``), or None when it varies along another."""
    if j.ndim == 0:
        return np.full(channels, int(j), np.int64)
    if any(d != 1 for d in j.shape[:-1]) or j.shape[-1] not in (1, channels):
        return None
    return np.broadcast_to(j.reshape(-1), (channels,)).astype(np.int64)


def varying_axis(j: np.ndarray) -> int:
    """The first axis before the last along which J is not constant (J has one, see index_vector)."""
    return next((a for a, d in enumerate(j.shape[:-1]) if d != 1), j.ndim - 1)


def _static(v: Value | None) -> tuple[int, ...] | None:
    shape = v.type.shape if v is not None else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(int(d) for d in shape)


_Back = Callable[[Graph, Node, Value, np.ndarray], "tuple[int, np.ndarray] | str"]


def _reshape(graph: Graph, node: Node, v: Value, j: np.ndarray) -> tuple[int, np.ndarray] | str:
    src = _static(graph.inputs_of(node)[0])
    out = _static(v)
    if src is None or out is None:
        return "its shapes are not static"
    if int(np.prod(out)) > _MAX_ELEMENTS:
        return f"its output has more than {_MAX_ELEMENTS} elements"
    return 0, reduce_index(np.broadcast_to(j, out).reshape(src))


def _transpose(graph: Graph, node: Node, v: Value, j: np.ndarray) -> tuple[int, np.ndarray] | str:
    perm = node.attrs.perm
    order = list(range(j.ndim - 1, -1, -1)) if perm is None else [p % j.ndim for p in perm]
    return 0, np.transpose(j, np.argsort(order))


def _gather(graph: Graph, node: Node, v: Value, j: np.ndarray) -> tuple[int, np.ndarray] | str:
    src, idx = _static(graph.inputs_of(node)[0]), _static(graph.inputs_of(node)[1])
    if src is None or idx is None:
        return "its shapes are not static"
    a = node.attrs.axis % len(src)
    if any(d != 1 for d in j.shape[a : a + len(idx)]):
        return "the scale varies along the gathered positions"
    return 0, j.reshape((*j.shape[:a], 1, *j.shape[a + len(idx) :]))


def _split(graph: Graph, node: Node, v: Value, j: np.ndarray) -> tuple[int, np.ndarray] | str:
    shapes = [_static(o) for o in graph.outputs_of(node)]
    if any(s is None for s in shapes):
        return "its shapes are not static"
    a = node.attrs.axis % j.ndim
    full = list(j.shape)
    parts = []
    for i, shape in enumerate(shapes):
        assert shape is not None
        full[a] = shape[a]
        parts.append(np.broadcast_to(j, full) if i == v.port else np.full(full, IDENTITY, j.dtype))
    return 0, reduce_index(np.concatenate(parts, axis=a))


def _expand(graph: Graph, node: Node, v: Value, j: np.ndarray) -> tuple[int, np.ndarray] | str:
    src, out = _static(graph.inputs_of(node)[0]), _static(v)
    if src is None or out is None:
        return "its shapes are not static"
    j_in = broadcast_index(j, out, src)
    return j_in if isinstance(j_in, str) else (0, j_in)


def _matmul(graph: Graph, node: Node, v: Value, j: np.ndarray) -> tuple[int, np.ndarray] | str:
    ins = graph.inputs_of(node)
    out = _static(v)
    shapes = [_static(x) for x in ins]
    if out is None or len(out) < 2 or any(s is None or len(s) < 2 for s in shapes):
        return "its shapes are not static matrices"
    rows, cols = j.shape[-2] != 1, j.shape[-1] != 1
    if rows == cols:
        what = "varies" if rows else "is constant"
        return f"the scale {what} along both its output's rows and columns"
    port = 0 if rows else 1  # rows come from A's rows, columns from B's columns
    a, b = ins
    assert a is not None and b is not None
    if (a.node, a.port) == (b.node, b.port):
        return "both its operands are the same value"
    if (b if port else a).const is not None:
        return f"its input {port}, which carries the channels, is a constant"
    shape = shapes[port]
    assert shape is not None
    jp = broadcast_index(j, out, shape)
    return jp if isinstance(jp, str) else (port, jp)


MOVES: dict[str, _Back] = {
    "Reshape": _reshape,
    "Flatten": _reshape,
    "Squeeze": _reshape,
    "Unsqueeze": _reshape,
    "Identity": _reshape,
    "Transpose": _transpose,
    "Gather": _gather,
    "Split": _split,
    "Expand": _expand,
    "MatMul": _matmul,
}
"""The ops a scale is carried back through, by op type: (the path's input port, J_in) or why not."""


def index_back(graph: Graph, node: Node, v: Value, j: np.ndarray) -> tuple[int, np.ndarray] | str | None:
    """J of ``node``'s input on the path, for J of its output ``v``; None when ``node`` moves nothing."""
    back = MOVES.get(node.op) if not node.domain else None
    if back is None:
        return None
    if node.op == "Split" or len(graph.outputs_of(node)) == 1:
        return back(graph, node, v, j)
    return None
