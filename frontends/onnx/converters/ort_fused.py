"""Converters of the fused ops onnxruntime's graph optimizer writes into a saved optimized model.

A model saved by onnxruntime (``SessionOptions.optimized_model_filepath``, basic or extended
level) holds ops of its own; each becomes the plain ops it fused (checked against onnxruntime):

* FusedConv(X, W[, B[, Z]]) = act(conv(X, W) + B + Z); ``activation_params`` are positional:
  LeakyRelu [alpha], HardSigmoid [alpha, beta], Clip [min, max].
* FusedGemm(A, B[, C]) = act(Gemm(A, B, C)); ``activation_alpha/beta/gamma`` are the
  activation's alpha, beta and gamma (e.g. Selu's alpha and gamma).
* FusedMatMul(A, B) = alpha · op(A) · op(B) (TransposeMatMul: the same without transBatch): with
  ``transBatch``, a rank-r operand [d0, d1, ..., d(r-1)] is first permuted to
  [d1, ..., d(r-2), d0, d(r-1)] (both of one rank >= 3, as onnxruntime demands); with
  ``trans`` its last two axes are then swapped.
* QuickGelu(x) = x · sigmoid(alpha x), alpha = 1.702 by default.
* SimplifiedLayerNormalization(x, γ) = RMSNormalization(x, γ; axis, epsilon), output 1 = 1/rms.
* SkipSimplifiedLayerNormalization(x, skip, γ[, bias]): s = x + skip (+ bias),
  y = RMSNormalization(s, γ; last axis); outputs y, mean (unused), 1/rms, s.
* LayerNormalization before opset 17 (onnxruntime registers it from opset 1) is the opset-17 op.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.ir.graph import Value
from frontends.onnx.converter import NodeContext, converter

__all__: list[str] = []

MS = "com.microsoft"

# activation name -> (ONNX op, its float attributes in activation_params order)
_ACTIVATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Relu": ("Relu", ()),
    "Tanh": ("Tanh", ()),
    "Sigmoid": ("Sigmoid", ()),
    "LeakyRelu": ("LeakyRelu", ("alpha",)),
    "HardSigmoid": ("HardSigmoid", ("alpha", "beta")),
    "Clip": ("Clip", ("min", "max")),
    "Elu": ("Elu", ("alpha",)),
    "Selu": ("Selu", ("alpha", "gamma")),
    "ThresholdedRelu": ("ThresholdedRelu", ("alpha",)),
    "Softplus": ("Softplus", ()),
    "Softsign": ("Softsign", ()),
    "HardSwish": ("HardSwish", ()),
}
_ACTIVATION_NEEDS = tuple(sorted({op for op, _ in _ACTIVATIONS.values()}))


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _check_activation(ctx: NodeContext, name: str | None) -> None:
    if name is not None and name not in _ACTIVATIONS:
        raise ctx.fail(f"activation {name!r} is not supported (supported: {', '.join(_ACTIVATIONS)})")


def _activate(ctx: NodeContext, y: Value, name: str, params: dict[str, float]) -> list[Value]:
    """act(y) as the ONNX op, under the node's output names."""
    op, _ = _ACTIVATIONS[name]
    if op == "Clip":
        dt = y.type.dtype.numpy
        bounds = [ctx.constant(np.asarray(params[k], dt), k) if k in params else None for k in ("min", "max")]
        return ctx.emit("Clip", [y, *bounds])
    return ctx.emit(op, [y], params or None)


def _positional_params(ctx: NodeContext, name: str | None, values: Sequence[float]) -> dict[str, float]:
    """``activation_params`` by the activation's attribute names."""
    if name is None or name not in _ACTIVATIONS:
        return {}
    names = _ACTIVATIONS[name][1]
    if values and len(values) != len(names):
        raise ctx.fail(f"activation {name} takes {len(names)} activation_params, got {len(values)}")
    return {k: float(v) for k, v in zip(names, values, strict=False)}


