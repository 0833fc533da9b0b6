"""The decomposition library: exact rewrites of an op into other ops, as data.

A :class:`Decomposition` says which op it rewrites, which ops it ``produces``, when it
applies (``check``: a reason or None) and how (``rewrite``). Rules live one module per
op family (``normalization``, ``norms``, ``activations``, ``smooth_activations``, ``thresholds``,
``attention``, ``reductions``, ``tensor``, ``space_depth``, ``trilu``, ``einsum``, ``spatial``,
``logic``, ``trig``, ``cast_like``, ``static_values``, ``weight_only``, ``indexing``,
``compress``) and
register into :data:`DECOMPOSITIONS`. Every rule is exact in real arithmetic; its
docstring states the math and its check refuses the cases where it is not.

:func:`decomposed_support` answers, per op and without a graph, whether a backend can
write an op through decompositions whose produced ops it has natively (recursively);
:func:`choose_decomposition` answers the same for one node, checks included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compiler.backend import CapabilityTable
from compiler.ir.graph import Graph, Node
from compiler.rewriter import Rewriter

__all__ = [
    "DECOMPOSITIONS",
    "MAX_DEPTH",
    "Decomposition",
    "choose_decomposition",
    "decomposed_support",
    "decompositions_for",
    "register_decomposition",
]

MAX_DEPTH = 4
"""How many levels of decomposition :func:`decomposed_support` follows (rule -> produced op -> rule...)."""

CheckFn = Callable[[Graph, Node], "str | None"]
RewriteFn = Callable[[Rewriter, Graph, Node], None]


@dataclass(frozen=True)
class Decomposition:
    """One exact rewrite of ``op`` (qualified name) into the ops in ``produces``.

    ``check(graph, node)`` returns None when the rewrite is exact for ``node``, else why
    not; ``rewrite(rw, graph, node)`` replaces every used output of ``node`` through ``rw``.
    ``native`` lists produced ops that must have a native entry: the nodes the rule makes
    would fail the checks of those ops' own decompositions (e.g. a Where of a non-constant x,
    which where-affine refuses).
    """

    name: str
    op: str
    produces: tuple[str, ...]
    check: CheckFn
    rewrite: RewriteFn
    doc: str = ""
    native: tuple[str, ...] = ()


DECOMPOSITIONS: dict[str, list[Decomposition]] = {}
"""Qualified op -> its decompositions, in priority order (tried first to last)."""


def register_decomposition(rule: Decomposition) -> Decomposition:
    """Add ``rule`` to :data:`DECOMPOSITIONS` (after the op's existing rules)."""
    rules = DECOMPOSITIONS.setdefault(rule.op, [])
    if any(r.name == rule.name for r in rules):
        raise ValueError(f"decomposition {rule.name!r} of {rule.op} registered twice")
    rules.append(rule)
    return rule


def decompositions_for(op: str) -> list[Decomposition]:
    """The decompositions of a qualified op (``"LayerNormalization"``, ``"kiln::Relu6"``), maybe []."""
    _ensure_loaded()
    return list(DECOMPOSITIONS.get(op, ()))


def decomposed_support(
    table: CapabilityTable[object], op: str, *, max_depth: int = MAX_DEPTH
) -> list[Decomposition] | str:
    """Whether ``table``'s backend can write ``op``, natively or through decompositions.

    Returns ``[]`` when ``op`` has a native entry; else the plan: the first rule of ``op``
    whose produced ops are all writable, followed by the rules that make its non-native
    produced ops writable (depth first, each op once, at most ``max_depth`` levels).
    Returns a reason string when there is no such plan (it does not repeat that the op has
    no native lowering). This is an op-level answer:
    a rule's per-node check (static shapes, constant operands...) may still refuse a
    node, which :func:`choose_decomposition` reports.
    """
    return _plan(table, op, max_depth, frozenset())


def _plan(
    table: CapabilityTable[object], op: str, depth: int, seen: frozenset[str]
) -> list[Decomposition] | str:
    if op in table:
        return []
    rules = decompositions_for(op)
    if not rules:
        return f"no decomposition of {op}"
    if depth <= 0:
        return f"{op}: decomposition depth cap ({MAX_DEPTH}) reached"
    reasons = []
    for rule in rules:
        sub = _produced_plan(table, rule, depth, seen | {op})
        if isinstance(sub, list):
            return [rule, *sub]
        reasons.append(f"{rule.name}: {sub}")
    return "; ".join(reasons)


def _produced_plan(
    table: CapabilityTable[object], rule: Decomposition, depth: int, seen: frozenset[str]
) -> list[Decomposition] | str:
    """The rules that make every op ``rule`` produces writable, or why one is not."""
    out: list[Decomposition] = []
    for produced in rule.produces:
        if produced in table:
            continue
        if produced in rule.native:
            return f"produces {produced}, which {table.backend} has no native entry for"
        if produced in seen:
            return f"{produced} is not native (and decomposes back into itself)"
        sub = _plan(table, produced, depth - 1, seen)
        if isinstance(sub, str):
            return f"produces {produced}, which {table.backend} cannot write ({sub})"
        out += [r for r in sub if r not in out]
    return out


def choose_decomposition(table: CapabilityTable[object], graph: Graph, node: Node) -> Decomposition | str:
    """The first rule of ``node``'s op whose check passes and whose produced ops ``table`` can
    write (see :func:`decomposed_support`), or the reasons why none applies."""
    rules = decompositions_for(node.qualified_op)
    if not rules:
        return f"no decomposition of {node.qualified_op}"
    reasons = []
    for rule in rules:
        why = rule.check(graph, node)
        if why is None:
            sub = _produced_plan(table, rule, MAX_DEPTH, frozenset({node.qualified_op}))
            if isinstance(sub, list):
                return rule
            why = sub
        reasons.append(f"{rule.name}: {why}")
    return "; ".join(reasons)


def _ensure_loaded() -> None:
    from passes.decompositions import (  # noqa: F401
        activations,
        attention,
        cast_like,
        compress,
        einsum,
        indexing,
        logic,
        loops,
        normalization,
        norms,
        ort_weight_only,
        reductions,
        smooth_activations,
        space_depth,
        spatial,
        static_values,
        tensor,
        thresholds,
        trig,
        trilu,
        weight_only,
    )
