"""Kiln IR -> Relax: one ``main`` function whose body is the graph, node by node.

Parameters are the graph inputs (in order), the result is the single output or a
tuple of outputs. Every op goes through the capability table: ops without a rule,
and nodes its checks refuse (with the reason), are reported together, each with
its node names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.tvm.lowering.table import LowerContext, Rule, capabilities, rule_for
from compiler.errors import UnsupportedOpsError
from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph

if TYPE_CHECKING:
    from backends.tvm.target import TargetSpec
    from compiler.backend import CapabilityTable

__all__ = ["LoweredModule", "lower_graph", "lower_body"]


@dataclass(frozen=True)
class LoweredModule:
    """The Relax module plus what the lowering decided (kernels used, for the manifest)."""

    mod: Any  # tvm.IRModule
    kernels: list[dict[str, Any]]


def _unsupported(graph: Graph, table: CapabilityTable[Rule]) -> dict[str, list[str]]:
    """Node names by op (``"Op (reason)"`` for nodes a check refuses)."""
    missing: dict[str, list[str]] = {}
    for node in graph.nodes():
        why = table.reason(graph, node)
        if why is not None:
            plain = node.qualified_op not in table and why == f"no {table.backend} lowering"
            key = node.qualified_op if plain else f"{node.qualified_op} ({why})"
            missing.setdefault(key, []).append(node.name or node.output_names[0])
    return missing


def lower_graph(
    graph: Graph, target: TargetSpec, source: str = "model", on_node: Callable[[], None] | None = None
) -> LoweredModule:
    """Lower a verified graph to a Relax IRModule (``on_node`` ticks per node); dims known only at
    run time become symbolic dims (:mod:`backends.tvm.dynamic_shapes`)."""
    from tvm import relax

    table = capabilities()
    missing = _unsupported(graph, table)
    if missing:
        raise UnsupportedOpsError(f"{source} (--target {target.name})", missing)
    from backends.tvm.dynamic_shapes import graph_is_dynamic, relax_type, split_at_shape_definitions

    bb = relax.BlockBuilder()
    ctx = LowerContext(bb, graph, target)
    params = [relax.Var(v.name, relax_type(v.type)) for v in graph.inputs]
    if not graph_is_dynamic(graph):
        with bb.function("main", params):
            with bb.dataflow():
                results = lower_body(ctx, list(params), on_node)
                out = bb.emit_output(results[0] if len(results) == 1 else relax.Tuple(results))
            bb.emit_func_output(out)
        return LoweredModule(bb.get(), ctx.kernel_log)
    # run-time dims: built without dataflow, then split at every dim definition (see dynamic_shapes)
    with bb.function("main", params):
        results = lower_body(ctx, list(params), on_node)
        bb.emit_func_output(results[0] if len(results) == 1 else relax.Tuple(results))
    mod = bb.get()
    mod["main"] = split_at_shape_definitions(mod["main"])
    return LoweredModule(relax.transform.CanonicalizeBindings()(mod), ctx.kernel_log)


def lower_body(ctx: LowerContext, inputs: list[Any], on_node: Callable[[], None] | None = None) -> list[Any]:
    """Emit ``ctx.graph``'s nodes with its inputs bound to the Relax ``inputs``; its outputs.

    Also lowers a control-flow body in place (``ctx`` then holds the subgraph): the caller has
    checked every node against the table.
    """
    from backends.tvm.dynamic_shapes import conform, is_dynamic
    from backends.tvm.lowering.shape_values import track_values

    graph = ctx.graph
    env: dict[tuple[int, int], Any] = {}
    for v, p in zip(graph.inputs, inputs, strict=True):
        env[(v.node, v.port)] = p
    for node in graph.nodes():
        if node.domain == "" and node.op == INPUT_OP:
            continue
        if node.domain == "" and node.op == CONSTANT_OP:
            env[(node.id, 0)] = ctx.const(node.attrs.value)
            continue
        ins = [None if v is None else env[(v.node, v.port)] for v in graph.inputs_of(node)]
        outs = rule_for(graph, node)(ctx, node, ins)
        if is_dynamic(graph, node):
            outs = [conform(ctx, x, t) for x, t in zip(outs, node.output_types, strict=True)]
        track_values(ctx, node, ins, outs)
        for port, expr in enumerate(outs):
            env[(node.id, port)] = expr
        if on_node is not None:
            on_node()
    return [env[(v.node, v.port)] for v in graph.outputs]
