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
lane axis) and Concat on channels when every C_i is a multiple of the common block.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import OptionError
from compiler.ir.graph import Graph, Node, Value
from compiler.ops import blocked_layout as bl
from compiler.ops.fused import KILN, FusedConvAttrs
from compiler.ops.layout_transform import LAYOUT_TRANSFORM, LayoutTransformAttrs
from compiler.ops.shapes import normalize_axes
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import NearMiss
from compiler.rewriter import PassResult, Rewriter

__all__ = ["ChooseLayout", "layout_decisions", "DECISIONS_KEY", "simplify_transforms"]

DECISIONS_KEY = "layout_decisions"
TRANSFORM_COST_PER_BYTE = 0.25
_NAME = "choose-layout"

_ELEMENTWISE = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Relu",
        "Clip",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "LeakyRelu",
        "Tanh",
        "Erf",
    }
)
_KILN_ELEMENTWISE = frozenset({"Relu6"})
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})  # elementwise when per-tensor
_CONVS = frozenset({("", "Conv"), (KILN, "FusedConv"), (KILN, "QConv")})
INT8_BLOCK_MULTIPLE = 4  # int8 dot instructions consume 4 input channels at once


def layout_decisions(graph: Graph) -> list[dict[str, Any]]:
    """The per-conv decisions the last choose-layout run recorded (empty if none)."""
    text = graph.metadata.get(DECISIONS_KEY)
    return list(json.loads(text)) if text else []


# --------------------------------------------------------------------- planning
Spec = tuple[Value, int] | np.ndarray | None
"""How a new node gets one input: (value, block) fetched in that layout (-1 = as is),
a new constant array, or None (absent optional input)."""


@dataclass
class _Blocked:
    """A planned blocked node: op, attrs, input specs, output block and channel count."""

    op: str
    attrs: Any
    inputs: list[Spec]
    block: int
    channels: int
    domain: str = ""
    decision: dict[str, Any] | None = None


@dataclass
class _State:
    """One placement run on one graph with global block ``block``."""

    graph: Graph
    rw: Rewriter
    lanes: int
    block: int
    peak: int
    record: bool = False
    reps: dict[tuple[int, int], dict[int, Value]] = field(default_factory=dict)
    channels: dict[tuple[int, int], int] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    misses: list[NearMiss] = field(default_factory=list)

    def block_for(self, c: int) -> int:
        """b(C): C below the lane count (no padding), else the global block."""
        return self.block if self.record or c >= self.lanes else c

    def layout_of(self, v: Value) -> int:
        """The block the value currently lives in (0 = NCHW)."""
        rep = self.reps.get((v.node, v.port))
        return next(iter(rep)) if rep else 0

    def chans(self, v: Value) -> int | None:
        """Real channel count of a rank-4 (or blocked) value, if static."""
        c = self.channels.get((v.node, v.port))
        if c is not None:
            return c
        s = v.type.shape
        return s[1] if s is not None and len(s) == 4 and isinstance(s[1], int) else None

    def fetch(self, v: Value, block: int) -> Value:
        """``v`` in layout ``block``, inserting (and caching) one LayoutTransform."""
        key = (v.node, v.port)
        rep = self.reps.setdefault(key, {0: v})
        if block in rep:
            return rep[block]
        src_block, src = next(iter(rep.items()))
        c = self.chans(v)
        assert c is not None
        attrs = LayoutTransformAttrs(bl.blocked(src_block), bl.blocked(block), c)
        rep[block] = self.rw.op(
            LAYOUT_TRANSFORM, [src], attrs, domain=KILN, name=f"{v.name}_to_{bl.blocked(block)}"
        )
        return rep[block]

    def miss(self, node: Node, reason: str) -> None:
        """Record why ``node`` stays NCHW."""
        self.misses.append(NearMiss(_NAME, node.name or node.output_names[0], reason))


def _rank4_channels(v: Value) -> int | None:
    s = v.type.shape
    return s[1] if s is not None and len(s) == 4 and isinstance(s[1], int) else None


