"""Normalizations and the remaining pointwise families: BatchNormalization (inference, folded to
y = x * s + t with s = gamma / sqrt(var + eps), t = beta - mean * s), InstanceNormalization,
LayerNormalization and RMSNormalization (on CPU one row kernel each, :mod:`backends.tvm.kernels.
row_norm`), PRelu, Elu, Softplus, variadic Sum/Mean."""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.tvm.lowering.math import softplus
from backends.tvm.lowering.table import LowerContext, const_inputs, lowers, single_output
from compiler.backend import all_of
from compiler.ir.graph import Graph, Node

__all__: list[str] = []


def _op() -> Any:
    from tvm import relax

    return relax.op


def _per_channel(v: np.ndarray, rank: int) -> np.ndarray:
    return v.reshape((1, -1) + (1,) * (rank - 2)).astype(np.float32)


_BN_PARAMS = ("scale", "B", "mean", "var")


def _inference_reason(graph: Graph, node: Node) -> str | None:
    if node.attrs.training_mode or node.num_outputs > 1:
        return "training-mode BatchNormalization has no TVM lowering"
    return None


@lowers(
    "BatchNormalization",
    check=all_of(_inference_reason, const_inputs(*((i, n) for i, n in enumerate(_BN_PARAMS, 1)))),
)
def _batchnorm(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    rank = len(ctx.in_type(node, 0).shape or ())
    gamma, beta, mean, var = (ctx.require_const(node, i, n) for i, n in enumerate(_BN_PARAMS, 1))
    s = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + float(node.attrs.epsilon))
    t = beta.astype(np.float64) - mean.astype(np.float64) * s
    op = _op()
    y = op.add(op.multiply(ins[0], ctx.const(_per_channel(s, rank))), ctx.const(_per_channel(t, rank)))
    return [ctx.emit(y)]


def _normalize(ctx: LowerContext, x: Any, axes: list[int], eps: float) -> Any:
    """(x - mean) / sqrt(var + eps) over ``axes`` (biased variance)."""
    op = _op()
    mu = ctx.emit(op.mean(x, axes, keepdims=True))
    d = ctx.emit(op.subtract(x, mu))
    var = ctx.emit(op.mean(op.multiply(d, d), axes, keepdims=True))
    return ctx.emit(op.divide(d, op.sqrt(op.add(var, ctx.scalar(eps, "float32")))))


