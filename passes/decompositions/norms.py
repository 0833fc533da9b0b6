"""Decompositions of BatchNormalization, InstanceNormalization, RMSNormalization and LpNormalization.

* batch-norm: with per-channel [C, 1, ..., 1] parameters, a = scale * (1 / sqrt(var + eps)),
  c = B - mean * a, y = x * a + c (onnxruntime's order; a and c are computed here when the
  parameters are constant, each float32 operation correctly rounded as there). Inference only
  (training_mode=0) and float32/float64 x.
* instance-norm: over the spatial axes A = [2, rank), with s, B reshaped to [C, 1, ..., 1],
  mean = ReduceMean_A(x), d = x - mean, y = d / sqrt(ReduceMean_A(d * d) + eps) * s + B
  (layer-norm's order; onnxruntime folds it into x * s/sigma + (B - mean * s/sigma), which
  rounds differently by a few ulp).
* rms-norm: over A = [axis, rank), r = 1 / sqrt(ReduceMean_A(x * x) + eps), y = (x * r) * scale
  (ONNX's function body; with stash_type=1 and a 16-bit x, x * r is computed in float32 between
  Casts and cast back before the scale).
* lp-norm: along ``axis``, n = ReduceSum(|x|) (p = 1) or sqrt(ReduceSum(x * x)) (p = 2), kept as a
  dim, and y = x / max(n, t), t the dtype's smallest normal number (FLT_MIN = 1.2e-38 for
  float32). Where n = 0 the slice is all zeros (for p = 2, or its squares all underflow) and
  0 / t = 0, as ONNX's "a zero norm gives 0"; where 0 < n < t (a subnormal norm) it divides by
  t instead of n.
* lrn-pool: with q = x * x viewed as [N, 1, C, S] (S the product of the spatial dims), padded
  along C by lo = (size - 1) // 2 zeros before and size - 1 - lo after,
  m = AveragePool(q; kernel (size, 1)) = sum of the window / size, and
  y = x * (bias + alpha * m) ^ -beta (onnxruntime's x * scale^-beta): LRN's definition, with
  alpha/size * sum regrouped as alpha * (sum / size).
"""

from __future__ import annotations

from math import prod

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.shapes import normalize_axis
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, first_input, ints, replace_outputs, static_reason

__all__ = ["BATCH_NORM", "INSTANCE_NORM", "RMS_NORM", "LP_NORM", "LRN_POOL"]


def _check(graph: Graph, node: Node) -> str | None:
    x = first_input(graph, node)
    if not x.type.dtype.is_float:
        return "x is not float"
    if x.type.rank is None:
        return "rank of x is unknown"
    return static_reason(graph, node)


def _per_channel(rw: Rewriter, v: Value, rank: int, name: str) -> Value:
    """[C] -> [C, 1, ..., 1] (rank - 1 dims), so it broadcasts against [N, C, ...]."""
    if v.const is not None:
        return rw.const(v.const.reshape((-1,) + (1,) * (rank - 2)), name)
    return rw.op("Unsqueeze", [v, ints(rw, range(1, rank - 1), f"{name}_axes")], name=name)


def _batch_norm_check(graph: Graph, node: Node) -> str | None:
    x = first_input(graph, node)
    if x.type.dtype not in (DType.FLOAT32, DType.FLOAT64):
        return f"x is {x.type.dtype.short}, not float32/float64"
    if node.attrs.training_mode:
        return "training_mode=1 (batch statistics)"
    if node.num_outputs > 1 and any(graph.users(v) or graph.is_output(v) for v in graph.outputs_of(node)[1:]):
        return "running mean/var outputs are used"
    return None if x.type.rank is not None and x.type.rank >= 2 else "rank of x is unknown or below 2"


