"""MegEngine's blocked layouts (NCHW44, NCHW44_DOT, NCHW88) and filter layouts, converted to NCHW/OIHW.

Blocked formats split the channel axis into ``C/b`` blocks of ``b`` (4 or 8):

* activations ``[N, C/b, H, W, b]`` (NCHW44_DOT activations are NCHW44's);
* biases ``[1, OC/b, 1, 1, b]``, or the full output ``[N, OC/b, OH, OW, b]``.

Filters F, with ``o``/``i`` an output/input channel inside its group ``g`` and W
the OIHW filter (spatial indices ``h, w`` elided from W); these are
megdnn's ``make_canonized_filter_meta_nchwxx`` layouts and the addresses its
naive kernel reads (``dnn/src/naive/convolution/helper.h``):

=============  ==========================================  =========================================
kind           shape                                       element
=============  ==========================================  =========================================
dense          ``[OC/b, IC/b, FH, FW, b(ic), b(oc)]``      ``W[o, i] = F[o//b, i//b, h, w, i%b, o%b]``
group          ``[G, OCg/b, ICg/b, FH, FW, b(ic), b(oc)]`` ``W[g*OCg + o, i] =``
                                                           ``F[g, o//b, i//b, h, w, i%b, o%b]``
channel-wise   ``[G/b, 1, 1, FH, FW, b]`` (ICg = OCg = 1)  ``W[g, 0] = F[g//b, 0, 0, h, w, g%b]``
hybrid         ``[OC/b, FH, FW, IC, b(oc)]`` (NCHW input)  ``W[o, i] = F[o//b, h, w, i, o%b]``
=============  ==========================================  =========================================

NCHW44_DOT (int8 dot-product kernels) swaps the two inner blocks of dense and
group filters to ``b(oc), b(ic)``; its channel-wise and hybrid filters are NCHW44's.

Kiln computes in NCHW with OIHW filters. A layout change is a short list of
steps (reshape / transpose / flip). On a constant, or on DequantizeLinear of a
constant (an int8 weight), the steps are applied to the stored array, so the
weight stays one constant (int8 stays int8). Other values get the equivalent
Reshape/Transpose/Slice nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.ir.graph import Value
from frontends.megengine.converter import OprContext

__all__ = ["Step", "BLOCK", "apply_steps", "relayout", "blocked_to_nchw", "nchw_to_blocked", "filter_steps"]

Step = tuple[str, tuple[int, ...]]
"""("reshape", shape), ("transpose", perm) or ("flip", axes)."""

BLOCK = {"NCHW": 1, "NCHW44": 4, "NCHW44_DOT": 4, "NCHW88": 8}
"""Channel block of each format Kiln imports."""

_OC_FIRST = frozenset({"NCHW44_DOT"})
"""Formats whose dense/group filters put the output-channel block before the input-channel block."""


def apply_steps(arr: np.ndarray, steps: Sequence[Step]) -> np.ndarray:
    """The steps applied to a numpy array."""
    for kind, arg in steps:
        if kind == "reshape":
            arr = arr.reshape(arg)
        elif kind == "transpose":
            arr = arr.transpose(arg)
        else:
            arr = np.flip(arr, axis=arg)
    return np.ascontiguousarray(arr)


def _graph_steps(ctx: OprContext, v: Value, steps: Sequence[Step]) -> Value:
    for kind, arg in steps:
        if kind == "reshape":
            v = ctx.emit1("Reshape", [v, ctx.ints(arg, "shape")])
        elif kind == "transpose":
            v = ctx.emit1("Transpose", [v], {"perm": arg})
        else:
            n = len(arg)
            big = np.iinfo(np.int64).min
            v = ctx.emit1(
                "Slice",
                [
                    v,
                    ctx.ints([-1] * n, "starts"),
                    ctx.ints([big] * n, "ends"),
                    ctx.ints(arg, "axes"),
                    ctx.ints([-1] * n, "steps"),
                ],
            )
    return v


def relayout(ctx: OprContext, v: Value, steps: Sequence[Step]) -> Value:
    """``v`` with the steps applied; constants (and dequantized constants) are rewritten in place."""
    if not steps:
        return v
    arr = v.const
    if arr is not None:
        return ctx.constant(apply_steps(arr, steps), "relayout")
    node = v.producer
    if node.op == "DequantizeLinear" and not node.domain:
        ins = ctx.graph.inputs_of(node)
        q = ins[0].const if ins[0] is not None else None
        scale = ins[1].const if len(ins) > 1 and ins[1] is not None else None
        if q is not None and scale is not None and scale.size == 1:
            stored = ctx.constant(apply_steps(q, steps), "relayout")
            return ctx.emit1("DequantizeLinear", [stored, *ins[1:]], node.attrs)
    return _graph_steps(ctx, v, steps)


def blocked_to_nchw(ctx: OprContext, v: Value, block: int) -> Value:
    """``[N, C/b, H, W, b]`` -> ``[N, C, H, W]``."""
    n, cb, h, w, b = _rank5(ctx, v, block)
    return relayout(ctx, v, [("transpose", (0, 1, 4, 2, 3)), ("reshape", (n, cb * b, h, w))])


def nchw_to_blocked(ctx: OprContext, v: Value, block: int) -> Value:
    """``[N, C, H, W]`` -> ``[N, C/b, H, W, b]``."""
    n, c, h, w = ctx.shape(v)
    if c % block:
        raise ctx.fail(f"{c} channels do not split into blocks of {block}")
    return relayout(ctx, v, [("reshape", (n, c // block, block, h, w)), ("transpose", (0, 1, 3, 4, 2))])


def _rank5(ctx: OprContext, v: Value, block: int) -> tuple[int, ...]:
    shape = ctx.shape(v)
    if len(shape) != 5 or shape[4] != block:
        raise ctx.fail(f"expected a blocked [N, C/{block}, H, W, {block}] tensor, got {list(shape)}")
    return shape


def filter_steps(
    ctx: OprContext, shape: tuple[int, ...], fmt: str, group: bool, blocked_input: bool
) -> tuple[list[Step], int]:
    """Steps turning a MegEngine filter of format ``fmt`` into OIHW, and the conv group count."""
    block = BLOCK[fmt]
    kind = "group" if group else "dense"
    if block == 1:
        if not group and len(shape) == 4:
            return [], 1
        if group and len(shape) == 5:
            g, ocpg, icpg, fh, fw = shape
            return [("reshape", (g * ocpg, icpg, fh, fw))], g
    elif not blocked_input:
        if not group and len(shape) == 5 and shape[4] == block:  # hybrid [OC/b, FH, FW, IC, b]
            ocb, fh, fw, ic = shape[:4]
            return [("transpose", (0, 4, 3, 1, 2)), ("reshape", (ocb * block, ic, fh, fw))], 1
        kind = f"{kind} (NCHW input)"
    elif group and len(shape) == 6 and shape[1:3] == (1, 1) and shape[5] == block:
        gb, _, _, fh, fw, _ = shape  # channel-wise [G/b, 1, 1, FH, FW, b]
        return [("transpose", (0, 5, 1, 2, 3, 4)), ("reshape", (gb * block, 1, fh, fw))], gb * block
    elif len(shape) == (7 if group else 6) and shape[-2:] == (block, block):
        *lead, ocb, icb, fh, fw = shape[:-2]
        g = lead[0] if lead else 1
        n = len(lead)  # [(G,) OCb, ICb, FH, FW, b(ic), b(oc)] -> [(G,) OCb, b(oc), ICb, b(ic), FH, FW]
        oc_in, ic_in = (n + 4, n + 5) if fmt in _OC_FIRST else (n + 5, n + 4)
        perm = (*range(n), n, oc_in, n + 1, ic_in, n + 2, n + 3)
        return [("transpose", perm), ("reshape", (g * ocb * block, icb * block, fh, fw))], g
    raise ctx.fail(f"filter shape {list(shape)} does not fit a {kind} {fmt} conv")
