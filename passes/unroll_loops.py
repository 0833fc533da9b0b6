"""unroll-loops: a Loop or Scan with a static trip count becomes that many copies of its body.

Loop with trip count T (constant M, a condition that stays true), captures c:
  v_0 = v_initial; (k, v_{t+1}, s_t) = body(t, true, v_t, c) for t = 0..T-1;
  Loop(M, cond, v_initial, c) = (v_T, Concat_0(Unsqueeze_0(s_0), ..., Unsqueeze_0(s_{T-1}))).
Scan with a static sequence length L: x_j[t] = Gather(x_j, t or L-1-t (reverse input), axis a_j);
  (s_{t+1}, y_t) = body(s_t, x_1[t], .., x_m[t], c) for t = 0..L-1;
  Scan(s_0, x, c) = (s_L, Concat_b(Unsqueeze_b(y_t)) over t, in reverse order for a reverse
  output, with b its scan_output_axes entry).
Refused, with the reason as a near-miss: a trip count not known before running, or more than
``max_nodes`` nodes after unrolling (T times the body's ops).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ir.subgraphs import inline_graph, refresh_types
from compiler.ops.control_flow import loop_trip_count, scan_layout
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Match, Op, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["UnrollLoops", "UnrollLoop", "trip_count"]


def trip_count(graph: Graph, node: Node) -> int | None:
    """Iterations of a Loop (or the sequence length of a Scan) known before running, else None."""
    ins = graph.inputs_of(node)
    if node.op == "Loop":
        m, cond = ins[0], ins[1]
        if (m is not None and m.const is None) or (cond is not None and cond.const is None):
            return None
        return loop_trip_count(
            None if m is None else m.const, None if cond is None else cond.const, node.attrs.body
        )
    lay = scan_layout(node.attrs, [None if v is None else v.type.rank for v in ins], node.num_outputs)
    x = ins[lay.states]
    if x is None or x.type.shape is None:
        return None
    d = x.type.shape[lay.in_axes[0]]
    return d if isinstance(d, int) else None


def _stack(rw: Rewriter, parts: list[Value], axis: int, name: str) -> Value:
    """Concat_axis(Unsqueeze_axis(p) for p in parts)."""
    axes = rw.const(np.asarray([axis], np.int64), f"{name}_axis")
    ups = [rw.op("Unsqueeze", [p, axes], name=f"{name}/unsqueeze{i}") for i, p in enumerate(parts)]
    return ups[0] if len(ups) == 1 else rw.op("Concat", ups, {"axis": axis}, name=f"{name}/concat")


class UnrollLoop(Rule):
    """Loop/Scan with a static trip count -> the body inlined once per iteration."""

    name = "unroll-loops"
    pattern = Op(("Loop", "Scan"))

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes = max_nodes

    def check(self, graph: Graph, m: Match) -> str | None:
        node = m.root
        trips = trip_count(graph, node)
        if trips is None:
            what = (
                "sequence length" if node.op == "Scan" else "trip count (M, cond and the body's cond output)"
            )
            return f"the {what} is not static"
        size = trips * len(node.attrs.body.ops())
        if size > self.max_nodes:
            return f"unrolling {trips} iterations gives {size} nodes > max_nodes {self.max_nodes}"
        n_state = self._states(graph, node)
        for out in node.attrs.body.outputs[n_state + (node.op == "Loop") :]:
            if trips == 0 and not out.type.is_static:
                return f"zero iterations and scan output {out.name!r} has no static shape"
        return None

    @staticmethod
    def _states(graph: Graph, node: Node) -> int:
        if node.op == "Loop":
            return node.num_inputs - 2 - node.attrs.captures
        ranks = [None if v is None else v.type.rank for v in graph.inputs_of(node)]
        return scan_layout(node.attrs, ranks, node.num_outputs).states

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        node, g = m.root, rw.graph
        body, trips = node.attrs.body, trip_count(g, node)
        assert trips is not None
        ins = [v for v in g.inputs_of(node)]
        caps = [v for v in ins[len(ins) - node.attrs.captures :] if v is not None]
        base = node.name or node.output_names[0]
        n = self._states(g, node)
        k = node.num_outputs - n
        ys: list[list[Value]] = [[] for _ in range(k)]
        if node.op == "Loop":
            states = [v for v in ins[2 : 2 + n] if v is not None]
            cond_t = body.inputs[1].type
            true = rw.const(np.ones(cond_t.static_shape if cond_t.is_static else (), bool), f"{base}_true")
            for t in range(trips):
                it = rw.const(np.asarray(t, np.int64), f"{base}_iter{t}")
                outs = inline_graph(
                    g, body, [it, true, *states, *caps], suffix=f"__it{t}", scope=f"{base}/iter{t}/"
                )
                states = outs[1 : 1 + n]
                for j in range(k):
                    ys[j].append(outs[1 + n + j])
            axes, dirs = [0] * k, [0] * k
        else:
            lay = scan_layout(node.attrs, [None if v is None else v.type.rank for v in ins], node.num_outputs)
            states = [v for v in ins[:n] if v is not None]
            xs = [v for v in ins[n : n + lay.scans] if v is not None]
            for t in range(trips):
                slices = []
                for j, (x, ax, d) in enumerate(zip(xs, lay.in_axes, lay.in_dirs, strict=True)):
                    idx = rw.const(np.asarray(trips - 1 - t if d else t, np.int64), f"{base}_t{t}")
                    slices.append(rw.op("Gather", [x, idx], {"axis": ax}, name=f"{base}/iter{t}/slice{j}"))
                outs = inline_graph(
                    g, body, [*states, *slices, *caps], suffix=f"__it{t}", scope=f"{base}/iter{t}/"
                )
                states = outs[:n]
                for j in range(k):
                    ys[j].append(outs[n + j])
            axes, dirs = list(lay.out_axes), list(lay.out_dirs)
        stacked = []
        for j, parts in enumerate(ys):
            out_t = body.outputs[(node.op == "Loop") + n + j].type
            rank = out_t.rank if out_t.rank is not None else (parts[0].type.rank if parts else 0) or 0
            ax = axes[j] + rank + 1 if axes[j] < 0 else axes[j]
            if not parts:  # zero iterations: an empty stack (check() asked for a static shape)
                shape = list(out_t.static_shape)
                shape.insert(ax, 0)
                stacked.append(rw.const(np.zeros(shape, out_t.dtype.numpy), f"{base}_empty{j}"))
                continue
            stacked.append(_stack(rw, parts[::-1] if dirs[j] else parts, ax, f"{base}/scan_out{j}"))
        new = [*states, *stacked]
        old_types = list(node.output_types)
        rw.replace_node(node, new)
        refresh_types(
            g, [v for v, t in zip(new, old_types, strict=True) if g.has_node(v.node) and v.type != t]
        )


@register_pass
@dataclass(frozen=True)
class UnrollLoops(Pass):
    """Unroll every Loop and Scan whose trip count is static, up to ``max_nodes`` nodes each."""

    name = "unroll-loops"
    max_nodes: int = 4096

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return apply_rules(graph, [UnrollLoop(self.max_nodes)], near_misses=ctx.near_misses)