def _batch_norm_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, scale, bias, mean, var = graph.inputs_of(node)[:5]
    assert x is not None and scale is not None and bias is not None and mean is not None and var is not None
    assert x.type.rank is not None
    b, rank, dt = base_name(node), x.type.rank, x.type.dtype.numpy
    eps = np.array(node.attrs.epsilon, dt)
    if all(v.const is not None for v in (scale, bias, mean, var)):
        inv = np.asarray(1.0, dt) / np.sqrt(np.asarray(var.const, dt) + eps)
        a_np = (inv * np.asarray(scale.const, dt)).astype(dt)
        c_np = (np.asarray(bias.const, dt) - np.asarray(mean.const, dt) * a_np).astype(dt)
        a, c = rw.const(a_np, f"{b}_a"), rw.const(c_np, f"{b}_c")
    else:
        std = rw.op(
            "Sqrt", [rw.op("Add", [var, rw.const(eps, f"{b}_eps")], name=f"{b}_var_eps")], name=f"{b}_std"
        )
        inv = rw.op("Div", [rw.const(np.array(1.0, dt), f"{b}_one"), std], name=f"{b}_inv_std")
        a = rw.op("Mul", [inv, scale], name=f"{b}_a")
        c = rw.op("Sub", [bias, rw.op("Mul", [mean, a], name=f"{b}_mean_a")], name=f"{b}_c")
    ax = _per_channel(rw, a, rank, f"{b}_a_c") if rank > 2 else a
    cx = _per_channel(rw, c, rank, f"{b}_c_c") if rank > 2 else c
    y = rw.op("Add", [rw.op("Mul", [x, ax], name=f"{b}_scaled"), cx], name=b)
    replace_outputs(rw, node, [y] + [None] * (node.num_outputs - 1))


BATCH_NORM = register_decomposition(
    Decomposition(
        "batch-norm",
        "BatchNormalization",
        ("Add", "Sqrt", "Div", "Mul", "Sub", "Unsqueeze"),
        _batch_norm_check,
        _batch_norm_rewrite,
        "a = scale / sqrt(var + eps); y = x * a[c] + (B - mean * a)[c]",
    )
)


def _instance_norm_check(graph: Graph, node: Node) -> str | None:
    why = _check(graph, node)
    if why:
        return why
    rank = first_input(graph, node).type.rank
    return None if rank is not None and rank >= 3 else "x has no spatial axes"


def _instance_norm_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, scale, bias = graph.inputs_of(node)
    assert x is not None and scale is not None and bias is not None and x.type.rank is not None
    b, rank = base_name(node), x.type.rank
    axes = ints(rw, range(2, rank), f"{b}_axes")
    d = rw.op("Sub", [x, rw.op("ReduceMean", [x, axes], name=f"{b}_mean")], name=f"{b}_centered")
    var = rw.op("ReduceMean", [rw.op("Mul", [d, d], name=f"{b}_sq"), axes], name=f"{b}_var")
    eps = rw.const(np.array(node.attrs.epsilon, x.type.dtype.numpy), f"{b}_eps")
    std = rw.op("Sqrt", [rw.op("Add", [var, eps], name=f"{b}_var_eps")], name=f"{b}_std")
    y = rw.op(
        "Mul",
        [rw.op("Div", [d, std], name=f"{b}_normed"), _per_channel(rw, scale, rank, f"{b}_s")],
        name=f"{b}_scaled",
    )
    replace_outputs(rw, node, [rw.op("Add", [y, _per_channel(rw, bias, rank, f"{b}_b")], name=b)])


INSTANCE_NORM = register_decomposition(
    Decomposition(
        "instance-norm",
        "InstanceNormalization",
        ("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div", "Unsqueeze"),
        _instance_norm_check,
        _instance_norm_rewrite,
        "d = x - mean(x); y = d / sqrt(mean(d*d) + eps) * s[c] + B[c] over the spatial axes",
    )
)


def _rms_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, scale = graph.inputs_of(node)[:2]
    assert x is not None and scale is not None and x.type.rank is not None
    b, rank = base_name(node), x.type.rank
    stash = DType.FLOAT32 if node.attrs.stash_type == 1 else x.type.dtype
    cast = stash != x.type.dtype
    xs = rw.op("Cast", [x], {"to": int(stash)}, name=f"{b}_x_f32") if cast else x
    axes = ints(rw, range(normalize_axis(node.attrs.axis, rank), rank), f"{b}_axes")
    ms = rw.op("ReduceMean", [rw.op("Mul", [xs, xs], name=f"{b}_sq"), axes], name=f"{b}_ms")
    eps = rw.const(np.array(node.attrs.epsilon, stash.numpy), f"{b}_eps")
    rms = rw.op("Sqrt", [rw.op("Add", [ms, eps], name=f"{b}_ms_eps")], name=f"{b}_rms")
    normed = rw.op("Mul", [xs, rw.op("Reciprocal", [rms], name=f"{b}_inv_rms")], name=f"{b}_normed")
    if cast:
        normed = rw.op("Cast", [normed], {"to": int(x.type.dtype)}, name=f"{b}_normed_back")
    replace_outputs(rw, node, [rw.op("Mul", [normed, scale], name=b)])


