"""Converters of normalization ops and of Dropout (both have training-only forms).

* BatchNormalization: the inference form with one output. Old attributes are
  dropped: ``spatial`` (only ``spatial=1``, the per-channel form, is accepted),
  ``is_test`` and ``consumed_inputs``. ``training_mode=1`` is refused.
* Dropout: every version becomes the canonical ``Dropout(data, ratio,
  training_mode)``, which is the identity at inference; an old ``ratio``
  attribute becomes a constant input, ``is_test``/``consumed_inputs`` are dropped.
"""

from __future__ import annotations

import logging

import numpy as np

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter, register_generic

__all__: list[str] = []

logger = logging.getLogger(__name__)

register_generic(
    {
        "InstanceNormalization": 6,
        "LRN": 1,
        "LayerNormalization": 17,
        "GroupNormalization": 21,
        "MeanVarianceNormalization": 9,
        "LpNormalization": 1,
        "RMSNormalization": 23,
        "Dropout": 12,
    }
)


@converter("BatchNormalization", since=1)
def batch_norm(ctx: NodeContext) -> list[Value | None]:
    """Any BatchNormalization version -> the inference form (output Y only)."""
    spatial = ctx.pop("spatial", 1)
    if int(spatial) != 1:
        raise ctx.fail("spatial=0 (per-activation statistics) is not supported")
    ctx.pop("is_test")
    ctx.pop("consumed_inputs")
    if int(ctx.attrs.get("training_mode", 0)) != 0:
        raise ctx.fail("training_mode=1 is not supported (Kiln compiles inference graphs)")
    outs: list[Value | None] = list(ctx.emit("BatchNormalization", ctx.inputs, ctx.rest(), num_outputs=1))
    return outs + [None] * (ctx.num_outputs - 1)


@converter("Dropout", since=1)
def dropout_v1(ctx: NodeContext) -> list[Value | None]:
    """Dropout-1..11: ``ratio`` attribute -> constant input; identity at inference."""
    x = ctx.require(0)
    ctx.pop("is_test")
    ctx.pop("consumed_inputs")
    ratio = ctx.pop("ratio")
    ins: list[Value | None] = [x]
    if ratio is not None:
        ins.append(ctx.constant(np.asarray(ratio, dtype=np.float32), "ratio"))
    n = min(ctx.num_outputs, 2)
    if n == 2 and x.type.dtype.numpy != np.bool_:
        logger.debug("%s: the old Dropout mask output becomes a bool mask", ctx.where)
    return list(ctx.emit("Dropout", ins, ctx.rest(), num_outputs=n))
