"""Decompositions of the composite reductions and of Mean into ReduceSum/ReduceMax and elementwise ops.

Over the node's axes A (the same ``axes`` input, keepdims and noop_with_empty_axes, so an
empty A with noop_with_empty_axes=1 keeps only the elementwise part, as ONNX says):

* reduce-l1: ReduceL1(x) = ReduceSum_A(|x|).
* reduce-l2: ReduceL2(x) = sqrt(ReduceSum_A(x * x)).
* reduce-sum-square: ReduceSumSquare(x) = ReduceSum_A(x * x).
* reduce-log-sum: ReduceLogSum(x) = log(ReduceSum_A(x)).
* reduce-log-sum-exp: m = ReduceMax_A(x) (keepdims), ReduceLogSumExp(x) =
  log(ReduceSum_A(exp(x - m))) + m (m squeezed over A without keepdims): exp(x - m) <= 1
  never overflows. Exact where m is finite; a slice whose max is +-inf gives NaN
  (inf - inf) where onnxruntime gives +-inf.
* mean-add: Mean(x_1, ..., x_n) = (((x_1 + x_2) + ...) + x_n) * (1/n) (broadcasting as Add
  does; onnxruntime's order: it sums left to right, then multiplies by 1/n rounded to x's dtype).
* hardmax-argmax: Hardmax(x; axis) = Cast(Equal(ArgMax(x; axis, keepdims=1), i), dtype(x)) with
  i = [0, 1, ..., n - 1] laid along ``axis`` (n = x's static dim there): 1 exactly at the first
  maximum, which is the one ArgMax returns.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.shapes import normalize_axis
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, RewriteFn, register_decomposition
from passes.decompositions._util import base_name, first_input, float_input_reason, ints, replace_outputs

__all__ = [
    "REDUCE_L1",
    "REDUCE_L2",
    "REDUCE_SUM_SQUARE",
    "REDUCE_LOG_SUM",
    "REDUCE_LOG_SUM_EXP",
    "MEAN_ADD",
    "HARDMAX_ARGMAX",
]


def _axes(graph: Graph, node: Node) -> Value | None:
    ins = graph.inputs_of(node)
    return ins[1] if len(ins) > 1 else None


def _any_dtype(graph: Graph, node: Node) -> str | None:
    return None


def _reduce(rw: Rewriter, op: str, v: Value, node: Node, axes: Value | None, name: str) -> Value:
    """``op`` over the node's axes with its keepdims/noop attrs."""
    return rw.op(op, [v] if axes is None else [v, axes], node.attrs, name=name)


def _unary_then_sum(pre: str | None, post: str | None) -> RewriteFn:
    def rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
        x, axes, b = first_input(graph, node), _axes(graph, node), base_name(node)
        if pre == "Abs":
            v = rw.op("Abs", [x], name=f"{b}_abs")
        elif pre == "Square":
            v = rw.op("Mul", [x, x], name=f"{b}_sq")
        else:
            v = x
        y = _reduce(rw, "ReduceSum", v, node, axes, f"{b}_sum" if post else b)
        if post is not None:
            y = rw.op(post, [y], name=b)
        replace_outputs(rw, node, [y])

    return rewrite


def _rule(
    name: str, op: str, produces: tuple[str, ...], pre: str | None, post: str | None, doc: str
) -> Decomposition:
    check = _any_dtype if op == "ReduceL1" else float_input_reason
    return register_decomposition(Decomposition(name, op, produces, check, _unary_then_sum(pre, post), doc))


REDUCE_L1 = _rule("reduce-l1", "ReduceL1", ("Abs", "ReduceSum"), "Abs", None, "ReduceL1(x) = ReduceSum(|x|)")
REDUCE_L2 = _rule(
    "reduce-l2",
    "ReduceL2",
    ("Mul", "ReduceSum", "Sqrt"),
    "Square",
    "Sqrt",
    "ReduceL2(x) = sqrt(ReduceSum(x*x))",
)
REDUCE_SUM_SQUARE = _rule(
    "reduce-sum-square",
    "ReduceSumSquare",
    ("Mul", "ReduceSum"),
    "Square",
    None,
    "ReduceSumSquare(x) = ReduceSum(x*x)",
)
REDUCE_LOG_SUM = _rule(
    "reduce-log-sum", "ReduceLogSum", ("ReduceSum", "Log"), None, "Log", "ReduceLogSum(x) = log(ReduceSum(x))"
)


