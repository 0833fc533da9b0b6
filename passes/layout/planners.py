"""choose-layout's per-op planners: whether (and how) a node runs in a blocked layout.

Each planner returns a :class:`~passes.layout.state.Blocked` plan (the new op, its attrs, how
each input is fetched, the output block) or the reason the node stays NCHW. The conv cost model
and the rules are stated in :mod:`passes.choose_layout`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from compiler.ir.graph import Node, Value
from compiler.ops import blocked_layout as bl
from compiler.ops.fused import KILN, FusedConvAttrs
from compiler.ops.shapes import normalize_axes
from passes.layout.channels import plan_concat, plan_split
from passes.layout.state import Blocked, LayoutState, Spec, rank4_channels

__all__ = ["PLANNERS", "CONVS", "plan_conv", "INT8_BLOCK_MULTIPLE"]

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
CONVS = frozenset({("", "Conv"), (KILN, "FusedConv"), (KILN, "QConv")})
INT8_BLOCK_MULTIPLE = 4  # int8 dot instructions consume 4 input channels at once


def _conv_cost(
    st: LayoutState,
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


def plan_conv(st: LayoutState, node: Node, ins: list[Value | None]) -> Blocked | str:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    a = node.attrs
    if node.domain == KILN and a.is_blocked:
        return "the conv is already blocked"
    c = rank4_channels(x)
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
    return Blocked("QConv" if quantized else "FusedConv", attrs, specs, bo, m, KILN, decision)


def _full_channel_input(st: LayoutState, node: Node, ins: list[Value | None], c: int) -> Value | str:
    """A non-constant input that is already blocked and carries all ``c`` channels."""
    for v in ins:
        if v is not None and v.const is None and st.layout_of(v) and st.chans(v) == c:
            return v
    return "no blocked input carries the output channels"


def _plan_elementwise(st: LayoutState, node: Node, ins: list[Value | None]) -> Blocked | str:
    c = rank4_channels(st.graph.value(node))
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
    return Blocked(node.op, node.attrs, specs, b, c, node.domain)


def _blocked_input(st: LayoutState, node: Node, ins: list[Value | None]) -> tuple[Value, int, int] | str:
    x = ins[0]
    assert x is not None
    b, c = st.layout_of(x), st.chans(x)
    if not b or c is None:
        return "input is not blocked"
    return x, b, c


def _plan_pool(st: LayoutState, node: Node, ins: list[Value | None]) -> Blocked | str:
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
    return Blocked(node.op, attrs, [(x, b)], b, c)


def _plan_global_pool(st: LayoutState, node: Node, ins: list[Value | None]) -> Blocked | str:
    got = _blocked_input(st, node, ins)
    if isinstance(got, str):
        return got
    x, b, c = got
    op = "ReduceMean" if node.op == "GlobalAveragePool" else "ReduceMax"
    return Blocked(op, {"keepdims": 1}, [(x, b), np.array([2, 3], np.int64)], b, c)


def _plan_reduce(st: LayoutState, node: Node, ins: list[Value | None]) -> Blocked | str:
    got = _blocked_input(st, node, ins)
    if isinstance(got, str):
        return got
    x, b, c = got
    axes = ins[1].const if len(ins) > 1 and ins[1] is not None else None
    if axes is None or node.attrs.keepdims != 1 or sorted(normalize_axes(axes.tolist(), 4)) != [2, 3]:
        return "ReduceMean is not over the spatial axes {2, 3} with keepdims=1"
    return Blocked(node.op, node.attrs, [(x, b), np.array([2, 3], np.int64)], b, c)


def _plan_resize(st: LayoutState, node: Node, ins: list[Value | None]) -> Blocked | str:
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
        return Blocked(node.op, a, [(x, b), None, np.append(scales, 1).astype(scales.dtype)], b, c)
    out = node.output_types[0].shape
    if sizes is not None and sizes.size == 4 and out is not None and tuple(out[:2]) == (xs[0], c):
        new = np.array([sizes[0], bl.blocks(c, b), sizes[2], sizes[3], b], np.int64)
        return Blocked(node.op, a, [(x, b), None, None, new], b, c)
    return "Resize scales batch or channels"


Planner = Callable[[LayoutState, Node, list[Value | None]], "Blocked | str"]
PLANNERS: dict[tuple[str, str], Planner] = {
    **{("", op): _plan_elementwise for op in _ELEMENTWISE},
    **{(KILN, op): _plan_elementwise for op in _KILN_ELEMENTWISE},
    **{("", op): _plan_elementwise for op in _QDQ},
    **{key: plan_conv for key in CONVS},
    ("", "MaxPool"): _plan_pool,
    ("", "AveragePool"): _plan_pool,
    ("", "GlobalAveragePool"): _plan_global_pool,
    ("", "GlobalMaxPool"): _plan_global_pool,
    ("", "ReduceMean"): _plan_reduce,
    ("", "Resize"): _plan_resize,
    ("", "Concat"): plan_concat,
    ("", "Split"): plan_split,
}
