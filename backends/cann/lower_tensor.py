"""Lowerings of data-movement ops: Gather, Expand, Pad (constant operands), Split, ScatterND.

The forms are the ones ATC's ONNX parser writes (ops-plugin ``onnx_plugin``):

* ``Gather`` -> ``GatherV2(x, indices, axis)`` with ``axis`` a 0-d int32 Const and
  ``negative_index_support = true`` (ONNX indices may count from the back). ATC wrote the
  deprecated ``GatherV2D`` (``axis`` an attribute) until about 2021; today's parser builds
  GatherV2 with the Const axis, so Kiln writes that (and reads both back).
* ``Expand`` -> ``Expand(x, shape)``, ``shape`` an int64 Const holding the static output shape
  (the broadcast of the input's shape and ONNX's ``shape`` input).
* ``Pad`` -> ``PadV3(x, paddings[, constant_values])`` with ``paddings`` an int64 Const in
  ONNX's order ``[b_0, .., b_{r-1}, e_0, .., e_{r-1}]`` over all axes, hence
  ``paddings_contiguous = false``, and ``mode`` constant / reflect / edge (GE's names are
  ONNX's). ONNX's ``axes`` input is folded into the full-rank paddings; ``constant_values`` is
  only written in constant mode. Negative pads (crops) and ``wrap`` have no PadV3 form.
* ``Split`` -> ``SplitD`` (equal parts) / ``SplitVD`` (``size_splits``), one GE op with every output.
* ``ScatterND`` -> ``TensorMove`` + ``ScatterNdUpdate`` / ``ScatterNdAdd`` / ``ScatterNdMax`` /
  ``ScatterNdMin`` (reduction ``mul`` has none).
"""

from __future__ import annotations

import numpy as np

from backends.cann.lower import Lowerer, Step, lowering
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType, TensorType
from compiler.ops.shapes import normalize_axes, normalize_axis
from schemas.cann.om_graph import Attr

__all__ = ["PAD_MODES", "full_pads"]

PAD_MODES = ("constant", "reflect", "edge")


@lowering("Gather")
def _gather(low: Lowerer, node: Node) -> None:
    x, idx = low.g.inputs_of(node)
    assert x is not None and x.type.rank is not None
    axis = normalize_axis(node.attrs.axis, x.type.rank)
    # A 0-d Const as ATC writes it (Lowerer.const makes 1-element arrays of 0-d ones).
    axis_t = TensorType(DType.INT32, ())
    c = low.emit(
        low.names.fresh(f"{low.g.value(node).name}/axis"),
        "Const",
        [],
        [low.desc(axis_t)],
        value=np.array(axis, np.int32),
    )
    attrs = {"batch_dims": Attr.i(0), "negative_index_support": Attr.b(True)}
    low.chain(node, [low.ref_of(x), low.ref_of(idx), c], [Step("GatherV2", [], attrs)])


@lowering("Expand")
def _expand(low: Lowerer, node: Node) -> None:
    x = low.g.inputs_of(node)[0]
    assert x is not None
    out = low.g.value(node)
    shape = low.desc(out.type, node).shape
    c = low.const(np.array(shape, np.int64), f"{out.name}/shape")
    low.chain(node, [low.ref_of(x), c], [Step("Expand", [], {})])


def full_pads(graph: Graph, node: Node) -> list[int] | None:
    """A Pad node's pads over every axis, ONNX order ``[begins..., ends...]``; None if not constant."""
    ins = list(graph.inputs_of(node)) + [None, None]
    x, pads_v, axes_v = ins[0], ins[1], ins[3]
    assert x is not None and x.type.rank is not None
    rank = x.type.rank
    if pads_v is None or pads_v.const is None or (axes_v is not None and axes_v.const is None):
        return None
    pads = [int(v) for v in pads_v.const.reshape(-1)]
    axes = list(range(rank))
    if axes_v is not None and axes_v.const is not None:
        axes = normalize_axes([int(v) for v in axes_v.const.reshape(-1)], rank)
    full = [0] * (2 * rank)
    for k, ax in enumerate(axes):
        full[ax], full[rank + ax] = pads[k], pads[k + len(axes)]
    return full