@converter("FusedConv", since=1, domain=MS, needs=("Conv", "Add", *_ACTIVATION_NEEDS))
def fused_conv(ctx: NodeContext) -> list[Value]:
    """act(conv(X, W) + B + Z)."""
    act = ctx.pop("activation")
    name = None if act is None else _text(act)
    _check_activation(ctx, name)
    params = _positional_params(ctx, name, list(ctx.pop("activation_params", ()) or ()))
    z = ctx.input(3)
    conv = [ctx.require(0), ctx.require(1), ctx.input(2)]
    if name is None and z is None:
        return ctx.emit("Conv", conv, ctx.rest())
    (y,) = ctx.emit("Conv", conv, ctx.rest(), final=False)
    if z is not None:
        if name is None:
            return ctx.emit("Add", [y, z])
        (y,) = ctx.emit("Add", [y, z], final=False)
    assert name is not None
    return _activate(ctx, y, name, params)


@converter("FusedGemm", since=1, domain=MS, needs=("Gemm", *_ACTIVATION_NEEDS))
def fused_gemm(ctx: NodeContext) -> list[Value]:
    """act(alpha op(A) op(B) + beta C)."""
    act = ctx.pop("activation")
    name = None if act is None else _text(act)
    _check_activation(ctx, name)
    params: dict[str, float] = {
        k: float(v)
        for k in ("alpha", "beta", "gamma")
        if (v := ctx.pop(f"activation_{k}")) is not None
        and name in _ACTIVATIONS
        and k in _ACTIVATIONS[name][1]
    }
    gemm = [ctx.require(0), ctx.require(1), ctx.input(2)]
    if name is None:
        return ctx.emit("Gemm", gemm, ctx.rest())
    (y,) = ctx.emit("Gemm", gemm, ctx.rest(), final=False)
    return _activate(ctx, y, name, params)


def _operand(ctx: NodeContext, i: int, batch: bool, trans: bool) -> Value:
    """Operand ``i`` after FusedMatMul's transBatch and trans permutations."""
    x = ctx.require(i)
    rank = len(x.type.shape) if x.type.shape is not None else None
    if trans and rank is None:
        raise ctx.fail(f"input {i} needs a known rank for trans")
    if rank is None or rank < 2 or not (batch or trans):
        return x
    perm = list(range(rank))
    if batch:
        perm = [*range(1, rank - 1), 0, rank - 1]
    if trans:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    if perm == list(range(rank)):
        return x
    return ctx.emit("Transpose", [x], {"perm": tuple(perm)}, final=False)[0]


def _fused_matmul(ctx: NodeContext) -> list[Value]:
    """alpha · op(A) · op(B)."""
    alpha = float(ctx.pop("alpha", 1.0))
    batched = ctx.op_type == "FusedMatMul"  # TransposeMatMul has no transBatch attributes
    tba, tbb = (
        (bool(ctx.pop("transBatchA", 0)), bool(ctx.pop("transBatchB", 0))) if batched else (False, False)
    )
    if tba or tbb:
        ranks = [None if (shape := ctx.type(i).shape) is None else len(shape) for i in (0, 1)]
        if ranks[0] is None or ranks[0] != ranks[1] or ranks[0] < 3:
            raise ctx.fail(f"transBatch needs both inputs of one rank >= 3, got ranks {ranks}")
    a = _operand(ctx, 0, tba, bool(ctx.pop("transA", 0)))
    b = _operand(ctx, 1, tbb, bool(ctx.pop("transB", 0)))
    if alpha == 1.0:
        return ctx.emit("MatMul", [a, b], ctx.rest())
    (y,) = ctx.emit("MatMul", [a, b], ctx.rest(), final=False)
    return ctx.emit("Mul", [y, ctx.constant(np.asarray(alpha, y.type.dtype.numpy), "alpha")])


for _op_type in ("FusedMatMul", "TransposeMatMul"):
    converter(_op_type, since=1, domain=MS, needs=("MatMul", "Transpose", "Mul"))(_fused_matmul)


