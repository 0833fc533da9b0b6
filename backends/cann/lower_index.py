"""Lowerings of index-producing ops and small variadic forms: TopK, ArgMax / ArgMin, Sum, Dropout,
OneHot.

The GE forms (REG_OP inputs and attributes as the GE loader reads them):

* ``TopK(x, k)`` -> ``TopKV2(x, k)`` with ``k`` a 0-d int32 Const and the attributes
  ``dim``, ``largest``, ``sorted``; GE's ``indices`` output is int32, so ONNX's int64 indices
  are a ``Cast`` (``dst_type`` int64) of it, as ATC's TopK plugin writes them.
* ``ArgMax(x)`` / ``ArgMin(x)`` -> ``ArgMaxV2(x, dimension)`` / ``ArgMin(x, dimension)``,
  ``dimension`` a 0-d int32 Const, ``dtype`` the output type (int64); GE drops the reduced
  axis, so ``keepdims = 1`` adds a ``Reshape`` to the output shape. GE returns the first
  extremum, so ``select_last_index = 1`` is refused.
* ``Sum(x_0, .., x_{n-1})`` (same shapes) -> ``AddN`` with ``N = n``; broadcasting inputs are
  refused (AddN does not broadcast).
* ``Dropout(x)`` (inference: the identity) -> ``Identity``; a read mask output is refused.
* ``Mod(a, b)`` -> ``FloorMod`` (``fmod = 0``: the sign of b) or ``Mod`` (``fmod = 1``: C's fmod,
  the sign of a).
* ``OneHot(i, depth, [off, on])`` -> ``OneHot(i', depth, on, off)`` (0-d Consts, GE's order)
  with ``axis`` non-negative. GE's OneHot (TensorFlow's) gives all ``off`` for a negative
  index where ONNX counts from the back, so ``i' = i + depth * (i < 0)``: constant indices
  are wrapped when written, variable ones with ``Less``, ``Cast``, ``Mul``, ``Add`` (an index
  below ``-depth`` stays negative, hence all ``off``, as in ONNX).
"""

from __future__ import annotations

import numpy as np

from backends.cann.lower import Lowerer, Step, lowering
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType, TensorType
from compiler.ops.shapes import normalize_axis
from schemas.cann.codes import CPP_DTYPE
from schemas.cann.om_graph import Attr

__all__: list[str] = []


def _scalar_i32(low: Lowerer, value: int, base: str) -> str:
    """A 0-d int32 Const (``Lowerer.const`` would make a 1-element 1-D one)."""
    t = TensorType(DType.INT32, ())
    return low.emit(low.names.fresh(base), "Const", [], [low.desc(t)], value=np.array(value, np.int32))


def _topk_reason(graph: Graph, node: Node) -> str | None:
    k = graph.inputs_of(node)[1]
    return None if k is not None and k.const is not None else "k must be constant"


@lowering("TopK", check=_topk_reason, multi_output=True)
def _topk(low: Lowerer, node: Node) -> None:
    x, k = low.g.inputs_of(node)
    assert x is not None and k is not None and k.const is not None and x.type.rank is not None
    values, indices = low.g.outputs_of(node)
    axis = normalize_axis(node.attrs.axis, x.type.rank)
    kc = _scalar_i32(low, int(k.const.reshape(-1)[0]), f"{values.name}/k")
    attrs = {"dim": Attr.i(axis), "largest": Attr.b(bool(node.attrs.largest))}
    attrs["sorted"] = Attr.b(bool(node.attrs.sorted))
    descs = [low.desc(values.type, node), low.desc(indices.type, node, DType.INT32)]
    name = values.name
    low.emit(name, "TopKV2", [low.ref_of(x), kc], descs, attrs)
    low.bind(node, f"{name}:0", 0)
    cast = {"dst_type": Attr.i(CPP_DTYPE[indices.type.dtype])}
    low.bind(node, low.emit(indices.name, "Cast", [f"{name}:1"], [low.desc(indices.type, node)], cast), 1)


def _arg_reason(graph: Graph, node: Node) -> str | None:
    if node.attrs.select_last_index:
        return "select_last_index=1 (GE's ArgMaxV2 / ArgMin return the first extremum)"
    return None


