"""Ops whose value is known when the graph is lowered: computed by the registry's reference at
compile time and emitted as constants.

Shape, Size and EyeLike read only their input's shape, which is static here; ConstantOfShape and
Range need constant inputs. fold-constants folds most of them before (it caps the folded size;
these are emitted whatever their size, as the library must hold them anyway).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.table import LowerContext, const_inputs, lowers
from compiler.ir.graph import Node
from compiler.ops.registry import get_op

__all__ = ["SHAPE_ONLY"]

SHAPE_ONLY = frozenset({"Shape", "Size", "EyeLike"})
"""Ops that read only their input's (static) shape."""


def _known(ctx: LowerContext, node: Node) -> list[Any]:
    args: list[np.ndarray | None] = []
    for port, v in enumerate(ctx.graph.inputs_of(node)):
        if v is None:
            args.append(None)
        elif v.const is not None:
            args.append(v.const)
        else:
            assert node.op in SHAPE_ONLY, node.describe()
            args.append(np.zeros(ctx.in_type(node, port).static_shape, ctx.in_type(node, port).dtype.numpy))
    outs = get_op(node.op, node.domain).reference(args, node.attrs, node.num_outputs)
    return [
        ctx.const(np.asarray(o, dtype=t.dtype.numpy)) for o, t in zip(outs, node.output_types, strict=True)
    ]


@lowers(*SHAPE_ONLY)
def _shape_only(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return _known(ctx, node)


@lowers("ConstantOfShape", check=const_inputs((0, "shape")))
def _constant_of_shape(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return _known(ctx, node)


@lowers("Range", check=const_inputs((0, "start"), (1, "limit"), (2, "delta")))
def _range(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return _known(ctx, node)
