"""fuse-rms-norm: a decomposed RMSNorm over the trailing axes becomes one RMSNormalization node.

    x · (1 / sqrt(mean(x², axes) + eps)) [· w]  =  x / sqrt(mean(x², axes) + eps) [· w]
    = RMSNormalization(x, w){axis = axes[0], epsilon = eps}

with x² as Pow(x, 2) or Mul(x, x), ``1 / r`` as Div(1, r) or Reciprocal(r), ``axes`` the trailing
axes (keepdims), eps a scalar constant and w a float constant of the normalized shape (1 when
absent). Every intermediate value must have the chain as its only reader. It runs in a backend's
legalization when the backend has RMSNormalization (TVM: one row kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.rewriter import PassResult, Rewriter

__all__ = ["FuseRmsNorm"]


def _scalar(v: Value | None) -> float | None:
    c = None if v is None else v.const
    if c is None or c.size != 1 or not np.issubdtype(c.dtype, np.floating):
        return None
    return float(c.reshape(-1)[0])


def _only_reader(graph: Graph, v: Value) -> Node | None:
    """The single node reading ``v`` (None when several do or ``v`` is a graph output)."""
    users = graph.users(v)
    return users[0][0] if len(users) == 1 and not graph.is_output(v) else None


def _other(graph: Graph, node: Node, v: Value) -> Value | None:
    """The input of the binary ``node`` that is not ``v``."""
    a, b = graph.inputs_of(node)
    return b if a == v else a if b == v else None


def _squared(graph: Graph, v: Value) -> Value | None:
    """x when ``v`` is Pow(x, 2) or Mul(x, x)."""
    n = v.producer
    ins = graph.inputs_of(n)
    if n.op == "Pow" and _scalar(ins[1]) == 2.0:
        return ins[0]
    if n.op == "Mul" and ins[0] is not None and ins[0] == ins[1]:
        return ins[0]
    return None


def _trailing_axes(graph: Graph, mean: Node, rank: int) -> int | None:
    ins = graph.inputs_of(mean)
    axes = ins[1].const if len(ins) > 1 and ins[1] is not None else None
    if axes is None or not mean.attrs.keepdims or axes.size == 0:
        return None
    norm = sorted(int(a) % rank for a in axes.reshape(-1))
    return norm[0] if norm == list(range(norm[0], rank)) else None


def _match(graph: Graph, mean: Node) -> tuple[Value, float, int, list[Node], Node] | None:
    """(x, eps, axis, chain nodes, last node before the weight) of the chain at ``mean``."""
    sq_in = graph.inputs_of(mean)[0]
    if sq_in is None or _only_reader(graph, sq_in) is not mean:
        return None
    x = _squared(graph, sq_in)
    if x is None or x.type.dtype != DType.FLOAT32 or x.type.rank is None:
        return None
    axis = _trailing_axes(graph, mean, x.type.rank)
    add = _only_reader(graph, graph.value(mean))
    if axis is None or add is None or add.op != "Add":
        return None
    eps = _scalar(_other(graph, add, graph.value(mean)))
    sqrt = _only_reader(graph, graph.value(add))
    if eps is None or sqrt is None or sqrt.op != "Sqrt":
        return None
    nodes = [sq_in.producer, mean, add, sqrt]
    nxt = _only_reader(graph, graph.value(sqrt))
    if nxt is None:
        return None
    if nxt.op == "Div" and graph.inputs_of(nxt)[0] == x:  # x / sqrt(..)
        return x, eps, axis, nodes, nxt
    inv = nxt
    is_inv = inv.op == "Reciprocal" or (inv.op == "Div" and _scalar(graph.inputs_of(inv)[0]) == 1.0)
    scale = _only_reader(graph, graph.value(inv)) if is_inv else None
    if scale is None or scale.op != "Mul" or _other(graph, scale, graph.value(inv)) != x:
        return None
    return x, eps, axis, [*nodes, inv], scale


@register_pass
@dataclass(frozen=True)
class FuseRmsNorm(Pass):
    """Rewrite each decomposed RMSNorm into RMSNormalization (see the module docstring)."""

    name = "fuse-rms-norm"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        with Rewriter(graph) as rw:
            for node in graph.ops():
                if not graph.has_node(node.id) or node.op != "ReduceMean" or node.domain != "":
                    continue
                found = _match(graph, node)
                if found is None:
                    continue
                x, eps, axis, _, last = found
                shape = x.type.static_shape
                inner = shape[axis:]
                out = graph.value(last)
                weight = np.ones(inner, np.float32)
                tail = _only_reader(graph, out)
                if tail is not None and tail.op == "Mul":
                    w = _other(graph, tail, out)
                    wc = None if w is None else w.const
                    fits = (
                        wc is not None
                        and wc.dtype == np.float32
                        and wc.size == int(np.prod(inner))
                        and np.broadcast_shapes(wc.shape, inner) == tuple(inner)
                        and tuple(graph.value(tail).type.static_shape) == tuple(shape)
                    )
                    if fits:
                        assert wc is not None
                        weight, out = wc.reshape(inner), graph.value(tail)
                nm = node.name or node.output_names[0]
                y = rw.op(
                    "RMSNormalization",
                    [x, rw.const(np.ascontiguousarray(weight), f"{nm}_scale")],
                    {"axis": axis, "epsilon": eps},
                    name=f"{nm}_rms_norm",
                )
                rw.replace(out, y, take_name=True)
                rw.applied("fuse-rms-norm")
        return rw.result