def _pad_reason(graph: Graph, node: Node) -> str | None:
    if node.attrs.mode not in PAD_MODES:
        return f"mode {node.attrs.mode!r} has no PadV3 form (constant, reflect, edge)"
    pads = full_pads(graph, node)
    if pads is None:
        return "pads and axes must be constant"
    if min(pads, default=0) < 0:
        return f"negative pads {pads} (crops) have no PadV3 form"
    return None


@lowering("Pad", check=_pad_reason)
def _pad(low: Lowerer, node: Node) -> None:
    ins = list(low.g.inputs_of(node)) + [None, None]
    x, value = ins[0], ins[2]
    pads = full_pads(low.g, node)
    assert x is not None and pads is not None
    c = low.const(np.array(pads, np.int64), f"{low.g.value(node).name}/paddings")
    mode = node.attrs.mode
    keep = mode == "constant" and value is not None and (value.const is None or value.const.size > 0)
    extra = [low.ref_of(value)] if keep else []
    attrs = {"mode": Attr.s(mode), "paddings_contiguous": Attr.b(False)}
    low.chain(node, [low.ref_of(x), c, *extra], [Step("PadV3", [], attrs)])


@lowering("Split", multi_output=True)
def _split(low: Lowerer, node: Node) -> None:
    """``Split`` -> ``SplitD(x)`` (equal parts: ``split_dim``, ``num_split``) or ``SplitVD(x)``
    (``size_splits`` too), the forms of ATC's ONNX parser; the GE op writes every output."""
    x = low.g.inputs_of(node)[0]
    assert x is not None and x.type.rank is not None
    axis = normalize_axis(node.attrs.axis, x.type.rank)
    outs = low.g.outputs_of(node)
    sizes = [v.type.static_shape[axis] for v in outs]
    attrs = {"split_dim": Attr.i(axis), "num_split": Attr.i(len(outs))}
    kind = "SplitD" if len(set(sizes)) == 1 else "SplitVD"
    if kind == "SplitVD":
        attrs = {"size_splits": Attr.li(sizes), **attrs}
    name = outs[0].name
    low.emit(name, kind, [low.ref_of(x)], [low.desc(v.type, node) for v in outs], attrs)
    for port in range(len(outs)):
        low.bind(node, f"{name}:{port}", port)


SCATTER_ND_OPS = {
    "none": "ScatterNdUpdate",
    "add": "ScatterNdAdd",
    "max": "ScatterNdMax",
    "min": "ScatterNdMin",
}
"""ONNX ScatterND's reduction -> the GE op of ATC's ScatterND plugin (after ``TensorMove``)."""


def _scatter_nd_reason(graph: Graph, node: Node) -> str | None:
    r = node.attrs.reduction
    return (
        None
        if r in SCATTER_ND_OPS
        else f"reduction {r!r} has no GE ScatterNd op ({', '.join(SCATTER_ND_OPS)})"
    )


@lowering("ScatterND", check=_scatter_nd_reason)
def _scatter_nd(low: Lowerer, node: Node) -> None:
    """``ScatterND(data, indices, updates)`` -> ``ScatterNdUpdate(TensorMove(data), indices, updates)``
    (Add/Max/Min for the reductions), as ATC's ONNX ScatterND plugin builds it: TensorMove copies
    ``data`` into the buffer the ref-style scatter updates."""
    data, idx, upd = low.g.inputs_of(node)
    steps = [
        Step("TensorMove", [], {}),
        Step(
            SCATTER_ND_OPS[node.attrs.reduction],
            [low.ref_of(idx), low.ref_of(upd)],
            {"use_locking": Attr.b(False)},
        ),
    ]
    low.chain(node, [low.ref_of(data)], steps)
