"""Decompositions of the thresholding activations into comparisons and Where.

* thresholded-relu-where: ThresholdedRelu(x; alpha) = Where(x > alpha, x, 0).
* shrink-where: Shrink(x; bias, lambd) = Where(-lambd > x, x + bias, Where(x > lambd, x - bias, 0))
  (x < -lambd written as -lambd > x, so one comparison op serves both).

Both are ONNX's definitions written with ops, so exact for every x, NaN included (a NaN compares
false, so both give 0).
"""

from __future__ import annotations

from compiler.ir.graph import Graph, Node
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import (
    base_name,
    first_input,
    float_input_reason,
    replace_outputs,
    scalar_const,
)

__all__ = ["THRESHOLDED_RELU_WHERE", "SHRINK_WHERE"]


def _thresholded_relu_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    above = rw.op("Greater", [x, scalar_const(rw, x, node.attrs.alpha, f"{b}_alpha")], name=f"{b}_above")
    replace_outputs(rw, node, [rw.op("Where", [above, x, scalar_const(rw, x, 0.0, f"{b}_zero")], name=b)])


THRESHOLDED_RELU_WHERE = register_decomposition(
    Decomposition(
        "thresholded-relu-where",
        "ThresholdedRelu",
        ("Greater", "Where"),
        float_input_reason,
        _thresholded_relu_rewrite,
        "ThresholdedRelu(x) = Where(x > alpha, x, 0)",
        native=("Where",),
    )
)


def _shrink_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    lam, bias = node.attrs.lambd, node.attrs.bias
    above = rw.op("Greater", [x, scalar_const(rw, x, lam, f"{b}_lambd")], name=f"{b}_above")
    below = rw.op("Greater", [scalar_const(rw, x, -lam, f"{b}_neg_lambd"), x], name=f"{b}_below")
    down = rw.op("Sub", [x, scalar_const(rw, x, bias, f"{b}_bias")], name=f"{b}_down")
    up = rw.op("Add", [x, scalar_const(rw, x, bias, f"{b}_bias_up")], name=f"{b}_up")
    inner = rw.op("Where", [above, down, scalar_const(rw, x, 0.0, f"{b}_zero")], name=f"{b}_pos")
    replace_outputs(rw, node, [rw.op("Where", [below, up, inner], name=b)])


SHRINK_WHERE = register_decomposition(
    Decomposition(
        "shrink-where",
        "Shrink",
        ("Greater", "Sub", "Add", "Where"),
        float_input_reason,
        _shrink_rewrite,
        "Shrink(x) = Where(-lambd > x, x + bias, Where(x > lambd, x - bias, 0))",
        native=("Where",),
    )
)
