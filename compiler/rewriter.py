"""The rewriter: the one place passes edit graphs through, and what counts changes.

A :class:`Rewriter` listens to every edit the Graph makes while it is active,
so "what changed" is counted from the edits themselves, never from flags a pass
keeps by hand.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Node, Value

__all__ = ["Rewriter", "PassResult"]


@dataclass
class PassResult:
    """What a pass did: edit counts by kind and per-rule application counts."""

    edits: Counter[str] = field(default_factory=Counter)
    applied: Counter[str] = field(default_factory=Counter)

    @property
    def changed(self) -> bool:
        """True if the graph was edited at all."""
        return sum(self.edits.values()) > 0

    def merge(self, other: PassResult) -> None:
        """Accumulate another result into this one."""
        self.edits.update(other.edits)
        self.applied.update(other.applied)

    def summary(self) -> str:
        """Short text, e.g. ``fold-bn x35; add 35, remove 70``."""
        rules = ", ".join(f"{k} x{v}" for k, v in sorted(self.applied.items()))
        edits = ", ".join(f"{k} {v}" for k, v in sorted(self.edits.items()))
        return "; ".join(p for p in (rules, edits) if p) or "no change"


class Rewriter:
    """Edit a graph and count the edits; use as a context manager or call ``close``."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.result = PassResult()
        graph.add_listener(self._on_edit)
        self._open = True

    def _on_edit(self, event: str, node: Node) -> None:
        self.result.edits[event] += 1

    def close(self) -> PassResult:
        """Stop listening and return the counts."""
        if self._open:
            self.graph.remove_listener(self._on_edit)
            self._open = False
        return self.result

    def __enter__(self) -> Rewriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def applied(self, rule: str) -> None:
        """Record one application of a named rule."""
        self.result.applied[rule] += 1

    # -- edit helpers ------------------------------------------------------------
    def op(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Any = None,
        *,
        like: Node | None = None,
        domain: str = "",
        num_outputs: int | None = None,
        name: str = "",
    ) -> Value:
        """Add a node and return its first output; ``like`` names it after a source node."""
        nm = name or (like.name if like is not None else "")
        node = self.graph.add_node(op, inputs, attrs, domain=domain, name=nm, num_outputs=num_outputs)
        return self.graph.value(node)

    def const(self, array: np.ndarray, name: str = "const") -> Value:
        """Add a constant."""
        return self.graph.add_constant(array, name)

    def replace(self, old: Value, new: Value, *, take_name: bool = False) -> None:
        """Replace every use of ``old`` by ``new`` and delete what became dead.

        ``take_name`` gives ``new`` (a value the rewrite just created) the old
        value's name once that is free, so the IR stays diffable.
        """
        old_name = old.name
        producer = old.producer
        self.graph.replace_all_uses(old, new)
        self.erase_dead(producer)
        if take_name and new.name != old_name and not self.graph.has_name(old_name):
            self.graph.rename(new, old_name)

    def replace_node(self, node: Node, new: Sequence[Value], *, take_name: bool = True) -> None:
        """Replace every output of ``node`` by the matching value of ``new``."""
        olds = self.graph.outputs_of(node)
        names = [v.name for v in olds]
        for old, nv in zip(olds, new, strict=True):
            self.graph.replace_all_uses(old, nv)
        self.erase_dead(node)
        if take_name:
            for nm, nv in zip(names, new, strict=True):
                if nv.name != nm and not self.graph.has_name(nm) and nv.producer.op != "Input":
                    self.graph.rename(nv, nm)

    def erase_dead(self, node: Node) -> None:
        """Remove ``node`` if unused, then its inputs' producers that became unused."""
        stack = [node]
        while stack:
            n = stack.pop()
            if not self.graph.has_node(n.id) or self.graph.has_users(n) or n.op == "Input":
                continue
            preds = [v.producer for v in self.graph.inputs_of(n) if v is not None]
            self.graph.remove(n)
            stack.extend(preds)