@lowers("InstanceNormalization", check=const_inputs((1, "scale"), (2, "B")))
def _instancenorm(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    rank = len(ctx.in_type(node, 0).shape or ())
    y = _normalize(ctx, ins[0], list(range(2, rank)), float(node.attrs.epsilon))
    op = _op()
    scale = ctx.const(_per_channel(ctx.require_const(node, 1, "scale"), rank))
    bias = ctx.const(_per_channel(ctx.require_const(node, 2, "B"), rank))
    return [ctx.emit(op.add(op.multiply(y, scale), bias))]


def _row_norm(ctx: LowerContext, node: Node, ins: list[Any], kind: str, axis: int, eps: float) -> Any | None:
    """``kind`` ("layer"/"rms") normalization as Kiln's one-pass row kernel on CPU targets: x
    float32 viewed as [rows, N] over ``axis``.., gamma (and beta) constants or values of exactly the
    normalized shape; None when that does not hold (the caller takes the Relax ops)."""
    from backends.tvm.kernels.row_norm import RowNormSpec, row_norm_kernel, row_norm_width

    t = ctx.in_type(node, 0)
    shape = t.static_shape
    if not ctx.target.is_cpu or t.dtype.numpy.name != "float32":
        return None
    inner = shape[axis:]
    width = int(np.prod(inner)) if inner else 1
    rows = int(np.prod(shape[:axis])) if axis else 1
    vec = row_norm_width(width, ctx.target.lanes)
    params = [ins[1]] + ([ins[2]] if kind == "layer" and len(ins) > 2 and ins[2] is not None else [])
    for port in range(1, len(params) + 1):
        pt = ctx.in_type(node, port)
        if pt.dtype.numpy.name != "float32" or tuple(pt.static_shape) != tuple(inner):
            return None
    if vec is None or width < vec:
        return None
    op = _op()
    flat = [ctx.emit(op.reshape(p, (width,))) if len(inner) != 1 else p for p in params]
    x2 = ins[0] if len(shape) == 2 and axis == 1 else ctx.emit(op.reshape(ins[0], (rows, width)))
    spec = RowNormSpec(kind, rows, width, eps, len(params) > 1, vec)
    y = ctx.call_kernel(row_norm_kernel(spec, ctx.target), [x2, *flat])
    return y if len(shape) == 2 and axis == 1 else ctx.emit(op.reshape(y, tuple(shape)))


@lowers(
    "LayerNormalization", check=single_output("LayerNormalization's mean/inv-std outputs have no lowering")
)
def _layernorm(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """CPU: Kiln's one-pass row kernel (:func:`_row_norm`); otherwise mean, variance and the
    affine tail as Relax ops."""
    rank = len(ctx.in_type(node, 0).shape or ())
    axis = int(node.attrs.axis) % rank
    fused = _row_norm(ctx, node, ins, "layer", axis, float(node.attrs.epsilon))
    if fused is not None:
        return [fused]
    y = _normalize(ctx, ins[0], list(range(axis, rank)), float(node.attrs.epsilon))
    op = _op()
    y = ctx.emit(op.multiply(y, ins[1]))
    if len(ins) > 2 and ins[2] is not None:
        y = ctx.emit(op.add(y, ins[2]))
    return [y]


@lowers("PRelu")
def _prelu(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    op = _op()
    zero = ctx.scalar(0.0, "float32")
    return [ctx.emit(op.where(op.greater_equal(ins[0], zero), ins[0], op.multiply(ins[0], ins[1])))]


@lowers("Elu")
def _elu(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    op = _op()
    x = ins[0]
    neg = op.multiply(
        ctx.scalar(float(node.attrs.alpha), "float32"), op.subtract(op.exp(x), ctx.scalar(1.0, "float32"))
    )
    return [ctx.emit(op.where(op.greater_equal(x, ctx.scalar(0.0, "float32")), x, neg))]


@lowers("Softplus")
def _softplus(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    return [softplus(ctx, ins[0], ctx.in_type(node, 0).dtype.numpy.name)]


def _lp_reason(graph: Graph, node: Node) -> str | None:
    return None if node.attrs.p in (1, 2) else f"LpNormalization p={node.attrs.p} (only 1 and 2 exist)"


@lowers("LpNormalization", check=_lp_reason)
def _lp_normalization(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """x / ||x||_p along ``axis`` (p = 1: sum |x|; p = 2: sqrt(sum x^2))."""
    op = _op()
    axis = int(node.attrs.axis) % len(ctx.in_type(node, 0).static_shape)
    if node.attrs.p == 1:
        norm = op.sum(op.abs(ins[0]), [axis], keepdims=True)
    else:
        norm = op.sqrt(op.sum(op.multiply(ins[0], ins[0]), [axis], keepdims=True))
    return [ctx.emit(op.divide(ins[0], ctx.emit(norm)))]


@lowers("RMSNormalization")
def _rms_normalization(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """x / sqrt(mean(x^2 over axis..) + eps) * scale; the statistics in float32 when stash_type = 1."""
    op = _op()
    dt = ctx.in_type(node, 0).dtype.numpy.name
    rank = len(ctx.in_type(node, 0).static_shape)
    axes = list(range(int(node.attrs.axis) % rank, rank))
    fused = _row_norm(ctx, node, ins, "rms", axes[0], float(node.attrs.epsilon))
    if fused is not None:
        return [fused]
    stat = "float32" if node.attrs.stash_type == 1 else dt
    x = ins[0] if stat == dt else ctx.emit(op.astype(ins[0], stat))
    ms = ctx.emit(op.mean(op.multiply(x, x), axes, keepdims=True))
    y = ctx.emit(op.divide(x, op.sqrt(op.add(ms, ctx.scalar(float(node.attrs.epsilon), stat)))))
    if stat != dt:
        y = ctx.emit(op.astype(y, dt))
    return [ctx.emit(op.multiply(y, ins[1]))]


@lowers("LRN")
def _lrn(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """x / (bias + alpha / size * sum of x^2 over the channel window)^beta (window
    [c - floor((size-1)/2), c + ceil((size-1)/2)], zero outside)."""
    op = _op()
    a = node.attrs
    dt = ctx.in_type(node, 0).dtype.numpy.name
    shape = ctx.in_type(node, 0).static_shape
    size, rank = int(a.size), len(shape)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = ctx.emit(op.multiply(ins[0], ins[0]))
    width = [0, 0, lo, hi] + [0, 0] * (rank - 2)
    padded = ctx.emit(op.nn.pad(sq, width, "constant", 0.0))
    c = shape[1]
    parts = [ctx.emit(op.strided_slice(padded, [1], [i], [i + c])) for i in range(size)]
    total = parts[0]
    for p in parts[1:]:
        total = ctx.emit(op.add(total, p))
    base = op.add(ctx.scalar(float(a.bias), dt), op.multiply(total, ctx.scalar(float(a.alpha) / size, dt)))
    return [ctx.emit(op.divide(ins[0], op.power(base, ctx.scalar(float(a.beta), dt))))]


@lowers("Sum", "Mean")
def _variadic(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    op = _op()
    out = ins[0]
    for x in ins[1:]:
        out = ctx.emit(op.add(out, x))
    if node.op == "Mean" and len(ins) > 1:
        out = ctx.emit(op.divide(out, ctx.scalar(float(len(ins)), ctx.out_type(node).dtype.numpy.name)))
    return [out]
