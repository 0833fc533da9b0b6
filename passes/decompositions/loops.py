"""Decompositions of Loop and Scan with a static trip count: the body inlined once per iteration.

unroll-loop: Loop(M, cond, v, c) with constant M and a condition that stays true (T iterations), or
Scan(s, x, c) with a static sequence length T, =

    v_T and Concat_a(Unsqueeze_a(y_0), ..., Unsqueeze_a(y_{T-1}))    (v_{t+1}, y_t) = body(t, v_t, x[t], c)

(the ``unroll-loops`` pass's rule, :mod:`passes.unroll_loops`, which states the math per op). The
body's own ops are legalized in the following rounds; a data-dependent trip count, or more than
``MAX_UNROLLED_NODES`` nodes after unrolling, stays refused with the reason.
"""

from __future__ import annotations

from compiler.ir.graph import Graph, Node
from compiler.pattern import Match
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.unroll_loops import UnrollLoop, UnrollLoops

__all__ = ["UNROLL_LOOP", "UNROLL_SCAN", "MAX_UNROLLED_NODES"]

MAX_UNROLLED_NODES = UnrollLoops.max_nodes
"""The cap on T times the body's op count (the ``unroll-loops`` pass's default)."""

_RULE = UnrollLoop(MAX_UNROLLED_NODES)


def _check(graph: Graph, node: Node) -> str | None:
    return _RULE.check(graph, Match(node))


def _rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    _RULE.rewrite(rw, Match(node))


UNROLL_LOOP, UNROLL_SCAN = (
    register_decomposition(
        Decomposition(
            f"unroll-{op.lower()}",
            op,
            ("Gather", "Unsqueeze", "Concat") if op == "Scan" else ("Unsqueeze", "Concat"),
            _check,
            _rewrite,
            f"{op} with a static trip count T = T copies of its body, scan outputs stacked",
        )
    )
    for op in ("Loop", "Scan")
)
