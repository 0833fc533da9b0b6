"""The ONNX converter table and the context a converter works in.

Converters are registered per op with the first opset they handle::

    @converter("Squeeze", since=1)
    def squeeze_v1(ctx: NodeContext) -> list[Value | None]: ...  # axes attribute -> input

For a model whose opset (for that domain) is ``v``, the converter with the
highest ``since <= v`` is used. ``needs`` names the Kiln ops the converter
emits; an op whose converter needs an op missing from the registry counts as
unsupported. A converter returns one value per ONNX output (None where the
canonical form has no such output).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from compiler.errors import ConversionError
from compiler.ir.graph import Graph, GraphError, Value
from compiler.ir.types import TensorType
from compiler.ops.registry import AttrError, ShapeError, get_op, has_op, infer_node_types
from frontends.onnx.folding import fold

__all__ = [
    "NodeContext",
    "ConverterFn",
    "ConverterEntry",
    "converter",
    "generic",
    "register_generic",
    "find_converter",
    "DEFAULT_DOMAIN",
]

logger = logging.getLogger(__name__)

DEFAULT_DOMAIN = ""


@dataclass
class NodeContext:
    """One ONNX node being converted: its inputs, attributes and a way to emit Kiln nodes.

    Converters ``pop`` the attributes they translate; :meth:`rest` hands the
    remaining ones to the canonical op's ``make_attrs``, which rejects unknown
    names. Attributes never consumed are reported as an error by the loader.
    """

    graph: Graph
    proto: onnx.NodeProto
    opset: int
    inputs: list[Value | None]
    attrs: dict[str, Any]
    name: str
    where: str
    fold: bool = True
    scope: Any = None  # the importer's SubgraphScope: imports a control-flow node's subgraphs
    _emitted: int = field(default=0, init=False)
    _inner_ops: dict[str, int] = field(default_factory=dict, init=False)

    @property
    def op_type(self) -> str:
        """The ONNX op type."""
        return str(self.proto.op_type)

    @property
    def num_outputs(self) -> int:
        """Declared ONNX outputs, trailing omitted ones not counted."""
        outs = list(self.proto.output)
        while outs and not outs[-1]:
            outs.pop()
        return len(outs)

    def input(self, i: int) -> Value | None:
        """Input ``i`` (None when absent)."""
        return self.inputs[i] if i < len(self.inputs) else None

    def require(self, i: int) -> Value:
        """Input ``i``, which must be present."""
        v = self.input(i)
        if v is None:
            raise self.fail(f"required input {i} is missing")
        return v

    def type(self, i: int) -> TensorType:
        """The type of required input ``i``."""
        return self.require(i).type

    def const(self, i: int) -> np.ndarray | None:
        """The constant value of input ``i``, or None."""
        v = self.input(i)
        return None if v is None else v.const

    def pop(self, name: str, default: Any = None) -> Any:
        """Consume attribute ``name`` (``default`` when absent)."""
        return self.attrs.pop(name, default)

    def has_attr(self, name: str) -> bool:
        """True if the node carries attribute ``name`` (not yet consumed)."""
        return name in self.attrs

    def rest(self, **extra: Any) -> dict[str, Any]:
        """All remaining attributes (consumed now), updated with ``extra``."""
        out = dict(self.attrs)
        self.attrs.clear()
        out.update(extra)
        return out

    def fail(self, msg: str) -> ConversionError:
        """An error that names the node and its op."""
        return ConversionError(f"{self.where}: {msg}")

    def constant(self, array: np.ndarray | Sequence[Any], suffix: str, dtype: Any = None) -> Value:
        """Add a constant derived from this node (named ``<first output>__<suffix>``)."""
        arr = np.asarray(array, dtype=dtype)
        return self.graph.add_constant(arr, name=f"{self._base()}__{suffix}")

    def ints(self, values: Iterable[int], suffix: str) -> Value:
        """A 1-D int64 constant (axes, pads, starts...)."""
        return self.constant(np.asarray(list(values), dtype=np.int64).reshape(-1), suffix)

    def _base(self) -> str:
        outs = [o for o in self.proto.output if o]
        return outs[0] if outs else (self.name or self.op_type.lower())

    def emit(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Any = None,
        *,
        num_outputs: int | None = None,
        final: bool = True,
        domain: str = "",
    ) -> list[Value]:
        """Add Kiln op ``op`` (folded to constants when possible) and return its outputs.

        ``final`` nodes take the ONNX node's output names; others get names derived from them.
        """
        ins = list(inputs)
        while ins and ins[-1] is None:
            ins.pop()
        self._emitted += 1
        try:
            opdef = get_op(op, domain)
            attrs_obj = opdef.make_attrs(attrs, where=self.name or self.op_type)
            n_out = num_outputs if num_outputs is not None else (self.num_outputs if final else 1)
            n_out = max(n_out, 1)
            names = self._output_names(op, n_out, final)
            types = infer_node_types(opdef, attrs_obj, ins, n_out, where=self.name or self.op_type)
            folded = fold(opdef, attrs_obj, ins, types, self.where) if self.fold else None
        except (ShapeError, AttrError, GraphError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise self.fail(f"{op} conversion failed: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - a registry bug still names the node
            raise self.fail(f"{op} conversion failed ({type(exc).__name__}): {exc}") from exc
        if folded is not None:
            return [self.graph.add_constant(a, name=nm) for a, nm in zip(folded, names, strict=True)]
        node_name = self.name if final else self._inner_name(op)
        node = self.graph.add_node(
            op, ins, attrs_obj, domain=domain, name=node_name, output_names=names, output_types=types
        )
        return self.graph.outputs_of(node)

    def _inner_name(self, op: str) -> str:
        """``<node>/<op>``, then ``<node>/<op>_2``...: node names stay unique within a converter."""
        if not self.name:
            return ""
        k = self._inner_ops.get(op, 0) + 1
        self._inner_ops[op] = k
        return f"{self.name}/{op}" if k == 1 else f"{self.name}/{op}_{k}"

    def _output_names(self, op: str, n: int, final: bool) -> list[str]:
        outs = list(self.proto.output)
        base = self._base()
        if not final:
            return [f"{base}__{op.lower()}{self._emitted}" + (f"_{i}" if n > 1 else "") for i in range(n)]
        return [outs[i] if i < len(outs) and outs[i] else f"{base}__out{i}" for i in range(n)]


ConverterFn = Callable[[NodeContext], Sequence[Value | None]]


@dataclass(frozen=True)
class ConverterEntry:
    """One row of the converter table."""

    op_type: str
    domain: str
    since: int
    fn: ConverterFn
    needs: tuple[str, ...]

    def available(self) -> bool:
        """True if every Kiln op this converter emits is registered (``kiln::X``: of that domain)."""
        return all(has_op(*reversed(n.split("::", 1))) for n in self.needs)


_TABLE: dict[tuple[str, str], list[ConverterEntry]] = {}


def _norm_domain(domain: str) -> str:
    return DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain


def converter(
    op_type: str, *, since: int, domain: str = "", needs: Sequence[str] | None = None
) -> Callable[[ConverterFn], ConverterFn]:
    """Register ``fn`` as the converter of ``op_type`` from opset ``since`` on."""

    def deco(fn: ConverterFn) -> ConverterFn:
        key = (_norm_domain(domain), op_type)
        rows = _TABLE.setdefault(key, [])
        if any(r.since == since for r in rows):
            raise ValueError(f"converter {op_type} since {since} registered twice")
        rows.append(ConverterEntry(op_type, key[0], since, fn, tuple(needs) if needs else (op_type,)))
        rows.sort(key=lambda r: r.since)
        return fn

    return deco


def generic(ctx: NodeContext) -> list[Value]:
    """The 1:1 mapping: same op, same inputs, attributes straight into ``make_attrs``."""
    return ctx.emit(ctx.op_type, ctx.inputs, ctx.rest())


def register_generic(table: dict[str, int]) -> None:
    """Register :func:`generic` for each ``op_type: since`` pair."""
    for op_type, since in table.items():
        converter(op_type, since=since)(generic)


def find_converter(domain: str, op_type: str, opset: int) -> ConverterEntry | None:
    """The converter for ``op_type`` at ``opset``, or None (unknown, too old, or ops missing)."""
    _ensure_loaded()
    rows = _TABLE.get((_norm_domain(domain), op_type), [])
    best = None
    for r in rows:
        if r.since <= opset:
            best = r
    return best if best is not None and best.available() else None


def _ensure_loaded() -> None:
    import frontends.onnx.converters  # noqa: F401  (registers the families)
