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

from backends.tvm.lowering.table import LowerContext, Rule, capabilities
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
    """Lower a verified, statically shaped graph to a Relax IRModule (``on_node`` ticks per node)."""
    from tvm import relax

    table = capabilities()
    missing = _unsupported(graph, table)
    if missing:
        raise UnsupportedOpsError(f"{source} (--target {target.name})", missing)
    bb = relax.BlockBuilder()
    ctx = LowerContext(bb, graph, target)
    params = []
    for v in graph.inputs:
        t = v.type
        params.append(
            relax.Var(v.name, relax.TensorType([int(d) for d in t.shape or ()], t.dtype.numpy.name))
        )
    with bb.function("main", params):
        with bb.dataflow():
            results = lower_body(ctx, list(params), on_node)
            out = bb.emit_output(results[0] if len(results) == 1 else relax.Tuple(results))
        bb.emit_func_output(out)
    return LoweredModule(bb.get(), ctx.kernel_log)


def lower_body(ctx: LowerContext, inputs: list[Any], on_node: Callable[[], None] | None = None) -> list[Any]:
    """Emit ``ctx.graph``'s nodes with its inputs bound to the Relax ``inputs``; its outputs.

    Also lowers a control-flow body in place (``ctx`` then holds the subgraph): the caller has
    checked every node against the table.
    """
    graph, table = ctx.graph, capabilities()
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
        outs = table.lower_for(node.qualified_op)(ctx, node, ins)
        for port, expr in enumerate(outs):
            env[(node.id, port)] = expr
        if on_node is not None:
            on_node()
    return [env[(v.node, v.port)] for v in graph.outputs]
