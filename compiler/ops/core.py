"""Graph-structure ops: Input, Constant and Identity."""

from __future__ import annotations

import numpy as np

from compiler.ir.types import TensorType
from compiler.ops.registry import (
    ConstantAttrs,
    InferContext,
    Layout,
    OpDef,
    QuantPolicy,
    register,
    same_as_input,
)


def _no_infer(ctx: InferContext) -> list[TensorType]:
    raise ctx.fail("type is set when the node is created")


def _const_ref(ins: list[np.ndarray | None], attrs: ConstantAttrs, n: int) -> list[np.ndarray]:
    return [attrs.value]


register(OpDef("Input", _no_infer, lambda ins, a, n: [], inputs=(0, 0), doc="A graph input."))
register(OpDef("Constant", _no_infer, _const_ref, ConstantAttrs, inputs=(0, 0), doc="A constant tensor."))
register(
    OpDef(
        "Identity",
        same_as_input(),
        lambda ins, a, n: [np.asarray(ins[0])],
        layout=Layout.AGNOSTIC,
        quant=QuantPolicy.PASSTHROUGH,
        doc="y = x",
    )
)
