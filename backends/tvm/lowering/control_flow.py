"""If with a condition known only at run time: both branches computed, the result selected.

``If(c, x) = then(x) if c else else(x)`` lowers to ``where(c, then(x), else(x))`` with each
branch's nodes emitted inline (their capture inputs bound to the outer values). That is exact
when both branches are pure and deterministic, give the same static shapes, and every node in
them has a TVM rule (recursively: an If inside a branch lowers the same way); it costs both
branches, so a branch of more than :data:`MAX_BRANCH_OPS` ops is refused instead. An If with a
constant condition never gets here: inline-constant-if folds it to its taken branch. Loop and
Scan have no rule (their trip counts and carried shapes would need real control flow).

An If with a dim known only at run time (a branch may give ``[0]``, the other ``[n]``) computes
both branches the same way, and each output is the taken branch's with its shape: ``c`` (the
condition, 0 or 1) becomes a symbolic dim and ``out = select(c, then, else)`` has the dims
``c·d_then + (1 - c)·d_else``. (A Relax ``If`` would run only the taken branch, but TVM 0.27's
StaticPlanBlockMemory shares storage across If branches: the VM then reads a storage the
untaken branch never allocated, and crashes.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from backends.tvm.lowering.table import LowerContext, capabilities, lowers, lowers_dynamic
from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node
from compiler.ops.registry import get_op

__all__ = ["MAX_BRANCH_OPS"]

MAX_BRANCH_OPS = 64
"""Ops a branch may hold for the compute-both lowering (each call pays for both branches)."""


def _branches(node: Node) -> tuple[tuple[str, Graph], ...]:
    return (("then_branch", node.attrs.then_branch), ("else_branch", node.attrs.else_branch))


def _branch_reason(label: str, body: Graph) -> str | None:
    """Why ``body`` cannot be computed unconditionally, or None."""
    ops = [n for n in body.nodes() if n.domain or n.op not in (INPUT_OP, CONSTANT_OP)]
    if len(ops) > MAX_BRANCH_OPS:
        return f"{label} has {len(ops)} ops (> {MAX_BRANCH_OPS}): computing both branches would be costly"
    table = capabilities()
    for n in ops:
        opdef = get_op(n.op, n.domain)
        if not (opdef.pure and opdef.deterministic):
            return f"{label} node {n.describe()} is not pure and deterministic: both branches cannot run"
        why = table.reason(body, n)
        if why is not None:
            return f"{label} node {n.describe()}: {why}"
    return None


def _if_reason(graph: Graph, node: Node) -> str | None:
    cond = graph.inputs_of(node)[0]
    assert cond is not None
    if cond.type.is_static and cond.type.numel != 1:
        return f"condition has {cond.type.numel} elements, expected 1"
    then_b, else_b = node.attrs.then_branch, node.attrs.else_branch
    for i, (t, e) in enumerate(zip(then_b.outputs, else_b.outputs, strict=True)):
        if t.type.shape != e.type.shape:
            return f"output {i}: the branches give shapes {t.type.shape} and {e.type.shape}"
    for label, body in _branches(node):
        why = _branch_reason(label, body)
        if why is not None:
            return why
    return None


@lowers("If", check=_if_reason)
def _if(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    from tvm import relax

    from backends.tvm.lower import lower_body

    op = relax.op
    caps = [x for x in ins[1:] if x is not None]
    results = []
    for _, body in _branches(node):
        sub = dataclasses.replace(ctx, graph=body)  # same builder, kernels and kernel log
        results.append(lower_body(sub, caps))
    cond = ctx.emit(op.reshape(ins[0], ()))
    return [ctx.emit(op.where(cond, t, e)) for t, e in zip(*results, strict=True)]


def _dynamic_if_reason(graph: Graph, node: Node) -> str | None:
    cond = graph.inputs_of(node)[0]
    assert cond is not None
    if cond.type.is_static and cond.type.numel != 1:
        return f"condition has {cond.type.numel} elements, expected 1"
    then_b, else_b = node.attrs.then_branch, node.attrs.else_branch
    for i, (t, e) in enumerate(zip(then_b.outputs, else_b.outputs, strict=True)):
        if t.type.rank != e.type.rank or t.type.rank is None:
            return f"output {i}: the branches give ranks {t.type.rank} and {e.type.rank}"
    for label, body in _branches(node):
        why = _branch_reason(label, body)
        if why is not None:
            return why
    return None


def select_te(c: Any, t: Any, e: Any, dims: list[Any]) -> Any:
    """out[i] = t[i] if c else e[i], of the chosen one's shape (only that one is read)."""
    from tvm import te, tirx

    return te.compute(dims, lambda *i: tirx.if_then_else(c != 0, t[i], e[i]), name="kiln_select")


@lowers_dynamic("If", check=_dynamic_if_reason)
def _dynamic_if(ctx: LowerContext, node: Node, ins: list[Any]) -> list[Any]:
    """Both branches computed; each output is the taken branch's, with the shape
    ``c·then + (1 - c)·else`` (c in {0, 1} read at run time as a symbolic dim)."""
    from tvm import relax

    from backends.tvm.dynamic_shapes import conform, define_length, relax_shape
    from backends.tvm.lower import lower_body

    op = relax.op
    caps = [x for x in ins[1:] if x is not None]
    results = []
    for _, body in _branches(node):
        outs = lower_body(dataclasses.replace(ctx, graph=body), caps)
        results.append([conform(ctx, x, v.type) for x, v in zip(outs, body.outputs, strict=True)])
    flag = ctx.emit(op.reshape(op.astype(op.astype(ins[0], "bool"), "int64"), (1,)))
    c = define_length(ctx, flag, "c")
    outs = []
    for t, e in zip(*results, strict=True):
        dt, de = relax_shape(t), relax_shape(e)
        assert dt is not None and de is not None
        dims = [c * a + (1 - c) * b for a, b in zip(dt, de, strict=True)]
        outs.append(ctx.bb.emit_te(select_te, c, t, e, dims, primfunc_name_hint="kiln_select"))
    return outs