def _conv_cost(
    st: _State,
    x: tuple[int, ...],
    w: tuple[int, ...],
    y: tuple[int, ...],
    bi: int,
    bo: int,
    depthwise: bool,
    group_chunks: int | None = None,
) -> float:
    """Padded MACs / (lanes * eff(b_out)); shapes are NCHW x, OIHW w and NCHW y (a grouped conv
    reads ``group_chunks`` input chunks per output chunk)."""
    n, m, ho, wo = y
    k = int(np.prod(w[2:]))
    mp = bl.blocks(m, bo) * bo
    chunks = bl.blocks(x[1], bi) if group_chunks is None else group_chunks
    cin = 1 if depthwise else chunks * bi
    eff = min(bo, st.peak) / st.peak
    return float(n * ho * wo * k * cin * mp) / (st.lanes * eff)


def _plan_conv(st: _State, node: Node, ins: list[Value | None]) -> _Blocked | str:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    a = node.attrs
    if node.domain == KILN and a.is_blocked:
        return "the conv is already blocked"
    c = _rank4_channels(x)
    ys = node.output_types[0]
    if c is None or not w.type.is_static or ys.shape is None or x.type.shape is None:
        return "the conv input is not rank 4 with static channels, or its weight is dynamic"
    wshape = w.type.static_shape
    yshape = tuple(d if isinstance(d, int) else 1 for d in ys.shape)  # symbolic dims count as 1
    m = wshape[0]
    depthwise = a.group == c == m and a.group > 1
    grouped = a.group != 1 and not depthwise
    quantized = node.domain == KILN and node.op == "QConv"
    if grouped and (quantized or st.record):
        return f"grouped conv (group={a.group}, C_in={c}, C_out={m}) is neither dense nor depthwise"
    q = INT8_BLOCK_MULTIPLE if quantized else 1
    have = st.layout_of(x)
    bi = have if have and not st.record and have % q == 0 else -(-st.block_for(c) // q) * q
    bo = bi if depthwise else -(-st.block_for(m) // q) * q
    group_chunks = bl.grouped_chunks(c, m, a.group, bi, bo) if grouped else None
    if grouped and group_chunks is None:
        return (
            f"grouped conv (group={a.group}, C_in={c}, C_out={m}): its groups do not fill whole "
            f"{bl.blocked(bi)} / {bl.blocked(bo)} chunks"
        )
    chosen = {
        "layout": bl.blocked(bi),
        "out_layout": "" if bo == bi else bl.blocked(bo),
        "weight_layout": bl.weight_layout(bi, bo, depthwise),
    }
    if quantized:
        attrs: Any = dataclasses.replace(a, **chosen)
    else:
        base = {
            f.name: getattr(a, f.name)
            for f in dataclasses.fields(a)
            if f.name in FusedConvAttrs.__dataclass_fields__
        }
        attrs = FusedConvAttrs(**{**base, **chosen})
    xs = tuple(d if isinstance(d, int) else 1 for d in x.type.shape)
    cost = _conv_cost(st, xs, wshape, yshape, bi, bo, depthwise, group_chunks)
    decision = {
        "node": node.name or node.output_names[0],
        "data_layout": attrs.layout,
        "out_layout": attrs.output_layout,
        "weight_layout": attrs.weight_layout,
        "cost": round(cost, 1),
    }
    specs: list[Spec] = [(x, bi), (w, -1), *[(v, -1) if v is not None else None for v in ins[2:3]]]
    while len(specs) < 3:
        specs.append(None)
    if len(ins) > 3 and ins[3] is not None:
        specs.append((ins[3], bo))
    return _Blocked("QConv" if quantized else "FusedConv", attrs, specs, bo, m, KILN, decision)


def _full_channel_input(st: _State, node: Node, ins: list[Value | None], c: int) -> Value | str:
    """A non-constant input that is already blocked and carries all ``c`` channels."""
    for v in ins:
        if v is not None and v.const is None and st.layout_of(v) and st.chans(v) == c:
            return v
    return "no blocked input carries the output channels"


def _plan_elementwise(st: _State, node: Node, ins: list[Value | None]) -> _Blocked | str:
    c = _rank4_channels(st.graph.value(node))
    if c is None:
        return "output is not rank 4 with static channels"
    lead = _full_channel_input(st, node, ins, c)
    if isinstance(lead, str):
        return lead
    if not node.domain and node.op in _QDQ and any(v is not None and v.type.numel != 1 for v in ins[1:]):
        return "per-axis quantization parameters are not elementwise"
    b = st.layout_of(lead)
    specs: list[Spec] = []
    for port, v in enumerate(ins):
        divisor = node.op == "Div" and not node.domain and port == 1
        if v is None:
            specs.append(None)
            continue
        arr = v.const
        if arr is not None:
            if divisor and not np.all(arr != 0):
                return "Div by a constant with zeros could turn a padded lane into inf/NaN"
            if arr.size == 1:
                specs.append((v, -1))
                continue
            packed = bl.pack_broadcast_const(np.asarray(arr), c, b, fill=1.0 if divisor else 0.0)
            if packed is None:
                return f"constant operand of shape {list(arr.shape)} is not per-channel"
            specs.append(packed)
            continue
        if divisor:
            return "Div by a non-constant could turn a padded lane into inf/NaN"
        s = v.type.shape
        if s is not None and len(s) < 4 and v.type.is_static and v.type.numel == 1:
            specs.append((v, -1))
            continue
        vc = st.chans(v)
        if s is None or (len(s) != 4 and not st.layout_of(v)) or vc not in (c, 1):
            return f"operand {v.name!r} of type {v.type} does not broadcast per channel"
        specs.append((v, b if vc == c else 1))
    return _Blocked(node.op, node.attrs, specs, b, c, node.domain)


def _blocked_input(st: _State, node: Node, ins: list[Value | None]) -> tuple[Value, int, int] | str:
    x = ins[0]
    assert x is not None
    b, c = st.layout_of(x), st.chans(x)
    if not b or c is None:
        return "input is not blocked"
    return x, b, c


def _plan_pool(st: _State, node: Node, ins: list[Value | None]) -> _Blocked | str:
    got = _blocked_input(st, node, ins)
    if isinstance(got, str):
        return got
    x, b, c = got
    if node.num_outputs != 1:
        return "MaxPool with Indices depends on the NCHW flat index"
    a = node.attrs
    k = tuple(a.kernel_shape)
    if len(k) != 2:
        return "pooling is not 2-D"
    pads = tuple(a.pads) or (0, 0, 0, 0)
    attrs = dataclasses.replace(
        a,
        kernel_shape=(*k, 1),
        strides=(*(tuple(a.strides) or (1, 1)), 1),
        dilations=(*(tuple(a.dilations) or (1, 1)), 1),
        pads=(pads[0], pads[1], 0, pads[2], pads[3], 0),
    )
    return _Blocked(node.op, attrs, [(x, b)], b, c)


def _plan_global_pool(st: _State, node: Node, ins: list[Value | None]) -> _Blocked | str:
    got = _blocked_input(st, node, ins)
    if isinstance(got, str):
        return got
    x, b, c = got
    op = "ReduceMean" if node.op == "GlobalAveragePool" else "ReduceMax"
    return _Blocked(op, {"keepdims": 1}, [(x, b), np.array([2, 3], np.int64)], b, c)


def _plan_reduce(st: _State, node: Node, ins: list[Value | None]) -> _Blocked | str:
    got = _blocked_input(st, node, ins)
    if isinstance(got, str):
        return got
    x, b, c = got
    axes = ins[1].const if len(ins) > 1 and ins[1] is not None else None
    if axes is None or node.attrs.keepdims != 1 or sorted(normalize_axes(axes.tolist(), 4)) != [2, 3]:
        return "ReduceMean is not over the spatial axes {2, 3} with keepdims=1"
    return _Blocked(node.op, node.attrs, [(x, b), np.array([2, 3], np.int64)], b, c)


def _plan_resize(st: _State, node: Node, ins: list[Value | None]) -> _Blocked | str:
    got = _blocked_input(st, node, ins)
    if isinstance(got, str):
        return got
    x, b, c = got
    a = node.attrs
    get = [ins[i] if i < len(ins) else None for i in range(4)]
    given = [v.const for v in get[1:] if v is not None]
    if any(arr is None for arr in given):
        return "Resize roi/scales/sizes are not constants"
    roi, scales, sizes = (
        None if v is None or v.const is None or v.const.size == 0 else v.const for v in get[1:]
    )
    if roi is not None or a.axes or a.keep_aspect_ratio_policy != "stretch":
        return "Resize uses roi, axes or an aspect-ratio policy"
    xs = x.type.shape
    assert xs is not None
    if scales is not None and scales.size == 4 and scales[0] == 1 and scales[1] == 1:
        return _Blocked(node.op, a, [(x, b), None, np.append(scales, 1).astype(scales.dtype)], b, c)
    out = node.output_types[0].shape
    if sizes is not None and sizes.size == 4 and out is not None and tuple(out[:2]) == (xs[0], c):
        new = np.array([sizes[0], bl.blocks(c, b), sizes[2], sizes[3], b], np.int64)
        return _Blocked(node.op, a, [(x, b), None, None, new], b, c)
    return "Resize scales batch or channels"


def _plan_concat(st: _State, node: Node, ins: list[Value | None]) -> _Blocked | str:
    c = _rank4_channels(st.graph.value(node))
    if c is None or normalize_axes([node.attrs.axis], 4)[0] != 1:
        return "Concat is not on the channel axis of a rank-4 tensor"
    lead = next((v for v in ins if v is not None and st.layout_of(v)), None)
    if lead is None:
        return "no input is blocked"
    b = st.layout_of(lead)
    for v in ins:
        vc = None if v is None or v.const is not None else st.chans(v)
        if vc is None or vc % b:
            return f"an input's channels are not a multiple of the block {b}"
    specs: list[Spec] = [(v, b) for v in ins if v is not None]
    return _Blocked(node.op, node.attrs, specs, b, c)


_Planner = Callable[[_State, Node, list[Value | None]], "_Blocked | str"]
_PLANNERS: dict[tuple[str, str], _Planner] = {
    **{("", op): _plan_elementwise for op in _ELEMENTWISE},
    **{(KILN, op): _plan_elementwise for op in _KILN_ELEMENTWISE},
    **{("", op): _plan_elementwise for op in _QDQ},
    **{key: _plan_conv for key in _CONVS},
    ("", "MaxPool"): _plan_pool,
    ("", "AveragePool"): _plan_pool,
    ("", "GlobalAveragePool"): _plan_global_pool,
    ("", "GlobalMaxPool"): _plan_global_pool,
    ("", "ReduceMean"): _plan_reduce,
    ("", "Resize"): _plan_resize,
    ("", "Concat"): _plan_concat,
}


# -------------------------------------------------------------------- rewriting
def _execute(st: _State, node: Node, plan: _Blocked) -> Value:
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
    new = st.rw.op(plan.op, inputs, plan.attrs, domain=plan.domain, like=node)
    key = (node.id, 0)
    st.reps[key] = {plan.block: new}
    st.channels[key] = plan.channels
    return new


def _place(st: _State) -> None:
    """Block convs, propagate forward, insert shared transforms, drop the replaced nodes."""
    g = st.graph
    replaced: list[tuple[Node, Value]] = []
    for node in g.ops():
        ins = g.inputs_of(node)
        planner = _PLANNERS.get((node.domain, node.op))
        is_conv = (node.domain, node.op) in _CONVS
        plan: _Blocked | str = "op has no blocked form"
        if planner is not None and (is_conv or any(v is not None and st.layout_of(v) for v in ins)):
            plan = planner(st, node, ins)
        if isinstance(plan, _Blocked):
            if plan.decision is not None:
                st.decisions.append(plan.decision)
            replaced.append((node, _execute(st, node, plan)))
            continue
        if is_conv or any(v is not None and st.layout_of(v) for v in ins):
            st.miss(node, plan)
        for port, v in enumerate(ins):
            if v is not None and st.layout_of(v):
                g.set_input(node, port, st.fetch(v, 0))
    names = [(node.output_names[0], new, st.layout_of(g.value(node))) for node, new in replaced]
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


def _total_cost(st: _State) -> float:
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

    def _state(self, graph: Graph, rw: Rewriter, block: int, record: bool = False) -> _State:
        return _State(graph, rw, self.lanes, block, self.peak_lanes or self.lanes, record)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if self.mode not in ("blocked", "record"):
            raise OptionError(f"{_NAME}: mode must be 'blocked' or 'record', got {self.mode!r}")
        cands = self.candidates()
        if self.mode == "record":
            with Rewriter(graph) as rw:
                st = self._state(graph, rw, self.lanes, record=True)
                for node in graph.ops():
                    if (node.domain, node.op) in _CONVS:
                        plan = _plan_conv(st, node, graph.inputs_of(node))
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
