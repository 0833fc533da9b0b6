"""Decompositions of index-producing and index-driven ops into their plain forms.

* gathernd-batch: GatherND(d, i; batch_dims=b) with batch dims B = d.shape[:b] (P = prod B)
  = Reshape(GatherND(d', i'; batch_dims=0), B + i.shape[b:-1] + d.shape[b+m:]) with
  d' = Reshape(d, [P] + d.shape[b:]) and i' = Concat([p, Reshape(i, [P] + i.shape[b:])], -1),
  where p holds, at every index row, its flat batch number (the batch index column). Exact:
  row r of batch p reads d'[p, i[r]] = d[batch p][i[r]], which is what batch_dims says.
* topk-stable-indices: TopK(x, k) whose indices are read, with ONNX's tie order (equal values
  by ascending index), from a TopK whose indices are not read. With v = the TopK values (sorted
  along the axis), per output position r (0-based) and input position j:
  E[r, j] = (v_r == x_j), occ[r, j] = sum_{j' <= j} E[r, j'] (CumSum),
  c_r = r - #{j : x_j beyond v_r} (beyond: > for largest, < for smallest; all of them precede
  position r), and the index is the j where E[r, j] and occ[r, j] = c_r + 1: the (c_r + 1)-th
  occurrence of v_r, as ONNX takes equal values lowest index first. ArgMax over j finds it.
  The counts are float32 (MNN reduces only floats), exact for n <= 2^24; it needs k x n
  intermediates (n = the axis length), refused above ``TABLE_CAP`` elements. Exact for finite
  and infinite values; NaN equals nothing, so a NaN's index is 0 (ONNX leaves NaN ordering
  unspecified).
"""

from __future__ import annotations

import math

import numpy as np

from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType
from compiler.ops.shapes import normalize_axis
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, ints, replace_outputs, static_reason, used

__all__ = ["GATHER_ND_BATCH", "TOPK_STABLE_INDICES", "TABLE_CAP"]

TABLE_CAP = 1 << 24
"""The most elements topk-stable-indices' k x n intermediates may hold (64 MiB of float32 each)."""


# ------------------------------------------------------------------ GatherND
def _gather_nd_check(graph: Graph, node: Node) -> str | None:
    if not node.attrs.batch_dims:
        return "batch_dims = 0 (nothing to rewrite)"
    return static_reason(graph, node)


def _gather_nd_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    data, idx = graph.inputs_of(node)
    assert data is not None and idx is not None
    b, nb = base_name(node), int(node.attrs.batch_dims)
    ds, ish = data.type.static_shape, idx.type.static_shape
    p = math.prod(ds[:nb])
    rows = (p, *ish[nb:-1])
    flat_data = (
        data
        if nb == 1
        else rw.op("Reshape", [data, ints(rw, [p, *ds[nb:]], f"{b}_dshape")], name=f"{b}_data")
    )
    column = np.broadcast_to(np.arange(p, dtype=np.int64).reshape(p, *[1] * len(rows)), (*rows, 1))
    if idx.const is not None:
        wide = idx.const.astype(np.int64).reshape(*rows, ish[-1])
        flat_idx = rw.const(np.concatenate([column, wide], axis=-1), f"{b}_indices")
    else:
        i64 = (
            idx
            if idx.type.dtype is DType.INT64
            else rw.op("Cast", [idx], {"to": int(DType.INT64)}, name=f"{b}_i64")
        )
        if nb > 1:
            i64 = rw.op("Reshape", [i64, ints(rw, [*rows, ish[-1]], f"{b}_ishape")], name=f"{b}_rows")
        col = rw.const(np.ascontiguousarray(column), f"{b}_batch")
        flat_idx = rw.op("Concat", [col, i64], {"axis": -1}, name=f"{b}_indices")
    out = graph.value(node).type.static_shape
    gathered = rw.op("GatherND", [flat_data, flat_idx], name=b if nb == 1 else f"{b}_flat")
    if nb > 1:
        gathered = rw.op("Reshape", [gathered, ints(rw, list(out), f"{b}_oshape")], name=b)
    replace_outputs(rw, node, [gathered])


