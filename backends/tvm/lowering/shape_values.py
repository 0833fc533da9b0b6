"""Shape vectors whose elements are known symbolically while lowering (``ctx.values``).

Shape of a run-time-shaped tensor gives ``[n, 4]`` with ``n`` a symbolic dim; the small int64
vectors computed from it (Gather / Unsqueeze / Squeeze / Reshape / Cast / Concat / Slice / Min / Max of such
values, whichever rule lowered them) keep their elements as PrimExprs, so a Reshape, Expand,
ConstantOfShape or Slice reading one gets its dims symbolically (``[n, -1] -> [n, 364 / 4 ...]``)
rather than at run time (fresh dims that Relax cannot relate to ``n``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from backends.tvm.lowering.table import LowerContext
from compiler.ir.graph import Node

__all__ = ["values_of", "track_values"]


def _rank(ctx: LowerContext, node: Node, port: int = 0) -> int:
    return len(ctx.in_type(node, port).shape or ())


def values_of(ctx: LowerContext, node: Node, port: int, x: Any) -> list[Any] | None:
    """The elements of input ``port`` as int64 PrimExprs, when known (a constant or tracked)."""
    from tvm import tirx

    c = ctx.input_const(node, port)
    if c is not None:
        if c.dtype.kind not in "iu" or c.size > 64:
            return None
        return [tirx.const(int(v), "int64") for v in np.asarray(c).reshape(-1)]
    return ctx.values.get(x)


def _track_gather(ctx: LowerContext, node: Node, vals: list[list[Any] | None]) -> list[Any] | None:
    idx = ctx.input_const(node, 1)
    src = vals[0]
    if src is None or idx is None or _rank(ctx, node) != 1:
        return None
    n = len(src)
    return [src[int(i) % n] for i in np.asarray(idx).reshape(-1)]


def _track_same(ctx: LowerContext, node: Node, vals: list[list[Any] | None]) -> list[Any] | None:
    out = ctx.out_type(node)
    if vals[0] is None or out.dtype.numpy.kind not in "iu":
        return None
    return vals[0]


def _track_concat(ctx: LowerContext, node: Node, vals: list[list[Any] | None]) -> list[Any] | None:
    if any(v is None for v in vals) or _rank(ctx, node) != 1:
        return None
    return [e for v in vals if v is not None for e in v]


def _track_slice(ctx: LowerContext, node: Node, vals: list[list[Any] | None]) -> list[Any] | None:
    src = vals[0]
    if src is None or _rank(ctx, node) != 1:
        return None
    starts, ends = ctx.input_const(node, 1), ctx.input_const(node, 2)
    steps = ctx.input_const(node, 4)
    if starts is None or ends is None:
        return None
    step = 1 if steps is None else int(np.asarray(steps).reshape(-1)[0])
    b = int(np.clip(np.asarray(starts).reshape(-1)[0], -(2**62), 2**62))
    e = int(np.clip(np.asarray(ends).reshape(-1)[0], -(2**62), 2**62))
    return src[slice(b, e, step)]


def _track_min_max(ctx: LowerContext, node: Node, vals: list[list[Any] | None]) -> list[Any] | None:
    """Elementwise min / max of tracked vectors (a 1-element one broadcasts): ``k = min(K, n)``."""
    from tvm import tirx

    if any(v is None for v in vals) or _rank(ctx, node) > 1:
        return None
    known = [v for v in vals if v is not None]
    n = max(len(v) for v in known)
    if any(len(v) not in (1, n) for v in known):
        return None
    fn = tirx.min if node.op == "Min" else tirx.max
    out = []
    for i in range(n):
        e = known[0][i % len(known[0])]
        for v in known[1:]:
            e = fn(e, v[i % len(v)])
        out.append(e)
    return out


_TRACKED: dict[str, Callable[[LowerContext, Node, list[list[Any] | None]], list[Any] | None]] = {
    "Gather": _track_gather,
    "Unsqueeze": _track_same,
    "Squeeze": _track_same,
    "Reshape": _track_same,
    "Flatten": _track_same,
    "Cast": _track_same,
    "Identity": _track_same,
    "Concat": _track_concat,
    "Slice": _track_slice,
    "Min": _track_min_max,
    "Max": _track_min_max,
}
"""Ops whose output elements follow from tracked input elements (small int64 shape vectors)."""


def track_values(ctx: LowerContext, node: Node, ins: list[Any], outs: list[Any]) -> None:
    """Record in ``ctx.values`` the elements of ``node``'s output when its inputs' are known."""
    fn = _TRACKED.get(node.op)
    if fn is None or node.domain or len(outs) != 1:
        return
    vals = [None if x is None else values_of(ctx, node, p, x) for p, x in enumerate(ins)]
    if vals[0] is None and not (node.op in ("Concat", "Min", "Max") and all(v is not None for v in vals)):
        return
    if all(ctx.input_const(node, p) is not None for p in range(len(ins)) if ins[p] is not None):
        return  # all constant: nothing symbolic to track
    got = fn(ctx, node, vals)
    if got is not None:
        ctx.values[outs[0]] = got
