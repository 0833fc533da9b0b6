"""If, Loop and Scan (opset 9+ form): their subgraphs become Kiln graphs the node owns.

Outer values a subgraph reads become explicit captures (:mod:`frontends.onnx.subgraphs`).
A Loop's or Scan's loop-carried inputs are typed by a fixed point: the body is imported with
the initial values' types, and re-imported with the union of those and the body's outputs
(dims that change across iterations become unknown) until the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from compiler.errors import ConversionError
from compiler.ir.graph import Graph, GraphError, Value
from compiler.ir.subgraphs import inline_graph
from compiler.ir.types import DType, TensorType
from compiler.ops.control_flow import IfAttrs, LoopAttrs, ScanAttrs, scan_layout, union_type
from compiler.ops.registry import ShapeError
from frontends.onnx.converter import NodeContext, converter
from frontends.onnx.folding import fold

__all__: list[str] = []

_FIXED_POINT_ROUNDS = 4


def _emit(ctx: NodeContext, op: str, ins: Sequence[Value | None], attrs: Any, n_out: int) -> list[Value]:
    """Add the control-flow node (inputs kept as given: Loop's absent M and cond hold their ports)."""
    from compiler.ops.registry import get_op, infer_node_types

    names = ctx._output_names(op, n_out, True)
    opdef = get_op(op)
    try:
        types = infer_node_types(opdef, attrs, list(ins), n_out, where=ctx.name or op)
        folded = fold(opdef, attrs, list(ins), types, ctx.where) if ctx.fold else None
    except (ShapeError, GraphError, ValueError) as exc:
        raise ctx.fail(f"{op} conversion failed: {exc}") from exc
    if folded is not None:
        return [ctx.graph.add_constant(a, name=nm) for a, nm in zip(folded, names, strict=True)]
    node = ctx.graph.add_node(op, list(ins), attrs, name=ctx.name, output_names=names, output_types=types)
    return ctx.graph.outputs_of(node)


def _carried_body(
    ctx: NodeContext,
    proto: onnx.GraphProto,
    head: list[TensorType],
    carried: list[TensorType],
    tail: list[TensorType],
    captures: list[tuple[str, Value]],
    first_out: int,
) -> Graph:
    """Import a body whose inputs ``head + carried + tail`` feed carried outputs from ``first_out`` on."""
    for _ in range(_FIXED_POINT_ROUNDS):
        body = ctx.scope.subgraph(proto, [*head, *carried, *tail], captures, "body")
        outs = body.outputs[first_out : first_out + len(carried)]
        if len(outs) != len(carried):
            raise ctx.fail(f"body gives {len(body.outputs)} outputs, too few for {len(carried)} carried")
        try:
            pairs = enumerate(zip(carried, outs, strict=True))
            wider = [union_type(c, o.type, f"loop-carried value {i}") for i, (c, o) in pairs]
        except ValueError as exc:
            raise ctx.fail(str(exc)) from None
        if wider == carried:
            return body
        carried = wider
    raise ctx.fail(f"the loop-carried types did not settle in {_FIXED_POINT_ROUNDS} rounds")


@converter("If", since=1)
def if_(ctx: NodeContext) -> list[Value]:
    """If: both branches read the union of their captures, in one order.

    With a constant condition, only the taken branch is imported (inlined) when the untaken one
    does not even type-check (AffineGrid's function body splits its size 4 or 5 ways, by rank) or
    when the union of the two branches' types would lose what the taken branch knows (downstream
    shape-dependent ops then need its exact types); otherwise the If stays and inline-constant-if
    folds it.
    """
    branches = [ctx.pop("then_branch"), ctx.pop("else_branch")]
    if any(not isinstance(b, onnx.GraphProto) for b in branches):
        raise ctx.fail("then_branch and else_branch must be graph attributes")
    labels = ("then_branch", "else_branch")
    cond = ctx.const(0)
    caps = ctx.scope.captures(branches)
    constant = cond is not None and cond.size == 1
    try:
        then_g, else_g = (ctx.scope.subgraph(p, [], caps, nm) for p, nm in zip(branches, labels, strict=True))
    except (ShapeError, GraphError, ValueError, ConversionError):
        if not constant:
            raise
        return _taken_branch(ctx, branches, labels, bool(np.asarray(cond).reshape(-1)[0]))
    if constant and any(t.type != e.type for t, e in zip(then_g.outputs, else_g.outputs, strict=True)):
        return _taken_branch(ctx, branches, labels, bool(np.asarray(cond).reshape(-1)[0]))
    attrs = IfAttrs(then_g, else_g, captures=len(caps))
    return _emit(ctx, "If", [ctx.require(0), *(v for _, v in caps)], attrs, len(branches[0].output))


def _taken_branch(
    ctx: NodeContext, branches: list[onnx.GraphProto], labels: tuple[str, str], taken: bool
) -> list[Value]:
    """An If with a constant condition: its taken branch inlined, each output an Identity of the
    ONNX output's name (AffineGrid's function body splits its size 4 or 5 ways, by its rank)."""
    i = 0 if taken else 1
    caps = ctx.scope.captures([branches[i]])
    sub = ctx.scope.subgraph(branches[i], [], caps, labels[i])
    try:
        outs = inline_graph(ctx.graph, sub, [v for _, v in caps], scope=f"{ctx.name}/" if ctx.name else "")
    except (ShapeError, GraphError, ValueError) as exc:
        raise ctx.fail(f"If conversion failed: {exc}") from exc
    from compiler.ops.registry import get_op

    names = ctx._output_names("If", len(outs), True)
    result = []
    for j, (v, name) in enumerate(zip(outs, names, strict=True)):
        if v.const is not None:
            result.append(ctx.graph.add_constant(v.const, name=name))
            continue
        node_name = f"{ctx.name}/out{j}" if ctx.name else ""
        attrs = get_op("Identity").make_attrs(None)
        node = ctx.graph.add_node(
            "Identity", [v], attrs, name=node_name, output_names=[name], output_types=[v.type]
        )
        result.append(ctx.graph.outputs_of(node)[0])
    return result


@converter("Loop", since=1)
def loop(ctx: NodeContext) -> list[Value]:
    """Loop(M, cond, v_initial...): the body is typed (i64 iteration, bool condition, carried values)."""
    proto = ctx.pop("body")
    caps = ctx.scope.captures([proto])
    carried_in = [ctx.require(i) for i in range(2, len(ctx.inputs))]
    cond = ctx.input(1)
    head = [TensorType(DType.INT64, ()), cond.type if cond is not None else TensorType(DType.BOOL, ())]
    body = _carried_body(ctx, proto, head, [v.type for v in carried_in], [], caps, 1)
    ins = [ctx.input(0), cond, *carried_in, *(v for _, v in caps)]
    return _emit(ctx, "Loop", ins, LoopAttrs(body, captures=len(caps)), len(proto.output) - 1)


@converter("Scan", since=9)
def scan(ctx: NodeContext) -> list[Value]:
    """Scan (opset 9+): state inputs, then scan inputs sliced along their scan axes."""
    proto = ctx.pop("body")
    names = [k for k in ctx.attrs if k.startswith("scan_") or k == "num_scan_inputs"]
    attrs: dict[str, Any] = {k: ctx.pop(k) for k in names}
    if "num_scan_inputs" not in attrs:
        raise ctx.fail("attribute num_scan_inputs is missing")
    m = int(attrs["num_scan_inputs"])
    ins = [ctx.require(i) for i in range(len(ctx.inputs))]
    n_out = len(proto.output)
    probe = ScanAttrs(Graph("probe"), **attrs)
    try:
        lay = scan_layout(probe, [v.type.rank for v in ins], n_out)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    slices = []
    for j in range(m):
        t = ins[lay.states + j].type
        if t.shape is None:
            raise ctx.fail(f"scan input {j} has unknown rank")
        ax = lay.in_axes[j]
        slices.append(t.with_shape(t.shape[:ax] + t.shape[ax + 1 :]))
    caps = ctx.scope.captures([proto])
    body = _carried_body(ctx, proto, [], [v.type for v in ins[: lay.states]], slices, caps, 0)
    try:
        kiln_attrs = ScanAttrs(body, **attrs, captures=len(caps))
    except TypeError as exc:
        raise ConversionError(f"{ctx.where}: {exc}") from None
    return _emit(ctx, "Scan", [*ins, *(v for _, v in caps)], kiln_attrs, n_out)
