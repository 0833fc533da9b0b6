"""Decompositions of normalizations.

layer-norm: over the axes A = [axis, rank),
    mean = ReduceMean_A(x),  d = x - mean,  var = ReduceMean_A(d * d),
    y = d / sqrt(var + eps) * scale + B,
    Mean = mean,  InvStdDev = 1 / sqrt(var + eps)
(the order of onnxruntime's float32 kernel as far as ops allow). layer-norm-stash is the
same in float32 between Casts, for a float16/bfloat16 x whose stash_type=1 asks for
float32 statistics.

log-softmax: along ``axis``, m = ReduceMax(x), d = x - m, y = d - log(ReduceSum(exp(d)))
(the max-shifted form onnxruntime computes: exp(d) <= 1, so nothing overflows, and
log(softmax(x)) would underflow to -inf where softmax(x) rounds to 0).
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.shapes import normalize_axis
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, ints, replace_outputs, static_reason, used

__all__ = ["LAYER_NORM", "LAYER_NORM_STASH", "LOG_SOFTMAX"]


def _stash_dtype(node: Node, x: Value) -> DType:
    return DType.FLOAT32 if node.attrs.stash_type == 1 else x.type.dtype


def _check(graph: Graph, node: Node, cast: bool) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if not x.type.dtype.is_float:
        return "x is not float"
    if x.type.rank is None:
        return "rank of x is unknown"
    why = static_reason(graph, node)
    if why:
        return why
    needs_cast = _stash_dtype(node, x) != x.type.dtype
    if needs_cast and not cast:
        return f"statistics are stashed in float32 but x is {x.type.dtype.short} (see layer-norm-stash)"
    if cast and not needs_cast:
        return "statistics are stashed in x's dtype (no Cast needed; see layer-norm)"
    return None


def _rewrite(rw: Rewriter, graph: Graph, node: Node, cast: bool) -> None:
    ins = graph.inputs_of(node)
    x, scale, bias = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    assert x is not None and scale is not None and x.type.rank is not None
    base, rank = base_name(node), x.type.rank
    stash = _stash_dtype(node, x)
    sdt = stash.numpy

    def up(v: Value, tag: str) -> Value:
        if not cast:
            return v
        if v.const is not None:
            return rw.const(v.const.astype(sdt), f"{base}_{tag}_f32")
        return rw.op("Cast", [v], {"to": int(stash)}, name=f"{base}_{tag}_f32")

    axes = ints(rw, range(normalize_axis(node.attrs.axis, rank), rank), f"{base}_axes")
    xs = up(x, "x")
    mean = rw.op("ReduceMean", [xs, axes], name=f"{base}_mean")
    d = rw.op("Sub", [xs, mean], name=f"{base}_centered")
    var = rw.op("ReduceMean", [rw.op("Mul", [d, d], name=f"{base}_sq"), axes], name=f"{base}_var")
    eps = rw.const(np.array(node.attrs.epsilon, sdt), f"{base}_eps")
    std = rw.op("Sqrt", [rw.op("Add", [var, eps], name=f"{base}_var_eps")], name=f"{base}_std")
    y = rw.op(
        "Mul", [rw.op("Div", [d, std], name=f"{base}_normed"), up(scale, "scale")], name=f"{base}_scaled"
    )
    if bias is not None:
        y = rw.op("Add", [y, up(bias, "bias")], name=f"{base}_biased")
    if cast:
        y = rw.op("Cast", [y], {"to": int(x.type.dtype)}, name=base)
    new: list[Value | None] = [y]
    if node.num_outputs > 1:
        new.append(mean if used(graph, node, 1) else None)
    if node.num_outputs > 2:
        one = rw.const(np.array(1.0, sdt), f"{base}_one")
        new.append(rw.op("Div", [one, std], name=f"{base}_inv_std") if used(graph, node, 2) else None)
    replace_outputs(rw, node, new)


LAYER_NORM = register_decomposition(
    Decomposition(
        "layer-norm",
        "LayerNormalization",
        ("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div"),
        lambda g, n: _check(g, n, cast=False),
        lambda rw, g, n: _rewrite(rw, g, n, cast=False),
        "d = x - mean(x); y = d / sqrt(mean(d*d) + eps) * scale + B over [axis, rank)",
    )
)
LAYER_NORM_STASH = register_decomposition(
    Decomposition(
        "layer-norm-stash",
        "LayerNormalization",
        ("Cast", "ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div"),
        lambda g, n: _check(g, n, cast=True),
        lambda rw, g, n: _rewrite(rw, g, n, cast=True),
        "layer-norm in float32 between Casts (stash_type=1 with a 16-bit x)",
    )
)


def _log_softmax_check(graph: Graph, node: Node) -> str | None:
    x = graph.inputs_of(node)[0]
    assert x is not None
    if not x.type.dtype.is_float:
        return "x is not float"
    if x.type.rank is None:
        return "rank of x is unknown"
    return static_reason(graph, node)


def _log_softmax_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x = graph.inputs_of(node)[0]
    assert x is not None and x.type.rank is not None
    base = base_name(node)
    axes = ints(rw, [normalize_axis(node.attrs.axis, x.type.rank)], f"{base}_axes")
    d = rw.op("Sub", [x, rw.op("ReduceMax", [x, axes], name=f"{base}_max")], name=f"{base}_shifted")
    total = rw.op("ReduceSum", [rw.op("Exp", [d], name=f"{base}_exp"), axes], name=f"{base}_sum")
    replace_outputs(rw, node, [rw.op("Sub", [d, rw.op("Log", [total], name=f"{base}_log")], name=base)])


LOG_SOFTMAX = register_decomposition(
    Decomposition(
        "log-softmax",
        "LogSoftmax",
        ("ReduceMax", "Sub", "Exp", "ReduceSum", "Log"),
        _log_softmax_check,
        _log_softmax_rewrite,
        "d = x - max(x); y = d - log(sum(exp(d))) along axis",
    )
)
