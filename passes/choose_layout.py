"""choose-layout: run convs in the channel-blocked layout NCHW[b]c with few layout transforms.

Layouts (``compiler.ops.blocked_layout``): NCHW{b}c stores [N, C, H, W] as
[N, ceil(C/b), H, W, b], channel c at [c // b, ..., c % b].

Which convs: Conv and kiln::FusedConv with a rank-4 input and group = 1 (dense),
group = C_in = C_out (depthwise) or, fp32 only, a grouped conv whose groups fill whole channel
blocks (``blocked_layout.grouped_chunks``: ResNeXt/RegNet group widths 4, 8, 16...). A Conv
becomes a FusedConv with activation none.
A tensor of C channels gets block b(C) = C if C < lanes (no padding, e.g. NCHW3c for an
image) else the global block B; a depthwise conv keeps its input's block.

Cost model (analytic, in vector-instruction units), for each candidate B in ``blocks``
(default {lanes, lanes/2}):

    cost(B) = sum_convs MACs_pad / (lanes * eff(b_out)) + sum_transforms bytes * 0.25
    MACs_pad = N * H_out * W_out * kh * kw * ceil(C_in/b_in) b_in * ceil(C_out/b_out) b_out
               (depthwise: N * H_out * W_out * kh * kw * ceil(C/b) b; grouped: the input
               chunks an output chunk reads instead of ceil(C_in/b_in))
    eff(b)   = min(b, P) / P,  P = peak_lanes (default lanes: the width at which the FMA
               units reach peak; 8 on Zen 4, which runs 512-bit FMAs as two 256-bit halves)
    bytes    = (elements in + elements out) * itemsize of each LayoutTransform (a
               transposing copy, one element per cycle: 0.25 per byte)

and B = argmin cost(B) (ties go to the larger block).

Placement: layouts propagate forward from blocked convs through ops whose N-D ONNX
semantics equal the blocked semantics: elementwise ops (constant per-channel operands
are re-laid-out as [1, ceil(C/b), 1, 1, b], a 4-D non-constant operand gets a
LayoutTransform), MaxPool/AveragePool with kernel (kh, kw, 1), GlobalAveragePool ->
ReduceMean(axes=[2, 3]), ReduceMean over {2, 3}, Resize on H and W (unit scale on the
lane axis), and Concat and Split on channels when every part but the last is a multiple of
the block, or of a power-of-two block down to lanes/2 (one re-blocking transform; see
:mod:`passes.layout.channels`). The planners live in :mod:`passes.layout.planners`.
Div only by a non-zero constant: padded lanes may hold act(0) != 0, and no op in a
blocked region may turn them into inf/NaN. Every other op reads NCHW: one
LayoutTransform per (value, layout) is inserted and shared by all users; graph inputs
and outputs stay NCHW. Afterwards T(B->C) . T(A->B) = T(A->C), T(A->A) = id, and
identical transforms of one value are merged.

``mode=record`` (MNN NC4HW4: lanes=4; CANN NC1HWC0: lanes=16) only records the
decisions. Decisions (per conv: node, data_layout, out_layout, weight_layout, cost) are
stored as JSON in ``graph.metadata["layout_decisions"]``; read them with
:func:`layout_decisions`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import OptionError
from compiler.ir.graph import Graph, Node, Value
from compiler.ops import blocked_layout as bl
from compiler.ops.fused import KILN
from compiler.ops.layout_transform import LAYOUT_TRANSFORM, LayoutTransformAttrs
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import NearMiss
from compiler.rewriter import PassResult, Rewriter
from passes.layout.planners import CONVS, PLANNERS, plan_conv
from passes.layout.state import PASS_NAME, Blocked, LayoutState

__all__ = ["ChooseLayout", "layout_decisions", "DECISIONS_KEY", "simplify_transforms"]

DECISIONS_KEY = "layout_decisions"
TRANSFORM_COST_PER_BYTE = 0.25
_NAME = PASS_NAME


def layout_decisions(graph: Graph) -> list[dict[str, Any]]:
    """The per-conv decisions the last choose-layout run recorded (empty if none)."""
    text = graph.metadata.get(DECISIONS_KEY)
    return list(json.loads(text)) if text else []


# -------------------------------------------------------------------- rewriting
def _execute(st: LayoutState, node: Node, plan: Blocked) -> Value:
    g = st.graph
    inputs: list[Value | None] = []
    for i, spec in enumerate(plan.inputs):
        if spec is None:
            inputs.append(None)
        elif isinstance(spec, np.ndarray):
            inputs.append(g.add_constant(spec, f"{node.name or node.output_names[0]}_in{i}_blocked"))
        else:
            v, b = spec
            inputs.append(v if b < 0 else st.fetch(v, b))
    while inputs and inputs[-1] is None:
        inputs.pop()
    n_out = len(plan.outputs) or 1
    new = st.rw.op(
        plan.op, inputs, plan.attrs, domain=plan.domain, like=node, num_outputs=n_out if n_out > 1 else None
    )
    for port, chans in enumerate(plan.outputs or (plan.channels,)):
        st.reps[(node.id, port)] = {plan.block: g.value(new.node, port)}
        st.channels[(node.id, port)] = chans
    return new


def _place(st: LayoutState) -> None:
    """Block convs, propagate forward, insert shared transforms, drop the replaced nodes."""
    g = st.graph
    replaced: list[tuple[Node, Value]] = []
    for node in g.ops():
        ins = g.inputs_of(node)
        planner = PLANNERS.get((node.domain, node.op))
        is_conv = (node.domain, node.op) in CONVS
        plan: Blocked | str = "op has no blocked form"
        if planner is not None and (is_conv or any(v is not None and st.layout_of(v) for v in ins)):
            plan = planner(st, node, ins)
        if isinstance(plan, Blocked):
            if plan.decision is not None:
                st.decisions.append(plan.decision)
            replaced.append((node, _execute(st, node, plan)))
            continue
        if is_conv or any(v is not None and st.layout_of(v) for v in ins):
            st.miss(node, plan)
        for port, v in enumerate(ins):
            if v is not None and st.layout_of(v):
                g.set_input(node, port, st.fetch(v, 0))
    names = [
        (name, g.value(new.node, port), st.layout_of(g.value(node, port)))
        for node, new in replaced
        for port, name in enumerate(node.output_names)
    ]
    for out in g.outputs:
        if st.layout_of(out):
            g.replace_all_uses(out, st.fetch(out, 0))
    for node, _ in reversed(replaced):
        st.rw.erase_dead(node)
    for name, new, block in names:
        if g.has_node(new.node) and not g.is_output(new):
            free = name if not g.has_name(name) else g.unique_name(f"{name}_{bl.blocked(block)}")
            g.rename(new, free)


def simplify_transforms(graph: Graph, rw: Rewriter) -> None:
    """T(B->C)(T(A->B)(x)) = T(A->C)(x); T(A->A)(x) = x; identical transforms of x merge."""
    changed = True
    while changed:
        changed = False
        seen: dict[tuple[int, int, LayoutTransformAttrs], Value] = {}
        for node in graph.ops():
            if not graph.has_node(node.id) or node.domain != KILN or node.op != LAYOUT_TRANSFORM:
                continue
            a: LayoutTransformAttrs = node.attrs
            x = graph.inputs_of(node)[0]
            assert x is not None
            out = graph.value(node)
            prev = x.producer
            if prev.domain == KILN and prev.op == LAYOUT_TRANSFORM:
                src = graph.inputs_of(prev)[0]
                assert src is not None
                fused = dataclasses.replace(a, src=prev.attrs.src)
                new = (
                    src
                    if fused.src == fused.dst
                    else rw.op(LAYOUT_TRANSFORM, [src], fused, domain=KILN, like=node)
                )
                rw.replace(out, new, take_name=new != src)
                changed = True
                break
            if a.src == a.dst:
                rw.replace(out, x)
                changed = True
                break
            key = (x.node, x.port, a)
            if key in seen:
                rw.replace(out, seen[key])
                changed = True
                break
            seen[key] = out


def _already_laid_out(graph: Graph) -> bool:
    return any(
        n.domain == KILN
        and (n.op == LAYOUT_TRANSFORM or (n.op in ("FusedConv", "QConv") and n.attrs.is_blocked))
        for n in graph.ops()
    )


def _total_cost(st: LayoutState) -> float:
    convs = sum(float(d["cost"]) for d in st.decisions)
    moved = 0.0
    for n in st.graph.ops():
        if n.domain == KILN and n.op == LAYOUT_TRANSFORM:
            src = st.graph.inputs_of(n)[0]
            assert src is not None
            t_in, t_out = src.type, n.output_types[0]
            numel = [
                int(np.prod([d if isinstance(d, int) else 1 for d in t.shape or ()])) for t in (t_in, t_out)
            ]
            moved += sum(numel) * t_out.dtype.itemsize
    return convs + moved * TRANSFORM_COST_PER_BYTE


@register_pass
@dataclass(frozen=True)
class ChooseLayout(Pass):
    """Pick NCHW[b]c blocks for convs by an analytic cost model and place layout transforms."""

    name = _NAME
    lanes: int = 16
    blocks: tuple[int, ...] = ()  # candidate global blocks; () = (lanes, lanes / 2); "16:8" in pipelines
    mode: str = "blocked"  # "blocked" rewrites (TVM CPU); "record" only records (MNN, CANN)
    peak_lanes: int = 0  # FMA peak width in fp32 lanes; 0 = lanes

    def candidates(self) -> tuple[int, ...]:
        """The global blocks to try, largest first."""
        if self.lanes < 1:
            raise OptionError(f"{_NAME}: lanes must be >= 1, got {self.lanes}")
        given: Any = self.blocks
        if isinstance(given, str):  # from a pipeline string: "blocks=16:8"
            given = tuple(int(b) for b in given.split(":") if b.strip())
        cands = given or ((self.lanes, self.lanes // 2) if self.lanes > 1 else (1,))
        return tuple(sorted({int(b) for b in cands if int(b) > 0}, reverse=True))

    def _state(self, graph: Graph, rw: Rewriter, block: int, record: bool = False) -> LayoutState:
        return LayoutState(graph, rw, self.lanes, block, self.peak_lanes or self.lanes, record)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if self.mode not in ("blocked", "record"):
            raise OptionError(f"{_NAME}: mode must be 'blocked' or 'record', got {self.mode!r}")
        cands = self.candidates()
        if self.mode == "record":
            with Rewriter(graph) as rw:
                st = self._state(graph, rw, self.lanes, record=True)
                for node in graph.ops():
                    if (node.domain, node.op) in CONVS:
                        plan = plan_conv(st, node, graph.inputs_of(node))
                        if isinstance(plan, str):
                            st.miss(node, plan)
                        elif plan.decision is not None:
                            st.decisions.append(plan.decision)
            ctx.near_misses.extend(st.misses)
            graph.metadata[DECISIONS_KEY] = json.dumps(st.decisions, sort_keys=True)
            return rw.result
        best, best_cost = cands[0], float("inf")
        if len(cands) > 1 and not _already_laid_out(graph):
            for b in cands:
                trial = graph.clone()
                with Rewriter(trial) as trw:
                    tst = self._state(trial, trw, b)
                    _place(tst)
                    simplify_transforms(trial, trw)
                cost = _total_cost(tst)
                if cost < best_cost:
                    best, best_cost = b, cost
        with Rewriter(graph) as rw:
            st = self._state(graph, rw, best)
            if _already_laid_out(graph):  # a second run keeps the first run's decisions
                st.misses.append(NearMiss(_NAME, graph.name, "the graph already has blocked layouts"))
            else:
                _place(st)
                graph.metadata[DECISIONS_KEY] = json.dumps(st.decisions, sort_keys=True)
            simplify_transforms(graph, rw)
        ctx.near_misses.extend(st.misses)
        return rw.result


def record_layouts(graph: Graph, lanes: int) -> list[dict[str, Any]]:
    """The decisions choose-layout records for a runtime with fixed ``lanes``-channel blocks
    (MNN's NC4HW4: 4, CANN's NC1HWC0: 16), computed on a clone; ``graph`` is not changed."""
    trial = graph.clone()
    ChooseLayout(lanes=lanes, blocks=(lanes,), mode="record").run(trial, PassContext())
    return layout_decisions(trial)
