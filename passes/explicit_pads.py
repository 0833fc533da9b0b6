"""explicit-pads: auto_pad and standalone zero Pads become explicit window pads.

* auto-pad: Conv, MaxPool, AveragePool with auto_pad = SAME_UPPER | SAME_LOWER | VALID over
  static spatial sizes -> auto_pad = NOTSET with pads [b..., e...]: VALID gives 0; SAME gives
  total = max(0, (ceil(L / s) - 1) * s + d * (k - 1) + 1 - L) split small = total // 2,
  (small, total - small) for SAME_UPPER and (total - small, small) for SAME_LOWER.
  ConvTranspose (auto_pad SAME* or output_shape o): total = s * (L - 1) + d * (k - 1) + 1 + a - o
  (a = output_padding) split as ONNX says, output_shape dropped. The rewritten node must infer
  the very same output type, else it is refused.
* pad-conv: Conv(Pad(x, p, 0; constant), W, b; pads q) = Conv(x, W, b; pads q + p) when Pad pads
  only spatial axes by p >= 0 with zeros: the conv reads the same zeros from its own padding.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Node
from compiler.ops.conv import conv_transpose_geometry
from compiler.ops.registry import get_op, infer_node_types
from compiler.ops.shapes import normalize_axes, resolve_pads, window_params
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Match, Op, OpMismatch, Rule, apply_rules
from compiler.rewriter import PassResult, Rewriter

__all__ = ["ExplicitPads", "AutoPad", "PadIntoConv", "explicit_attrs"]

WINDOW_OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool")


def explicit_attrs(graph: Graph, node: Node) -> Any | str:
    """``node``'s attrs with auto_pad NOTSET and explicit pads (output_shape dropped), or why not."""
    a = node.attrs
    if a.auto_pad == "NOTSET" and not getattr(a, "output_shape", ()):
        return OpMismatch("pads are already explicit")
    x = graph.inputs_of(node)[0]
    assert x is not None
    if x.type.shape is None or not all(isinstance(d, int) for d in x.type.shape[2:]):
        return "spatial dims are not static"
    sizes = [int(d) for d in x.type.shape[2:]]
    nd = len(sizes)
    if a.kernel_shape:
        kernel = tuple(a.kernel_shape)
    else:
        w = graph.inputs_of(node)[1]
        if w is None or w.type.shape is None or not all(isinstance(d, int) for d in w.type.shape[2:]):
            return "kernel shape is not static"
        kernel = tuple(int(d) for d in w.type.shape[2:])
    s, d, p = window_params(nd, kernel, a.strides, a.dilations, a.pads)
    changes: dict[str, Any] = {"auto_pad": "NOTSET"}
    if node.op == "ConvTranspose":
        out, begins = conv_transpose_geometry(a, sizes, kernel, s, d, p)
        assert begins is not None
        adj = tuple(a.output_padding) or (0,) * nd
        totals = [
            s[i] * (sizes[i] - 1) + d[i] * (kernel[i] - 1) + 1 + adj[i] - int(out[i]) for i in range(nd)
        ]
        if any(t < 0 for t in totals):
            return "the output is larger than the natural size (not expressible by pads)"
        changes["pads"] = tuple(begins) + tuple(t - b for t, b in zip(totals, begins, strict=True))
        changes["output_shape"] = ()
    else:
        changes["pads"] = resolve_pads(a.auto_pad, sizes, kernel, s, d, p)
    new = dataclasses.replace(a, **changes)
    types = infer_node_types(get_op(node.op), new, graph.inputs_of(node), node.num_outputs, node.name)
    return new if types == node.output_types else "explicit pads would change the output shape"


class AutoPad(Rule):
    """auto_pad SAME_UPPER/SAME_LOWER/VALID (and ConvTranspose output_shape) -> NOTSET + explicit pads."""

    name = "auto-pad"

    def __init__(self, op: str) -> None:
        self.pattern = Op(op)

    def check(self, graph: Graph, m: Match) -> str | None:
        new = explicit_attrs(graph, m.root)
        return new if isinstance(new, str) else None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        new = explicit_attrs(rw.graph, m.root)
        assert not isinstance(new, str)
        rw.graph.set_attrs(m.root, new)


class PadIntoConv(Rule):
    """Conv(Pad(x, p, 0), W, b; pads q) = Conv(x, W, b; pads q + p) for a spatial zero Pad."""

    name = "pad-conv"
    pattern = Op(
        "Conv",
        (
            Op(
                "Pad",
                (Any_("x"), Any_("p"), Any_("v", optional=True), Any_("axes", optional=True)),
                name="pad",
            ),
            Any_("w"),
            Any_("b", optional=True),
        ),
    )

    def _spatial(self, graph: Graph, m: Match) -> list[int] | str:
        """The conv-layout pads [b..., e...] the Pad adds, or why it cannot fold."""
        pad, x = m.node("pad"), m.value("x")
        if pad.attrs.mode != "constant":
            return f"Pad mode is {pad.attrs.mode}, not constant"
        v = m.values.get("v")
        if v is not None and (v.const is None or np.any(v.const != 0)):
            return "Pad value is not a constant 0"
        p, axes_v, rank = m.value("p").const, m.values.get("axes"), x.type.rank
        if p is None or rank is None:
            return "Pad pads are not constant"
        axes = list(range(rank))
        if axes_v is not None:
            if axes_v.const is None:
                return "Pad axes are not constant"
            axes = normalize_axes([int(a) for a in axes_v.const.reshape(-1)], rank)
        full = [0] * (2 * rank)
        for k, ax in enumerate(axes):
            full[ax], full[ax + rank] = int(p[k]), int(p[k + len(axes)])
        if any(full[i] or full[i + rank] for i in (0, 1)):
            return "Pad pads the batch or channel axis"
        if any(v < 0 for v in full):
            return "Pad crops (negative pads)"
        return full[2:rank] + full[rank + 2 :]

    def check(self, graph: Graph, m: Match) -> str | None:
        if m.root.attrs.auto_pad != "NOTSET":
            return f"conv auto_pad is {m.root.attrs.auto_pad} (auto-pad makes it explicit first)"
        extra = self._spatial(graph, m)
        return extra if isinstance(extra, str) else None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        extra = self._spatial(rw.graph, m)
        assert not isinstance(extra, str)
        a = m.root.attrs
        q = tuple(a.pads) or (0,) * len(extra)
        attrs = dataclasses.replace(a, pads=tuple(i + j for i, j in zip(q, extra, strict=True)))
        ins = [m.value("x"), m.value("w"), m.values.get("b")]
        new = rw.op("Conv", ins if ins[2] is not None else ins[:2], attrs, like=m.root)
        rw.replace(rw.graph.value(m.root), new, take_name=True)


RULES: list[Rule] = [*(AutoPad(op) for op in WINDOW_OPS), PadIntoConv()]


@register_pass
@dataclass(frozen=True)
class ExplicitPads(Pass):
    """Make auto_pad explicit on Conv/ConvTranspose/pools and fold zero Pads into Conv pads."""

    name = "explicit-pads"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return apply_rules(graph, RULES, near_misses=ctx.near_misses)