def _lse_check(graph: Graph, node: Node) -> str | None:
    why = float_input_reason(graph, node)
    if why:
        return why
    axes = _axes(graph, node)
    if axes is not None and axes.const is None:
        return "axes are not constant (the max must be squeezed over them)"
    if not node.attrs.keepdims and first_input(graph, node).type.rank is None:
        return "rank of x is unknown"
    return None


def _lse_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, axes, b = first_input(graph, node), _axes(graph, node), base_name(node)
    keep = type(node.attrs)(keepdims=1, noop_with_empty_axes=node.attrs.noop_with_empty_axes)
    m = rw.op("ReduceMax", [x] if axes is None else [x, axes], keep, name=f"{b}_max")
    e = rw.op("Exp", [rw.op("Sub", [x, m], name=f"{b}_shifted")], name=f"{b}_exp")
    s = _reduce(rw, "ReduceSum", e, node, axes, f"{b}_sum")
    every = axes is None or (axes.const is not None and axes.const.size == 0)
    if not node.attrs.keepdims and not (every and node.attrs.noop_with_empty_axes):
        rank = x.type.rank
        assert rank is not None
        sq_axes = ints(rw, range(rank), f"{b}_axes") if every or axes is None else axes
        m = rw.op("Squeeze", [m, sq_axes], name=f"{b}_max_squeezed")
    replace_outputs(rw, node, [rw.op("Add", [rw.op("Log", [s], name=f"{b}_log"), m], name=b)])


REDUCE_LOG_SUM_EXP = register_decomposition(
    Decomposition(
        "reduce-log-sum-exp",
        "ReduceLogSumExp",
        ("ReduceMax", "Sub", "Exp", "ReduceSum", "Log", "Add", "Squeeze"),
        _lse_check,
        _lse_rewrite,
        "m = max(x); y = log(sum(exp(x - m))) + m (finite m)",
    )
)


def _mean_check(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    if not ins or any(v is None for v in ins):
        return "Mean has an absent input"
    return None if first_input(graph, node).type.dtype.is_float else "inputs are not float"


def _mean_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    ins = [v for v in graph.inputs_of(node) if v is not None]
    b = base_name(node)
    acc = ins[0]
    for i, v in enumerate(ins[1:]):
        acc = rw.op("Add", [acc, v], name=f"{b}_sum{i}")
    inv_n = rw.const(np.array(1.0 / len(ins), ins[0].type.dtype.numpy), f"{b}_inv_n")
    replace_outputs(rw, node, [rw.op("Mul", [acc, inv_n], name=b)])


MEAN_ADD = register_decomposition(
    Decomposition(
        "mean-add",
        "Mean",
        ("Add", "Mul"),
        _mean_check,
        _mean_rewrite,
        "Mean(x_1..x_n) = (x_1 + ... + x_n) * (1/n)",
    )
)


def _hardmax_check(graph: Graph, node: Node) -> str | None:
    shape = first_input(graph, node).type.shape
    if shape is None:
        return "rank of x is unknown"
    n = shape[normalize_axis(node.attrs.axis, len(shape))]
    return None if isinstance(n, int) else "the size along axis is not static"


def _hardmax_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    shape = x.type.shape
    assert shape is not None
    axis = normalize_axis(node.attrs.axis, len(shape))
    n = int(shape[axis])
    iota = rw.const(np.arange(n, dtype=np.int64).reshape((n,) + (1,) * (len(shape) - axis - 1)), f"{b}_iota")
    arg = rw.op("ArgMax", [x], {"axis": axis, "keepdims": 1}, name=f"{b}_argmax")
    hot = rw.op("Equal", [arg, iota], name=f"{b}_hot")
    replace_outputs(rw, node, [rw.op("Cast", [hot], {"to": int(x.type.dtype)}, name=b)])


HARDMAX_ARGMAX = register_decomposition(
    Decomposition(
        "hardmax-argmax",
        "Hardmax",
        ("ArgMax", "Equal", "Cast"),
        _hardmax_check,
        _hardmax_rewrite,
        "Hardmax(x) = Cast(ArgMax(x) == iota along axis)",
    )
)
