"""BatchNorm (inference mode).

BatchNorm's inputs are (x, scale, bias, mean, variance) and in inference mode
y = (x - mean) / sqrt(variance + eps) * scale + bias. The dumped operator lists
four outputs (running statistics first) and y is the last; the statistics are
not produced. Per-channel parameters (``DIM_1C11`` on 4-D x) become ONNX
BatchNormalization; other parameter shapes use the formula with broadcasting.
"""

from __future__ import annotations

import numpy as np

from frontends.megengine.converter import OprContext, Var, converter
from frontends.megengine.enums import enum_name
from frontends.megengine.layouts import relayout
from schemas.megengine.generated import params_generated as P

__all__: list[str] = []


@converter("BatchNorm")
def batch_norm(ctx: OprContext) -> list[Var | None]:
    """y = (x - mean) / sqrt(var + eps) * scale + bias; only y (the last output) is produced."""
    ctx.need_inputs(5, 5)
    p = ctx.param(P.BN)
    if enum_name(P.BNFwdMode, p.FwdMode()) != "INFERENCE":
        raise ctx.fail("only inference-mode BatchNorm (fwd_mode=INFERENCE) can be imported")
    eps = float(p.Epsilon())
    x, scale, bias, mean, var = (ctx.value(i) for i in range(5))
    dim = enum_name(P.BNParamDim, p.ParamDim())
    nout = max(len(ctx.opr.outputs), 1)
    if dim == "DIM_1C11" and x.type.rank == 4:
        c = ctx.shape(x)[1]
        params = []
        for v in (scale, bias, mean, var):
            if ctx.shape(v) != (1, c, 1, 1):
                raise ctx.fail(f"parameter {v.name!r} has shape {v.type}, expected [1, {c}, 1, 1]")
            params.append(relayout(ctx, v, [("reshape", (c,))]))
        y = ctx.emit1("BatchNormalization", [x, *params], {"epsilon": eps}, final=True)
    else:
        dt = x.type.dtype.numpy
        std = ctx.emit1("Sqrt", [ctx.emit1("Add", [var, ctx.constant(np.asarray(eps, dt), "eps")])])
        y = ctx.emit1("Div", [ctx.emit1("Sub", [x, mean]), std])
        y = ctx.emit1("Add", [ctx.emit1("Mul", [y, scale]), bias])
    return [*([None] * (nout - 1)), Var(y, ctx.out_dtype(ctx.dtype(0)))]
