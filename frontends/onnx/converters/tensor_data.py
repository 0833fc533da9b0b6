"""Converters of data-movement and tensor-creation ops.

Upgrades to the canonical (opset 21) form:

* Constant: ``value``, ``value_float(s)``, ``value_int(s)``, ``value_string(s)``
  and ``sparse_value`` become a Kiln constant.
* Cast: a string ``to`` (opset 1, some exporters) becomes the element type code.
* Slice-1: ``starts``/``ends``/``axes`` attributes become int64 inputs.
* Split-2..12: a ``split`` attribute becomes an input; Split without sizes
  (before 18) gets ``num_outputs`` = its output count.
* Pad-2..10: ``pads``/``value`` attributes become inputs.
* TopK-1: the ``k`` attribute becomes a 1-D int64 input.
* Scatter-9 (deprecated in 11) is ScatterElements without a reduction.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []

register_generic(
    {
        "Concat": 4,
        "Gather": 1,
        "GatherElements": 11,
        "GatherND": 11,
        "ScatterElements": 11,
        "ScatterND": 11,
        "ConstantOfShape": 9,
        "Range": 11,
        "NonZero": 9,
        "OneHot": 9,
        "Trilu": 14,
        "CumSum": 11,
        "CumProd": 26,
        "ReverseSequence": 10,
        "Slice": 10,
        "Split": 18,
        "Pad": 11,
        "TopK": 10,
        "CastLike": 15,
        "RandomNormalLike": 1,
        "RandomUniformLike": 1,
        "EyeLike": 9,
        "Compress": 9,
        "Unique": 11,
    }
)

_CONSTANT_ATTRS = {
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
    "value_string": object,
    "value_strings": object,
}


@converter("Constant", since=1, needs=("Constant",))
def constant(ctx: NodeContext) -> list[Value]:
    """A Constant node becomes a Kiln constant named by the node's output."""
    if len(ctx.attrs) != 1:
        raise ctx.fail(f"expected exactly one value attribute, got {sorted(ctx.attrs) or 'none'}")
    key, val = next(iter(ctx.attrs.items()))
    ctx.attrs.clear()
    if key in ("value", "sparse_value"):
        arr = np.asarray(val)
    elif key in _CONSTANT_ATTRS:
        arr = np.asarray(val, dtype=_CONSTANT_ATTRS[key])
    else:
        raise ctx.fail(f"unsupported attribute {key!r}")
    name = ctx.proto.output[0]
    return [ctx.graph.add_constant(arr, name=name)]


def _dtype_code(ctx: NodeContext, to: Any) -> int:
    if to is None:
        raise ctx.fail("Cast needs the 'to' attribute")
    if isinstance(to, str):
        try:
            return int(onnx.TensorProto.DataType.Value(to.upper()))
        except ValueError:
            raise ctx.fail(f"unknown element type name to={to!r}") from None
    return int(to)


@converter("Cast", since=1)
def cast(ctx: NodeContext) -> list[Value]:
    """Cast: ``to`` is a type code, or a type name string (opset 1 and some exporters)."""
    return ctx.emit("Cast", ctx.inputs, ctx.rest(to=_dtype_code(ctx, ctx.pop("to"))))


@converter("Slice", since=1)
def slice_v1(ctx: NodeContext) -> list[Value]:
    """Slice-1: starts/ends/axes attributes -> inputs."""
    starts, ends, axes = ctx.pop("starts"), ctx.pop("ends"), ctx.pop("axes")
    if starts is None or ends is None:
        raise ctx.fail("Slice-1 needs 'starts' and 'ends'")
    ins = [ctx.require(0), ctx.ints(starts, "starts"), ctx.ints(ends, "ends")]
    if axes is not None:
        ins.append(ctx.ints(axes, "axes"))
    return ctx.emit("Slice", ins, ctx.rest())


@converter("Split", since=2)
def split_v2(ctx: NodeContext) -> list[Value]:
    """Split-2..12: ``split`` attribute -> input (else ``num_outputs``)."""
    split = ctx.pop("split")
    if split is not None:
        return ctx.emit("Split", [ctx.require(0), ctx.ints(split, "split")], ctx.rest())
    return ctx.emit("Split", [ctx.require(0)], ctx.rest(num_outputs=ctx.num_outputs))


@converter("Split", since=13)
def split_v13(ctx: NodeContext) -> list[Value]:
    """Split-13..17: without a ``split`` input the outputs are equal parts."""
    if ctx.input(1) is None:
        return ctx.emit("Split", [ctx.require(0)], ctx.rest(num_outputs=ctx.num_outputs))
    return ctx.emit("Split", ctx.inputs, ctx.rest())


@converter("Pad", since=2)
def pad_v2(ctx: NodeContext) -> list[Value]:
    """Pad-2..10: ``pads``/``value`` attributes -> inputs."""
    x = ctx.require(0)
    pads = ctx.pop("pads", ctx.pop("paddings"))
    if pads is None:
        raise ctx.fail("Pad needs 'pads'")
    value = float(ctx.pop("value", 0.0))
    ins: list[Value | None] = [x, ctx.ints(pads, "pads")]
    if value != 0.0:
        ins.append(ctx.constant(np.asarray(value, dtype=x.type.dtype.numpy), "value"))
    return ctx.emit("Pad", ins, ctx.rest())


@converter("TopK", since=1)
def topk_v1(ctx: NodeContext) -> list[Value]:
    """TopK-1: ``k`` attribute -> input."""
    k = ctx.pop("k")
    if k is None:
        raise ctx.fail("TopK-1 needs 'k'")
    return ctx.emit("TopK", [ctx.require(0), ctx.ints([int(k)], "k")], ctx.rest())


@converter("Scatter", since=9, needs=("ScatterElements",))
def scatter_v9(ctx: NodeContext) -> list[Value]:
    """Scatter-9/11: the old name of ScatterElements."""
    return ctx.emit("ScatterElements", ctx.inputs, ctx.rest())
