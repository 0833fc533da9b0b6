"""Control flow: If, Loop and Scan, whose bodies are subgraphs the node owns through its attrs.

Values a body reads from the enclosing graph are explicit: the node's last ``captures`` inputs
are bound, in order, to the last ``captures`` inputs of each of its subgraphs (ONNX reads them
by name; the exporter writes them back that way). With c the captured values:

* ``If(cond, c) = then_branch(c) if cond else else_branch(c)``. Output types are the union of
  the branches' (a dim the branches disagree on is unknown), whether or not cond is constant,
  so a condition that becomes constant later never makes recorded types stale.
* ``Loop(M, cond, v0, c)``: ``v, k = v0, cond``; for ``i = 0, 1, ...`` while ``i < M`` and k:
  ``k, v, s_i = body(i, k, v, c)``. Outputs: the final v, then each scan output s stacked over
  the iterations (a new leading axis, of the trip count when it is static).
* ``Scan(s0, x_1..x_m, c)`` (opset 9+): for ``t`` along each x_j's axis ``a_j`` (from the end
  where its direction is 1): ``s, y_t = body(s, x_1[t], .., x_m[t], c)``. Outputs: the final s,
  then each y stacked along its ``scan_output_axes`` entry (reversed where its direction is 1).

Each body runs through the interpreter (:func:`evaluate`), so every op a body holds keeps its
own registry reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.graph import CONSTANT_OP, Graph, Node
from compiler.ir.types import DType, TensorType
from compiler.ops.registry import KILN_ONLY, InferContext, OpDef, register
from compiler.ops.shapes import UNKNOWN, normalize_axis

__all__ = [
    "IfAttrs",
    "LoopAttrs",
    "ScanAttrs",
    "CONTROL_FLOW_OPS",
    "Runner",
    "evaluate",
    "loop_trip_count",
    "scan_layout",
    "union_type",
]

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})

Runner = Callable[[Graph, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
"""Runs a subgraph on named feeds and returns its outputs by value name (the interpreter)."""


@dataclass(frozen=True)
class IfAttrs:
    """If: two branches with no formal inputs; ``captures`` outer values follow the condition."""

    then_branch: Graph
    else_branch: Graph
    captures: int = field(default=0, metadata=KILN_ONLY)


@dataclass(frozen=True)
class LoopAttrs:
    """Loop: body(iter_num, cond, v..., captures...) -> (cond, v..., scan outputs...)."""

    body: Graph
    captures: int = field(default=0, metadata=KILN_ONLY)


@dataclass(frozen=True)
class ScanAttrs:
    """Scan (opset 9+): body(states..., scan slices..., captures...) -> (states..., scan outputs...)."""

    body: Graph
    num_scan_inputs: int
    scan_input_axes: tuple[int, ...] | None = None
    scan_input_directions: tuple[int, ...] | None = None
    scan_output_axes: tuple[int, ...] | None = None
    scan_output_directions: tuple[int, ...] | None = None
    captures: int = field(default=0, metadata=KILN_ONLY)


# ------------------------------------------------------------------ types
def union_type(a: TensorType, b: TensorType, where: str = "") -> TensorType:
    """The type of a value that is either ``a`` or ``b``: dims they disagree on become unknown."""
    if a.dtype != b.dtype:
        raise ValueError(f"{where}: element types {a.dtype.short} and {b.dtype.short} differ")
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorType(a.dtype, None)
    return TensorType(a.dtype, tuple(x if x == y else UNKNOWN for x, y in zip(a.shape, b.shape, strict=True)))


def _check_interface(
    ctx: InferContext, label: str, body: Graph, formal: Sequence[TensorType | None], n_out: int
) -> None:
    """The body takes ``formal`` then the captures (element types must agree) and gives ``n_out`` outputs."""
    caps = ctx.types[len(ctx.types) - ctx.attrs.captures :] if ctx.attrs.captures else []
    want = list(formal) + list(caps)
    if len(body.inputs) != len(want):
        raise ctx.fail(f"{label} takes {len(body.inputs)} inputs, the node binds {len(want)}")
    for i, (v, t) in enumerate(zip(body.inputs, want, strict=True)):
        if t is not None and v.type.dtype != t.dtype:
            raise ctx.fail(f"{label} input {i} ({v.name!r}) is {v.type}, the node feeds {t}")
    if len(body.outputs) != n_out:
        raise ctx.fail(f"{label} gives {len(body.outputs)} outputs, expected {n_out}")


def _infer_if(ctx: InferContext) -> list[TensorType]:
    a: IfAttrs = ctx.attrs
    if len(ctx.types) != 1 + a.captures:
        raise ctx.fail(f"{len(ctx.types)} inputs, expected the condition and {a.captures} captures")
    if ctx.type(0).dtype != DType.BOOL:
        raise ctx.fail(f"condition is {ctx.type(0)}, expected bool")
    _check_interface(ctx, "then_branch", a.then_branch, [], ctx.num_outputs)
    _check_interface(ctx, "else_branch", a.else_branch, [], ctx.num_outputs)
    pairs = zip(a.then_branch.outputs, a.else_branch.outputs, strict=True)
    try:
        return [union_type(t.type, e.type, f"output {i}") for i, (t, e) in enumerate(pairs)]
    except ValueError as exc:
        raise ctx.fail(f"the branches disagree: {exc}") from None


def loop_trip_count(m: np.ndarray | None, cond: np.ndarray | None, body: Graph) -> int | None:
    """The number of iterations a Loop runs when it is known before running (else None).

    Known when M is constant, the initial condition is absent or constant, and the body's
    condition output is the constant true or passes its condition input through (Identity).
    """
    if cond is not None and not bool(np.asarray(cond).reshape(-1)[0]):
        return 0
    if m is None:
        return None
    out = body.outputs[0]
    while out.producer.op == "Identity" and (src := body.inputs_of(out.producer)[0]) is not None:
        out = src
    producer = out.producer
    stays = (producer.op == CONSTANT_OP and bool(np.asarray(producer.attrs.value).reshape(-1)[0])) or (
        len(body.inputs) > 1 and out == body.inputs[1]
    )
    return max(int(np.asarray(m).reshape(-1)[0]), 0) if stays else None


def _infer_loop(ctx: InferContext) -> list[TensorType]:
    a: LoopAttrs = ctx.attrs
    n = len(ctx.types) - 2 - a.captures
    k = ctx.num_outputs - n
    if n < 0 or k < 0:
        raise ctx.fail(
            f"{len(ctx.types)} inputs and {ctx.num_outputs} outputs do not fit {a.captures} captures"
        )
    carried = [ctx.type(2 + i) for i in range(n)]
    iter_t, cond_t = TensorType(DType.INT64, ()), TensorType(DType.BOOL, ())
    _check_interface(ctx, "body", a.body, [iter_t, cond_t, *carried], 1 + ctx.num_outputs)
    trip = loop_trip_count(ctx.const(0) if ctx.has(0) else None, ctx.const(1) if ctx.has(1) else None, a.body)
    if (ctx.has(0) and ctx.const(0) is None) or (ctx.has(1) and ctx.const(1) is None):
        trip = None
    outs = a.body.outputs
    try:
        finals = [
            outs[1 + i].type if trip else union_type(carried[i], outs[1 + i].type, f"loop-carried {i}")
            for i in range(n)
        ]
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    scans = []
    for j in range(k):
        t = outs[1 + n + j].type
        scans.append(t.with_shape(None if t.shape is None else (UNKNOWN if trip is None else trip, *t.shape)))
    return finals + scans


@dataclass(frozen=True)
class ScanLayout:
    """A Scan node's counts and normalized axes/directions."""

    states: int
    scans: int
    outputs: int
    in_axes: tuple[int, ...]
    in_dirs: tuple[int, ...]
    out_axes: tuple[int, ...]
    out_dirs: tuple[int, ...]


