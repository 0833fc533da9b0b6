"""The lowering table: qualified op name -> rule turning one Kiln node into Relax expressions.

A rule gets the :class:`LowerContext` (block builder, target, kernel cache), the
node and its inputs already lowered (``None`` for absent optional inputs) and
returns one Relax expression per node output. Its ``check`` (``@lowers(..., check=)``)
refuses, from the graph alone, what the rule cannot lower (a 1-D conv, a weight
that is not a constant); :func:`capabilities` gathers both into the backend's
:class:`~compiler.backend.CapabilityTable`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler.backend import CapabilityTable, Check, OpSupport
from compiler.errors import ConversionError

if TYPE_CHECKING:
    from backends.tvm.kernels.kernel import Kernel
    from backends.tvm.target import TargetSpec
    from compiler.ir.graph import Graph, Node
    from compiler.ir.types import TensorType

__all__ = [
    "LowerContext",
    "Rule",
    "lowers",
    "lowers_dynamic",
    "rule_for",
    "capabilities",
    "const_inputs",
    "single_output",
    "REFUSED",
    "TvmCapabilityTable",
]

Expr = Any  # tvm.relax.Expr


@dataclass
class LowerContext:
    """What a rule sees: the builder, the graph it lowers and the kernels already added."""

    bb: Any  # tvm.relax.BlockBuilder
    graph: Graph
    target: TargetSpec
    kernels: dict[str, Any] = field(default_factory=dict)  # kernel name -> GlobalVar
    kernel_log: list[dict[str, Any]] = field(default_factory=list)
    # Relax value -> its int64 elements as PrimExprs, for small shape tensors whose elements are
    # known symbolically (Shape of a run-time-shaped tensor and what is computed from it)
    values: dict[Any, list[Any]] = field(default_factory=dict)

    def emit(self, expr: Expr) -> Expr:
        """Bind ``expr`` to a dataflow variable."""
        return self.bb.emit(expr)

    def const(self, array: np.ndarray) -> Expr:
        """A Relax constant of ``array``'s own dtype (weights end up inside the compiled library;
        without the dtype Relax would narrow float64 to float32 and int64 to int32). A 0-d array
        stays 0-d (``np.ascontiguousarray`` would make it ``[1]``: a scalar Gather index would then
        keep the gathered axis)."""
        from tvm import relax

        return relax.const(np.require(array, requirements="C"), str(array.dtype))

    def scalar(self, value: float, dtype: str) -> Expr:
        """A 0-d constant of ``dtype``."""
        return self.const(np.array(value, dtype=dtype))

    def input_const(self, node: Node, port: int) -> np.ndarray | None:
        """The value of input ``port`` if it is a constant (else None)."""
        ins = self.graph.inputs_of(node)
        v = ins[port] if port < len(ins) else None
        return None if v is None else v.const

    def require_const(self, node: Node, port: int, what: str) -> np.ndarray:
        """The constant at input ``port``; a ConversionError naming the node otherwise."""
        c = self.input_const(node, port)
        if c is None:
            raise ConversionError(f"{node.describe()}: {what} (input {port}) must be a constant for --target")
        return c

    def in_type(self, node: Node, port: int) -> TensorType:
        """The IR type of input ``port``."""
        v = self.graph.inputs_of(node)[port]
        assert v is not None
        return v.type

    def out_type(self, node: Node, port: int = 0) -> TensorType:
        """The IR type of output ``port``."""
        return node.output_types[port]

    def out_shape(self, node: Node, port: int = 0) -> tuple[int, ...]:
        """The static output shape (all shapes are static when lowering)."""
        s = node.output_types[port].shape
        assert s is not None and all(isinstance(d, int) for d in s), node.describe()
        return tuple(int(d) for d in s)

    def call_kernel(self, kernel: Kernel, args: list[Expr], what: str = "") -> Expr:
        """Add ``kernel`` once (deduplicated by name) and emit a ``call_tir`` to it."""
        from tvm import relax

        from backends.tvm.kernel_report import kernel_entry

        gv = self.kernels.get(kernel.name)
        if gv is None:
            gv = self.bb.add_func(kernel.func.with_attr("global_symbol", kernel.name), kernel.name)
            self.kernels[kernel.name] = gv
            self.kernel_log.append(kernel_entry(kernel.name, kernel.func))
        out = relax.TensorType(kernel.out_shape, kernel.out_dtype)
        return self.emit(relax.call_tir(gv, args, out))


Rule = Callable[[LowerContext, "Node", list[Any]], list[Any]]
_RULES: dict[str, OpSupport[Rule]] = {}
_DYNAMIC: dict[str, OpSupport[Rule]] = {}
"""Rules for nodes with a dim known only at run time (:mod:`backends.tvm.lowering.dynamic`)."""


def lowers(*ops: str, check: Check | None = None) -> Callable[[Rule], Rule]:
    """Register a rule, and the check that refuses what it cannot lower, for the qualified op
    names (``Add``, ``kiln::FusedConv``)."""

    def deco(fn: Rule) -> Rule:
        for op in ops:
            assert op not in _RULES, op
            _RULES[op] = OpSupport(fn, check)
        return fn

    return deco


def lowers_dynamic(*ops: str, check: Check | None = None) -> Callable[[Rule], Rule]:
    """Register the rule (and its check) for nodes of ``ops`` with a run-time dim: the rule sees
    symbolic Relax shapes (``tirx.Var`` dims) and must not read ``ctx.out_shape``."""

    def deco(fn: Rule) -> Rule:
        for op in ops:
            assert op not in _DYNAMIC, op
            _DYNAMIC[op] = OpSupport(fn, check, dynamic_outputs=True)
        return fn

    return deco


def rule_for(graph: Graph, node: Node) -> Rule:
    """The rule lowering ``node``: the symbolic-shape one when a dim is known only at run time."""
    from backends.tvm.dynamic_shapes import is_dynamic

    table = _DYNAMIC if is_dynamic(graph, node) else _RULES
    return table[node.qualified_op].lower


_DATA_SHAPED = "its output length depends on the data"
REFUSED: dict[str, str] = {
    "Compress": _DATA_SHAPED + " (the decompose pass writes it as a Gather of NonZero's positions)",
    "Loop": "Loop needs run-time control flow (unroll-loop unrolls a static trip count first)",
    "Scan": "Scan needs run-time control flow (unroll-scan unrolls a static sequence length first)",
}
"""Ops without a rule on purpose, with the reason the preflight and the lowering report."""


class TvmCapabilityTable(CapabilityTable[Rule]):
    """The TVM table: ops in :data:`REFUSED` are refused with their reason; a node with a dim known
    only at run time is asked of the symbolic-shape rules (``dynamic``), the others of the static
    ones (every op of either is in the table, for ``kiln ops``)."""

    def __init__(self, static: dict[str, OpSupport[Rule]], dynamic: dict[str, OpSupport[Rule]]) -> None:
        super().__init__("tvm", {**dynamic, **static}, requires_static=False)
        self._static, self._dynamic = static, dynamic

    def reason(self, graph: Graph, node: Node) -> str | None:
        """Why TVM cannot lower ``node`` (the precise reason for a deliberately refused op)."""
        from backends.tvm.dynamic_shapes import is_dynamic
        from compiler.backend import DYNAMIC_SHAPE
        from compiler.ir.graph import CONSTANT_OP, INPUT_OP

        op = node.qualified_op
        if node.op in (INPUT_OP, CONSTANT_OP) and not node.domain:
            return None
        if op not in self:
            why = f"no {self.backend} lowering"
            return f"{why}: {REFUSED[op]}" if op in REFUSED else why
        types = [v.type for v in graph.inputs_of(node) if v is not None] + list(node.output_types)
        if any(t.shape is None for t in types):
            return f"{DYNAMIC_SHAPE}: a tensor of unknown rank"
        entries = self._dynamic if is_dynamic(graph, node) else self._static
        entry = entries.get(op)
        if entry is None:
            return f"{DYNAMIC_SHAPE}: no symbolic-shape TVM lowering of {op}"
        return entry.check(graph, node) if entry.check is not None else None


@functools.cache
def capabilities() -> CapabilityTable[Rule]:
    """The TVM op table (the same for every target: rules pick target kernels themselves)."""
    import backends.tvm.lowering  # noqa: F401  (registers the rules)

    return TvmCapabilityTable(_RULES, _DYNAMIC)


def const_inputs(*ports: tuple[int, str]) -> Check:
    """A check that inputs ``(port, what)`` are constants (as :meth:`LowerContext.require_const` needs)."""

    def check(graph: Graph, node: Node) -> str | None:
        ins = graph.inputs_of(node)
        for port, what in ports:
            v = ins[port] if port < len(ins) else None
            if v is None or v.const is None:
                return f"{what} (input {port}) must be a constant for --target"
        return None

    return check


def single_output(what: str) -> Check:
    """A check that refuses nodes with more than one output (``what``: why, in words)."""
    return lambda graph, node: what if node.num_outputs > 1 else None