RMS_NORM = register_decomposition(
    Decomposition(
        "rms-norm",
        "RMSNormalization",
        ("Cast", "Mul", "ReduceMean", "Add", "Sqrt", "Reciprocal"),
        _check,
        _rms_rewrite,
        "y = (x * 1/sqrt(mean(x*x) + eps)) * scale over [axis, rank)",
    )
)


def _lp_check(graph: Graph, node: Node) -> str | None:
    why = _check(graph, node)
    if why:
        return why
    if node.attrs.p not in (1, 2):
        return f"p={node.attrs.p} is not 1 or 2"
    return None


def _lp_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    assert x is not None and x.type.rank is not None
    axes = ints(rw, [normalize_axis(node.attrs.axis, x.type.rank)], f"{b}_axes")
    if node.attrs.p == 1:
        norm = rw.op("ReduceSum", [rw.op("Abs", [x], name=f"{b}_abs"), axes], name=f"{b}_norm")
    else:
        ss = rw.op("ReduceSum", [rw.op("Mul", [x, x], name=f"{b}_sq"), axes], name=f"{b}_ss")
        norm = rw.op("Sqrt", [ss], name=f"{b}_norm")
    dt = x.type.dtype.numpy
    tiny = rw.const(np.array(np.finfo(dt).tiny, dt), f"{b}_tiny")
    safe = rw.op("Max", [norm, tiny], name=f"{b}_safe_norm")
    replace_outputs(rw, node, [rw.op("Div", [x, safe], name=b)])


LP_NORM = register_decomposition(
    Decomposition(
        "lp-norm",
        "LpNormalization",
        ("Abs", "Mul", "ReduceSum", "Sqrt", "Max", "Div"),
        _lp_check,
        _lp_rewrite,
        "y = x / max(||x||_p, smallest normal) along axis (p = 1 or 2)",
    )
)


def _lrn_check(graph: Graph, node: Node) -> str | None:
    why = _check(graph, node)
    if why:
        return why
    rank = first_input(graph, node).type.rank
    return None if rank is not None and rank >= 3 else "x has no spatial axes"


def _lrn_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b, a = first_input(graph, node), base_name(node), node.attrs
    n, ch, *spatial = x.type.static_shape
    dt = x.type.dtype.numpy
    lo = (a.size - 1) // 2
    sq = rw.op("Mul", [x, x], name=f"{b}_sq")
    flat = rw.op("Reshape", [sq, ints(rw, [n, 1, ch, prod(spatial)], f"{b}_flat_shape")], name=f"{b}_flat")
    pads = ints(rw, [0, 0, lo, 0, 0, 0, a.size - 1 - lo, 0], f"{b}_pads")
    padded = rw.op("Pad", [flat, pads], name=f"{b}_padded")
    mean = rw.op("AveragePool", [padded], {"kernel_shape": (a.size, 1)}, name=f"{b}_window")
    m = rw.op("Reshape", [mean, ints(rw, [n, ch, *spatial], f"{b}_shape")], name=f"{b}_window_mean")
    scaled = rw.op("Mul", [m, rw.const(np.array(a.alpha, dt), f"{b}_alpha")], name=f"{b}_alpha_m")
    base = rw.op("Add", [scaled, rw.const(np.array(a.bias, dt), f"{b}_bias")], name=f"{b}_scale")
    inv = rw.op("Pow", [base, rw.const(np.array(-a.beta, dt), f"{b}_neg_beta")], name=f"{b}_inv")
    replace_outputs(rw, node, [rw.op("Mul", [x, inv], name=b)])


LRN_POOL = register_decomposition(
    Decomposition(
        "lrn-pool",
        "LRN",
        ("Mul", "Reshape", "Pad", "AveragePool", "Add", "Pow"),
        _lrn_check,
        _lrn_rewrite,
        "y = x * (bias + alpha * mean_{window}(x^2))^-beta, the window sum over channels by AveragePool",
    )
)
