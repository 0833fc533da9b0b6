"""Preflight: check the legalized graph against every requested backend before any real work.

For each requested artifact (``--emit mnn``, ``--target cpu``, ...) the optimized graph is
cloned and run through that backend's legalization pipeline (decompositions included), and every
node is asked of the backend's :class:`~compiler.backend.CapabilityTable`. All gaps of all
backends are reported together, in one :class:`CapabilityError`, before calibration or any emit
has run: a user learns at once that MNN lacks X and CANN lacks Y, not one node at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compiler.errors import KilnError
from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node

if TYPE_CHECKING:
    from compiler.backend import CapabilityTable, Request
    from compiler.instruments import Instrument
    from compiler.options import CompileOptions
    from compiler.pass_infra import PassContext

__all__ = ["Gap", "CapabilityError", "find_gaps", "legalize", "preflight", "walk_nodes"]

_SHOWN_NODES = 4


@dataclass(frozen=True)
class Gap:
    """One thing a backend cannot write: the op, the nodes that use it and the backend's reason."""

    backend: str
    op: str
    reason: str
    nodes: tuple[str, ...]

    def describe(self) -> str:
        """``mnn: LSTM (nodes 'a', 'b'): no mnn lowering``."""
        shown = ", ".join(repr(n) for n in self.nodes[:_SHOWN_NODES])
        more = f" and {len(self.nodes) - _SHOWN_NODES} more" if len(self.nodes) > _SHOWN_NODES else ""
        noun = "nodes" if len(self.nodes) > 1 else "node"
        return f"{self.backend}: {self.op} ({noun} {shown}{more}): {self.reason}"


class CapabilityError(KilnError):
    """Some requested backend cannot write some nodes; lists every (backend, op, nodes, reason)."""

    def __init__(self, source: str, gaps: Sequence[Gap]) -> None:
        self.gaps = list(gaps)
        backends = sorted({g.backend for g in gaps})
        super().__init__(
            f"{source}: {len(gaps)} unsupported op(s) for {', '.join(backends)}: "
            + "; ".join(g.describe() for g in gaps)
        )


def walk_nodes(graph: Graph) -> Iterator[tuple[Graph, Node]]:
    """Every (graph, node) pair, the nodes of subgraphs a node owns included (depth first)."""
    for node in graph.nodes():
        yield graph, node
        for sub in getattr(node, "subgraphs", ()) or ():
            yield from walk_nodes(sub)


def find_gaps(
    graph: Graph, table: CapabilityTable[Any], label: str, not_decomposed: Mapping[str, str] | None = None
) -> list[Gap]:
    """The gaps of one backend table on a (legalized) graph, grouped by (op, reason).

    ``not_decomposed`` maps a node's description to why no decomposition applied to it (the
    decompose pass's near misses); that reason is added to the backend's own.
    """
    grouped: dict[tuple[str, str], list[str]] = {}
    for g, node in walk_nodes(graph):
        if node.op in (INPUT_OP, CONSTANT_OP) and not node.domain:
            continue
        why = table.reason(g, node)
        if why is not None:
            extra = (not_decomposed or {}).get(node.describe())
            if extra:
                why = f"{why}; not decomposed ({extra})"
            grouped.setdefault((node.qualified_op, why), []).append(node.name or node.output_names[0])
    return [Gap(label, op, why, tuple(names)) for (op, why), names in sorted(grouped.items())]


def legalize(
    graph: Graph,
    request: Request,
    options: CompileOptions | None,
    instruments: Sequence[Instrument] = (),
    *,
    preflight: bool = False,
) -> tuple[Graph, PassContext]:
    """A clone of ``graph`` after ``request``'s legalization pipeline (under the PassManager), and
    the context it ran in (the backend's emit reads its options and state from it)."""
    from compiler.pass_infra import PassContext
    from compiler.pass_manager import PassManager

    g = graph.clone()
    ctx = PassContext(verify_each=True, options=options, preflight=preflight)
    items = request.backend.legalization(request.target, options)
    if items:
        PassManager(items, ctx, list(instruments)).run(g)
    return g, ctx


def preflight(graph: Graph, requests: Sequence[Request], options: CompileOptions | None, source: str) -> None:
    """Raise one CapabilityError listing every gap of every request, or return when there is none."""
    gaps: list[Gap] = []
    for req in requests:
        legal, ctx = legalize(graph, req, options, preflight=True)
        refused = {m.node: m.reason for m in ctx.near_misses if m.rule == "decompose"}
        gaps.extend(find_gaps(legal, req.backend.capabilities(req.target), req.label, refused))
    if gaps:
        raise CapabilityError(source, gaps)
