"""The pass manager: runs a pipeline of passes with verification and instruments.

A pipeline item is a pass instance, a pass name / pipeline string, or a
:class:`FixedPoint` group that repeats its passes until none changes the graph
(at most ``max_steps`` sweeps; a warning is logged if it does not converge).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from compiler.errors import InternalError, KilnError, blamed_node
from compiler.instruments import Instrument
from compiler.ir.graph import Graph
from compiler.ir.verifier import VerificationError, verify
from compiler.pass_infra import Pass, PassContext, parse_pipeline
from compiler.rewriter import PassResult

__all__ = ["PassManager", "FixedPoint", "PipelineItem", "PassFailed"]

log = logging.getLogger(__name__)


class PassFailed(InternalError):
    """A pass broke the graph (the verifier failed after it) or raised: a bug, exit 3.

    ``where`` names the pass and ``node`` the node it was rewriting (when a rule raised).
    """


@dataclass(frozen=True)
class FixedPoint:
    """Repeat ``passes`` until a sweep changes nothing, at most ``max_steps`` sweeps."""

    passes: tuple[Pass | str, ...]
    max_steps: int = 8
    name: str = "fixed-point"


PipelineItem = Pass | str | FixedPoint


@dataclass
class PassManager:
    """Run passes in order on a graph.

    Example: ``PassManager(["fold-constants", "fold-batchnorm", MyPass()]).run(g)``.
    """

    pipeline: Sequence[PipelineItem]
    ctx: PassContext = field(default_factory=PassContext)
    instruments: list[Instrument] = field(default_factory=list)
    results: list[tuple[str, PassResult]] = field(default_factory=list)

    def run(self, graph: Graph) -> PassResult:
        """Run the whole pipeline; returns the merged result."""
        for ins in self.instruments:
            ins.before_pipeline(graph)
        total = PassResult()
        for item in self.pipeline:
            total.merge(self._run_item(item, graph))
        return total

    def _run_item(self, item: PipelineItem, graph: Graph) -> PassResult:
        if isinstance(item, FixedPoint):
            return self._run_fixed_point(item, graph)
        if isinstance(item, str):
            total = PassResult()
            for p in parse_pipeline(item):
                total.merge(self._run_pass(p, graph))
            return total
        return self._run_pass(item, graph)

    def _run_fixed_point(self, group: FixedPoint, graph: Graph) -> PassResult:
        total = PassResult()
        for _ in range(group.max_steps):
            sweep = PassResult()
            for item in group.passes:
                sweep.merge(self._run_item(item, graph))
            total.merge(sweep)
            if not sweep.changed:
                return total
        log.warning("fixed-point group %s did not converge in %d steps", group.name, group.max_steps)
        self.ctx.log.append(f"warning: {group.name} did not converge in {group.max_steps} steps")
        return total

    def _run_pass(self, p: Pass, graph: Graph) -> PassResult:
        spec = p.spec()
        for ins in self.instruments:
            ins.before_pass(spec, graph)
        try:
            result = p.run(graph, self.ctx)
        except KilnError:
            raise
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            raise PassFailed(
                f"pass {spec!r} failed: {detail}",
                where=[f"pass {spec!r}"],
                node=blamed_node(exc),
                detail=detail,
            ) from exc
        if self.ctx.verify_each:
            try:
                verify(graph)
            except VerificationError as exc:
                raise PassFailed(
                    f"pass {spec!r} left an invalid graph: {exc}",
                    where=[f"pass {spec!r}"],
                    detail=f"left an invalid graph: {exc}",
                ) from exc
        self.results.append((spec, result))
        log.info("%s: %s", spec, result.summary())
        for ins in self.instruments:
            ins.after_pass(spec, graph, result)
        return result