def scan_layout(attrs: ScanAttrs, in_ranks: Sequence[int | None], num_outputs: int) -> ScanLayout:
    """Counts, axes (normalized where the rank is known; output axes against rank + 1) and directions."""
    m = attrs.num_scan_inputs
    n = len(in_ranks) - m - attrs.captures
    k = num_outputs - n
    if n < 0 or k < 0 or m < 1:
        raise ValueError(f"{len(in_ranks)} inputs, {num_outputs} outputs do not fit {m} scan inputs")
    in_axes = list(attrs.scan_input_axes or [0] * m)
    out_axes = list(attrs.scan_output_axes or [0] * k)
    in_dirs = tuple(attrs.scan_input_directions or [0] * m)
    out_dirs = tuple(attrs.scan_output_directions or [0] * k)
    if len(in_axes) != m or len(in_dirs) != m or len(out_axes) != k or len(out_dirs) != k:
        raise ValueError("scan axes/directions lists do not match the scan inputs and outputs")
    for j in range(m):
        r = in_ranks[n + j]
        if r is not None:
            in_axes[j] = normalize_axis(in_axes[j], r, "scan_input_axes")
    return ScanLayout(n, m, k, tuple(in_axes), in_dirs, tuple(out_axes), out_dirs)


def _infer_scan(ctx: InferContext) -> list[TensorType]:
    a: ScanAttrs = ctx.attrs
    try:
        lay = scan_layout(a, [None if t is None else t.rank for t in ctx.types], ctx.num_outputs)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    states = [ctx.type(i) for i in range(lay.states)]
    slices, length = [], None
    for j in range(lay.scans):
        t = ctx.type(lay.states + j)
        if t.shape is None:
            raise ctx.fail(f"scan input {j} has unknown rank")
        ax = lay.in_axes[j]
        d = t.shape[ax]
        if length is None or (isinstance(d, int) and not isinstance(length, int)):
            length = d
        elif isinstance(d, int) and d != length:
            raise ctx.fail(f"scan inputs disagree on the sequence length ({d} != {length})")
        slices.append(t.with_shape(t.shape[:ax] + t.shape[ax + 1 :]))
    _check_interface(ctx, "body", a.body, [*states, *slices], ctx.num_outputs)
    outs = a.body.outputs
    static = isinstance(length, int) and length > 0
    try:
        finals = [
            outs[i].type if static else union_type(states[i], outs[i].type, f"state {i}")
            for i in range(lay.states)
        ]
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    scans = []
    for j in range(lay.outputs):
        t = outs[lay.states + j].type
        if t.shape is None:
            scans.append(t)
            continue
        ax = normalize_axis(lay.out_axes[j], len(t.shape) + 1, "scan_output_axes")
        dim = length if length is not None else UNKNOWN
        scans.append(t.with_shape(t.shape[:ax] + (dim,) + t.shape[ax:]))
    return finals + scans