@lowering("ArgMax", "ArgMin", check=_arg_reason)
def _arg(low: Lowerer, node: Node) -> None:
    x = low.g.inputs_of(node)[0]
    assert x is not None and x.type.rank is not None
    out = low.g.value(node)
    axis = normalize_axis(node.attrs.axis, x.type.rank)
    kind = "ArgMaxV2" if node.op == "ArgMax" else "ArgMin"
    dim = _scalar_i32(low, axis, f"{out.name}/dimension")
    attrs = {"dtype": Attr.i(CPP_DTYPE[out.type.dtype])}
    if not node.attrs.keepdims:
        low.chain(node, [low.ref_of(x), dim], [Step(kind, [], attrs)])
        return
    shape = list(x.type.static_shape)
    del shape[axis]
    reduced = TensorType(out.type.dtype, tuple(shape))
    r = low.emit(
        low.names.fresh(f"{out.name}/{kind}"), kind, [low.ref_of(x), dim], [low.desc(reduced)], attrs
    )
    c = low.const(np.array(out.type.static_shape, np.int64), f"{out.name}/shape")
    low.chain(node, [r, c], [Step("Reshape", [], {"axis": Attr.i(0), "num_axes": Attr.i(-1)})])


def _sum_reason(graph: Graph, node: Node) -> str | None:
    shapes = {v.type.shape for v in graph.inputs_of(node) if v is not None}
    return None if len(shapes) == 1 else "inputs of different shapes (AddN does not broadcast)"


@lowering("Sum", check=_sum_reason)
def _sum(low: Lowerer, node: Node) -> None:
    ins = [low.ref_of(v) for v in low.g.inputs_of(node) if v is not None]
    low.chain(node, ins, [Step("AddN", [], {"N": Attr.i(len(ins))})])


def _dropout_reason(graph: Graph, node: Node) -> str | None:
    if node.num_outputs == 1:
        return None
    mask = graph.value(node, 1)
    if graph.users(mask) or any((o.node, o.port) == (mask.node, mask.port) for o in graph.outputs):
        return "the mask output"
    return None


@lowering("Dropout", check=_dropout_reason, multi_output=True)
def _dropout(low: Lowerer, node: Node) -> None:
    x = low.g.inputs_of(node)[0]
    assert x is not None
    out = low.g.value(node)
    low.bind(node, low.emit(out.name, "Identity", [low.ref_of(x)], [low.desc(out.type, node)]))


def _onehot_reason(graph: Graph, node: Node) -> str | None:
    idx, depth, values = graph.inputs_of(node)
    assert idx is not None and depth is not None and values is not None
    if not idx.type.dtype.is_integer:
        return f"{idx.type.dtype.short} indices (GE's OneHot takes integers)"
    if depth.const is None or values.const is None:
        return "depth and values must be constant"
    return None


def _wrapped(low: Lowerer, node: Node, n: int) -> str:
    """The reference of the indices plus ``n`` where they are negative."""
    idx = low.g.inputs_of(node)[0]
    assert idx is not None
    base, t = low.g.value(node).name, idx.type
    if idx.const is not None:
        wide = idx.const.astype(np.int64)
        return low.const(np.where(wide < 0, wide + n, wide).astype(idx.const.dtype), f"{base}/indices")
    x = low.ref_of(idx)
    dt = t.dtype.numpy
    zero, depth = low.const(np.array(0, dt), f"{base}/zero"), low.const(np.array(n, dt), f"{base}/depth_i")
    neg = low.emit(low.names.fresh(f"{base}/Less"), "Less", [x, zero], [low.desc(t, node, DType.BOOL)])
    cast = {"dst_type": Attr.i(CPP_DTYPE[t.dtype])}
    neg_i = low.emit(low.names.fresh(f"{base}/Cast"), "Cast", [neg], [low.desc(t, node)], cast)
    shift = low.emit(low.names.fresh(f"{base}/Mul"), "Mul", [neg_i, depth], [low.desc(t, node)])
    return low.emit(low.names.fresh(f"{base}/Add"), "Add", [x, shift], [low.desc(t, node)])


@lowering("OneHot", check=_onehot_reason)
def _onehot(low: Lowerer, node: Node) -> None:
    _, depth, values = low.g.inputs_of(node)
    assert depth is not None and depth.const is not None and values is not None and values.const is not None
    out = low.g.value(node)
    n = int(depth.const.reshape(-1)[0])
    off, on = values.const.reshape(-1)[:2]
    vt = TensorType(values.type.dtype, ())
    consts = []
    for what, v in (("on_value", on), ("off_value", off)):
        arr = np.array(v, values.const.dtype)
        consts.append(low.emit(low.names.fresh(f"{out.name}/{what}"), "Const", [], [low.desc(vt)], value=arr))
    axis = normalize_axis(node.attrs.axis, len(out.type.static_shape))
    ins = [_wrapped(low, node, n), _scalar_i32(low, n, f"{out.name}/depth"), *consts]
    low.chain(node, ins, [Step("OneHot", [], {"axis": Attr.i(axis)})])


@lowering("Mod")
def _mod(low: Lowerer, node: Node) -> None:
    ins = [low.ref_of(v) for v in low.g.inputs_of(node)]
    low.chain(node, ins, [Step("FloorMod" if node.attrs.fmod == 0 else "Mod", [], {})])