GATHER_ND_BATCH = register_decomposition(
    Decomposition(
        "gathernd-batch",
        "GatherND",
        ("Reshape", "Cast", "Concat", "GatherND"),
        _gather_nd_check,
        _gather_nd_rewrite,
        "GatherND(d, i; b) = GatherND(flat d, [batch column, i]) reshaped",
    )
)


# ---------------------------------------------------------------------- TopK
def _topk_check(graph: Graph, node: Node) -> str | None:
    if not used(graph, node, 1):
        return "the indices are not read (nothing to rewrite)"
    k = graph.inputs_of(node)[1]
    if k is None or k.const is None:
        return "k must be constant"
    why = static_reason(graph, node)
    if why is not None:
        return why
    x = graph.inputs_of(node)[0]
    assert x is not None
    shape = x.type.static_shape
    n = shape[normalize_axis(node.attrs.axis, len(shape))]
    if n > 1 << 24:
        return "the axis is longer than 2^24 (the occurrence counts are float32)"
    table = math.prod(shape) * int(k.const.reshape(-1)[0])
    if table > TABLE_CAP:
        return f"the k x n occurrence table would hold {table} elements (cap {TABLE_CAP})"
    return None


def _topk_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, kv = graph.inputs_of(node)
    assert x is not None and kv is not None and kv.const is not None
    b, a = base_name(node), node.attrs
    shape = list(x.type.static_shape)
    axis = normalize_axis(a.axis, len(shape))
    k = int(kv.const.reshape(-1)[0])
    f32 = {"to": int(DType.FLOAT32)}
    top = rw.graph.add_node(
        "TopK", [x, kv], {"axis": axis, "largest": a.largest, "sorted": 1}, name=f"{b}_values", num_outputs=2
    )
    vals = rw.graph.value(top, 0)
    before, after = shape[:axis], shape[axis + 1 :]
    xe = rw.op("Reshape", [x, ints(rw, [*before, 1, shape[axis], *after], f"{b}_xshape")], name=f"{b}_x")
    ve = rw.op("Reshape", [vals, ints(rw, [*before, k, 1, *after], f"{b}_vshape")], name=f"{b}_v")
    hits = rw.op("Cast", [rw.op("Equal", [ve, xe], name=f"{b}_eq")], f32, name=f"{b}_hits")
    inner = ints(rw, [axis + 1], f"{b}_inner")
    occ = rw.op("CumSum", [hits, inner], name=f"{b}_occ")
    beyond = rw.op("Greater" if a.largest else "Less", [xe, ve], name=f"{b}_beyond")
    ahead1 = rw.op("Cast", [beyond], f32, name=f"{b}_ahead1")
    ahead = rw.op("ReduceSum", [ahead1, inner], {"keepdims": 1}, name=f"{b}_ahead")
    pos = np.arange(1, k + 1, dtype=np.float32).reshape(
        [k if d == axis else 1 for d in range(len(shape) + 1)]
    )
    target = rw.op("Sub", [rw.const(pos, f"{b}_pos"), ahead], name=f"{b}_target")
    nth = rw.op("Cast", [rw.op("Equal", [occ, target], name=f"{b}_nth1")], f32, name=f"{b}_nth")
    pick = rw.op("Mul", [hits, nth], name=f"{b}_pick")
    idx = rw.op("ArgMax", [pick], {"axis": axis + 1, "keepdims": 0}, name=f"{b}_idx")
    replace_outputs(rw, node, [vals, idx])


TOPK_STABLE_INDICES = register_decomposition(
    Decomposition(
        "topk-stable-indices",
        "TopK",
        (
            "TopK",
            "Reshape",
            "Equal",
            "Cast",
            "CumSum",
            "Greater",
            "Less",
            "ReduceSum",
            "Sub",
            "Mul",
            "ArgMax",
        ),
        _topk_check,
        _topk_rewrite,
        "TopK indices in ONNX's tie order: the (r - #beyond + 1)-th occurrence of value r",
    )
)