# -------------------------------------------------------------- evaluation
def _outputs(run: Runner, body: Graph, args: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    feeds = {v.name: a for v, a in zip(body.inputs, args, strict=True) if a is not None}
    res = run(body, feeds)
    return [np.asarray(res[v.name]) for v in body.outputs]


def _empty(t: TensorType, lead: tuple[int, ...] = (0,)) -> np.ndarray:
    shape = t.static_shape if t.is_static else ()
    return np.zeros(lead + shape, dtype=t.dtype.numpy)


def _eval_if(args: list[np.ndarray | None], a: IfAttrs, run: Runner) -> list[np.ndarray]:
    cond = bool(np.asarray(args[0]).reshape(-1)[0])
    return _outputs(run, a.then_branch if cond else a.else_branch, args[1:])


def _eval_loop(args: list[np.ndarray | None], a: LoopAttrs, n_out: int, run: Runner) -> list[np.ndarray]:
    n = len(args) - 2 - a.captures
    m, cond = args[0], args[1]
    trip = None if m is None else int(np.asarray(m).reshape(-1)[0])
    keep = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    carried, caps = list(args[2 : 2 + n]), list(args[2 + n :])
    scans: list[list[np.ndarray]] = [[] for _ in range(n_out - n)]
    i = 0
    while keep and (trip is None or i < trip):
        outs = _outputs(run, a.body, [np.asarray(i, np.int64), np.asarray(keep), *carried, *caps])
        keep = bool(outs[0].reshape(-1)[0])
        carried = list(outs[1 : 1 + n])
        for j, s in enumerate(scans):
            s.append(outs[1 + n + j])
        i += 1
    body_outs = a.body.outputs
    stacked = [np.stack(s) if s else _empty(body_outs[1 + n + j].type) for j, s in enumerate(scans)]
    return [np.asarray(c) for c in carried] + stacked


def _eval_scan(args: list[np.ndarray | None], a: ScanAttrs, n_out: int, run: Runner) -> list[np.ndarray]:
    lay = scan_layout(a, [None if x is None else np.ndim(x) for x in args], n_out)
    states = list(args[: lay.states])
    xs = [np.asarray(x) for x in args[lay.states : lay.states + lay.scans]]
    caps = list(args[lay.states + lay.scans :])
    length = xs[0].shape[lay.in_axes[0]]
    ys: list[list[np.ndarray]] = [[] for _ in range(lay.outputs)]
    for step in range(length):
        slices = [
            np.take(x, length - 1 - step if d else step, axis=ax)
            for x, ax, d in zip(xs, lay.in_axes, lay.in_dirs, strict=True)
        ]
        outs = _outputs(run, a.body, [*states, *slices, *caps])
        states = list(outs[: lay.states])
        for j, y in enumerate(ys):
            y.append(outs[lay.states + j])
    result = [np.asarray(s) for s in states]
    for j, y in enumerate(ys):
        t = a.body.outputs[lay.states + j].type
        if not y:
            result.append(_empty(t))
            continue
        ax = normalize_axis(lay.out_axes[j], y[0].ndim + 1, "scan_output_axes")
        result.append(np.stack(y[::-1] if lay.out_dirs[j] else y, axis=ax))
    return result


def evaluate(
    node: Node | str, args: list[np.ndarray | None], attrs: Any, num_outputs: int, run: Runner
) -> list[np.ndarray]:
    """Run one If, Loop or Scan on its input arrays, each body through ``run``."""
    op = node if isinstance(node, str) else node.op
    if op == "If":
        return _eval_if(args, attrs, run)
    if op == "Loop":
        return _eval_loop(args, attrs, num_outputs, run)
    if op == "Scan":
        return _eval_scan(args, attrs, num_outputs, run)
    raise ValueError(f"{op} is not a control-flow op")


def _reference(op: str) -> Callable[[list[np.ndarray | None], Any, int], list[np.ndarray]]:
    def ref(ins: list[np.ndarray | None], attrs: Any, n: int) -> list[np.ndarray]:
        from compiler.ir.interpreter import run_graph

        return evaluate(op, ins, attrs, n, run_graph)

    return ref


_DOCS = {
    "If": "then_branch(c) if cond else else_branch(c)",
    "Loop": "k, v, s_i = body(i, k, v, c) while i < M and k; outputs v, stacked s",
    "Scan": "s, y_t = body(s, x[t], c) along the scan axes; outputs s, stacked y",
}
for _op, _infer, _attrs, _min_in in (
    ("If", _infer_if, IfAttrs, 1),
    ("Loop", _infer_loop, LoopAttrs, 0),  # M and cond are optional: absent ones hold their ports
    ("Scan", _infer_scan, ScanAttrs, 1),
):
    register(
        OpDef(_op, _infer, _reference(_op), _attrs, inputs=(_min_in, -1), outputs=(1, -1), doc=_DOCS[_op])
    )