@converter("QuickGelu", since=1, domain=MS, needs=("Mul", "Sigmoid"))
def quick_gelu(ctx: NodeContext) -> list[Value]:
    """x · sigmoid(alpha x)."""
    x = ctx.require(0)
    alpha = float(ctx.pop("alpha", 1.702))
    s = x
    if alpha != 1.0:
        (s,) = ctx.emit("Mul", [x, ctx.constant(np.asarray(alpha, x.type.dtype.numpy), "alpha")], final=False)
    (g,) = ctx.emit("Sigmoid", [s], final=False)
    return ctx.emit("Mul", [x, g])


def _inv_rms(ctx: NodeContext, x: Value, axis: int, eps: float) -> Value:
    """1 / sqrt(mean(x² over [axis, rank)) + eps), keepdims."""
    rank = len(x.type.shape or ())
    axes = ctx.ints(range(axis % rank if rank else 0, rank), "rms_axes")
    (sq,) = ctx.emit("Mul", [x, x], final=False)
    (ms,) = ctx.emit("ReduceMean", [sq, axes], {"keepdims": 1}, final=False)
    (var,) = ctx.emit("Add", [ms, ctx.constant(np.asarray(eps, x.type.dtype.numpy), "eps")], final=False)
    (rms,) = ctx.emit("Sqrt", [var], final=False)
    return ctx.emit("Reciprocal", [rms], final=False)[0]


def _rms_outputs(
    ctx: NodeContext, s: Value, scale: Value, axis: int, eps: float, stash: int, inv_port: int
) -> list[Value | None]:
    """RMSNormalization(s) under output 0, 1/rms under output ``inv_port`` when it is used."""
    attrs = {"axis": axis, "epsilon": eps, "stash_type": stash}
    (y,) = ctx.emit("RMSNormalization", [s, scale], attrs, num_outputs=1)
    outs: list[Value | None] = [y] + [None] * (ctx.num_outputs - 1)
    if ctx.num_outputs > inv_port and ctx.proto.output[inv_port]:
        inv = _inv_rms(ctx, s, axis, eps)
        ctx.graph.rename(inv, ctx.proto.output[inv_port])
        outs[inv_port] = inv
    return outs


_RMS_NEEDS = ("RMSNormalization", "Add", "Mul", "ReduceMean", "Sqrt", "Reciprocal")


@converter("SimplifiedLayerNormalization", since=1, needs=_RMS_NEEDS)
def simplified_layer_norm(ctx: NodeContext) -> list[Value | None]:
    """RMSNormalization(x, γ); output 1 = 1/rms."""
    axis, eps = int(ctx.pop("axis", -1)), float(ctx.pop("epsilon", 1e-5))
    stash = int(ctx.pop("stash_type", 1))
    return _rms_outputs(ctx, ctx.require(0), ctx.require(1), axis, eps, stash, inv_port=1)


@converter("SkipSimplifiedLayerNormalization", since=1, domain=MS, needs=_RMS_NEEDS)
def skip_simplified_layer_norm(ctx: NodeContext) -> list[Value | None]:
    """RMSNormalization(x + skip (+ bias), γ); the sum is output 3, 1/rms output 2."""
    eps = float(ctx.pop("epsilon", 1e-12))
    (s,) = ctx.emit("Add", [ctx.require(0), ctx.require(1)], final=False)
    if ctx.input(3) is not None:
        (s,) = ctx.emit("Add", [s, ctx.require(3)], final=False)
    if ctx.num_outputs > 1 and ctx.proto.output[1]:
        raise ctx.fail("output 1 (mean) is not defined for SkipSimplifiedLayerNormalization")
    outs = _rms_outputs(ctx, s, ctx.require(2), -1, eps, 1, inv_port=2)
    if ctx.num_outputs > 3 and ctx.proto.output[3]:
        ctx.graph.rename(s, ctx.proto.output[3])
        outs[3] = s
    return outs


@converter("LayerNormalization", since=1, needs=("LayerNormalization",))
def layer_norm_v1(ctx: NodeContext) -> list[Value]:
    """onnxruntime's LayerNormalization-1, the same op as opset 17's."""
    return ctx.emit("LayerNormalization", ctx.inputs, ctx.rest())
