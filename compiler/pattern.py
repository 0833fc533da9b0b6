"""Pattern rewrite rules: (pattern, check, rewrite).

A pattern is a tree of :class:`Op` nodes whose leaves are :class:`Any_`
(any value) or :class:`Const` (a constant value). Interior values must have a
single user (they disappear in the rewrite) unless ``shared=True``. A rule's
``check`` returns ``None`` to accept a match or a reason string to reject it;
rejections are recorded as near-misses so a test or a user can ask why a rule
did not fire.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import blame_node
from compiler.ir.graph import Graph, Node, Value
from compiler.rewriter import PassResult, Rewriter

__all__ = ["Op", "Any_", "Const", "Match", "Rule", "apply_rules", "NearMiss"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Any_:
    """Matches any value (or an absent optional input with ``optional=True``)."""

    name: str
    optional: bool = False


@dataclass(frozen=True)
class Const:
    """Matches a constant value (or an absent optional input with ``optional=True``)."""

    name: str
    optional: bool = False


@dataclass(frozen=True)
class Op:
    """Matches a node of one of ``ops`` whose inputs match ``inputs`` (prefix; ``None`` = any).

    ``commutative`` also tries the first two inputs swapped; ``shared`` lets the
    node's output have other users (it is not removed by the rewrite).
    """

    ops: str | tuple[str, ...]
    inputs: tuple[Op | Any_ | Const, ...] | None = None
    name: str = ""
    domain: str = ""
    commutative: bool = False
    shared: bool = False

    def op_names(self) -> tuple[str, ...]:
        """The op names this pattern node accepts."""
        return (self.ops,) if isinstance(self.ops, str) else self.ops


@dataclass
class Match:
    """Bindings of a successful structural match."""

    root: Node
    nodes: dict[str, Node] = field(default_factory=dict)
    values: dict[str, Value | None] = field(default_factory=dict)
    consts: dict[str, np.ndarray | None] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        """A bound node."""
        return self.nodes[name]

    def value(self, name: str) -> Value:
        """A bound (present) value."""
        v = self.values[name]
        assert v is not None, name
        return v

    def const(self, name: str) -> np.ndarray | None:
        """A bound constant's array (None if the optional input was absent)."""
        return self.consts.get(name)


@dataclass(frozen=True)
class NearMiss:
    """A match that a rule's check rejected, with the reason."""

    rule: str
    node: str
    reason: str


class Rule:
    """Subclass and set ``name`` and ``pattern``; override ``check`` and ``rewrite``."""

    name: str = ""
    pattern: Op

    def check(self, graph: Graph, m: Match) -> str | None:
        """None to accept the match, else the reason it is rejected."""
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        """Edit the graph through ``rw``; the root's outputs must be replaced."""
        raise NotImplementedError


class OpMismatch(str):
    """A structural failure where a value's producer is simply another op (not worth reporting)."""

    __slots__ = ()


def _match(graph: Graph, pat: Op | Any_ | Const, value: Value | None, m: Match, root: bool) -> str | None:
    """Bind ``pat`` to ``value``; return None on success or why it failed."""
    if value is None:
        if isinstance(pat, Any_ | Const) and pat.optional:
            m.values[pat.name] = None
            if isinstance(pat, Const):
                m.consts[pat.name] = None
            return None
        return f"input {getattr(pat, 'name', '?')!r} is absent"
    if isinstance(pat, Any_):
        prev = m.values.get(pat.name)
        if prev is not None and prev != value:
            return f"{pat.name!r} bound to two different values"
        m.values[pat.name] = value
        return None
    if isinstance(pat, Const):
        arr = value.const
        if arr is None:
            return f"{value.name!r} is not a constant"
        m.values[pat.name] = value
        m.consts[pat.name] = arr
        return None
    node = value.producer
    if node.op not in pat.op_names() or node.domain != pat.domain:
        return OpMismatch(
            f"{value.name!r} is produced by {node.qualified_op}, not {'/'.join(pat.op_names())}"
        )
    if not root and not pat.shared and (len(graph.users(value)) != 1 or graph.is_output(value)):
        return f"{value.name!r} has other users"
    if pat.name:
        m.nodes[pat.name] = node
        m.values[pat.name] = value
    if pat.inputs is None:
        return None
    ins = graph.inputs_of(node)
    orders = [list(range(len(pat.inputs)))]
    if pat.commutative and len(pat.inputs) >= 2:
        orders.append([1, 0, *range(2, len(pat.inputs))])
    reason = None
    for order in orders:
        trial = Match(m.root, dict(m.nodes), dict(m.values), dict(m.consts))
        reason = None
        for pi, ii in enumerate(order):
            sub = pat.inputs[pi]
            v = ins[ii] if ii < len(ins) else None
            reason = _match(graph, sub, v, trial, False)
            if reason:
                break
        if reason is None:
            m.nodes, m.values, m.consts = trial.nodes, trial.values, trial.consts
            return None
    return reason


def match(graph: Graph, pattern: Op, node: Node) -> Match | str:
    """Match ``pattern`` rooted at ``node``; a Match, or the reason it failed."""
    m = Match(node)
    if node.num_outputs == 0:
        return "node has no outputs"
    reason = _match(graph, pattern, graph.value(node, 0), m, True)
    return reason if reason is not None else m


def apply_rules(
    graph: Graph, rules: Sequence[Rule], *, max_rounds: int = 16, near_misses: list[NearMiss] | None = None
) -> PassResult:
    """Apply rules greedily in topological order until none fires (at most ``max_rounds`` sweeps)."""
    by_op: dict[str, list[Rule]] = {}
    for r in rules:
        for op in r.pattern.op_names():
            by_op.setdefault(op, []).append(r)
    with Rewriter(graph) as rw:
        for _ in range(max_rounds):
            fired = False
            for node in graph.nodes():
                if not graph.has_node(node.id):
                    continue
                try:
                    fired = _apply_first(graph, rw, by_op.get(node.op, []), node, near_misses) or fired
                except Exception as exc:
                    blame_node(exc, node.describe())  # the CLI's internal-error line names the node
                    raise
            if not fired:
                break
        else:
            log.warning("rules %s did not converge in %d rounds", [r.name for r in rules], max_rounds)
    return rw.result


def _apply_first(
    graph: Graph, rw: Rewriter, rules: Sequence[Rule], node: Node, near_misses: list[NearMiss] | None
) -> bool:
    """Apply the first of ``rules`` that matches at ``node`` and passes its check; True if one did."""
    for rule in rules:
        m = match(graph, rule.pattern, node)
        reason = m if isinstance(m, str) else rule.check(graph, m)
        if reason is not None:
            if near_misses is not None and not isinstance(reason, OpMismatch):
                miss = NearMiss(rule.name, node.name or node.output_names[0], reason)
                if miss not in near_misses:
                    near_misses.append(miss)
            continue
        assert isinstance(m, Match)
        rule.rewrite(rw, m)
        rw.applied(rule.name)
        return True
    return False


def scalar(arr: np.ndarray | None) -> Any:
    """The single value of a size-1 array, else None."""
    if arr is None or arr.size != 1:
        return None
    return arr.reshape(()).item()
