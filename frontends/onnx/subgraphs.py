"""Importing ONNX subgraphs (If branches, Loop and Scan bodies) as Kiln graphs.

An ONNX subgraph reads outer-scope values by name. Kiln makes them explicit: a *free name* of
a subgraph (read there, defined by no input, initializer or node of it) bound to a constant of
the enclosing graph becomes a Constant inside the subgraph; any other becomes a *capture*, an
input of the subgraph after its formal (ONNX) inputs, named like the outer value, that the
control-flow node feeds with that value. A subgraph is imported by a child
:class:`~frontends.onnx.importer.OnnxImporter` that reads the GraphProto, so nested control
flow, initializers inside subgraphs and import-time folding work as at the top level.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import onnx

from compiler.errors import ConversionError, ModelFileError
from compiler.ir.graph import Graph, Value
from compiler.ir.types import TensorType
from frontends.onnx.protos import sparse_to_array, tensor_to_array

if TYPE_CHECKING:
    from frontends.onnx.importer import OnnxImporter

__all__ = ["SubgraphScope", "free_names", "node_subgraphs"]


def node_subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The ``(attribute name, GraphProto)`` pairs of a node (GRAPHS attributes as ``name[i]``)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for i, g in enumerate(attr.graphs):
                yield f"{attr.name}[{i}]", g


def free_names(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph`` (or a subgraph nested in it) reads from enclosing scopes, in first-read order."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    for n in graph.node:
        defined.update(o for o in n.output if o)
    out: list[str] = []
    seen: set[str] = set()

    def use(name: str) -> None:
        if name and name not in defined and name not in seen:
            seen.add(name)
            out.append(name)

    for n in graph.node:
        for x in n.input:
            use(x)
        for _, sub in node_subgraphs(n):
            for x in free_names(sub):
                use(x)
    for o in graph.output:
        use(o.name)
    return out


class SubgraphScope:
    """What a control-flow converter asks of the importer converting its node (``ctx.scope``)."""

    def __init__(self, importer: OnnxImporter, where: str) -> None:
        self.importer = importer
        self.where = where

    def captures(self, protos: Sequence[onnx.GraphProto]) -> list[tuple[str, Value]]:
        """The non-constant outer values the subgraphs read, as ``(name, value)`` in first-read order."""
        out: list[tuple[str, Value]] = []
        seen: set[str] = set()
        for p in protos:
            for name in free_names(p):
                v = self._outer(name)
                if name not in seen and v.const is None:
                    seen.add(name)
                    out.append((name, v))
        return out

    def _outer(self, name: str) -> Value:
        v = self.importer.env.get(name)
        if v is None:
            raise ModelFileError(f"{self.where}: a subgraph reads {name!r}, which no enclosing scope defines")
        return v

    def subgraph(
        self,
        proto: onnx.GraphProto,
        formal: Sequence[TensorType],
        captures: Sequence[tuple[str, Value]],
        label: str,
    ) -> Graph:
        """Import ``proto`` with its inputs typed ``formal``, then one input per capture."""
        from frontends.onnx.importer import OnnxImporter

        where = f"{self.where} {label}"
        if len(proto.input) != len(formal):
            raise ConversionError(f"{where}: has {len(proto.input)} inputs, expected {len(formal)}")
        parent = self.importer
        child = OnnxImporter(parent.model, parent.source, {}, proto=proto)
        child.graph.name = label
        g = child.graph
        for vi, t in zip(proto.input, formal, strict=True):
            child.env[vi.name] = g.add_input(vi.name, t)
        for name, v in captures:
            child.env[name] = g.add_input(name, v.type)
        for name in free_names(proto):
            outer = self._outer(name)
            if name not in child.env and outer.const is not None:
                child.env[name] = g.add_constant(outer.const, name)
        for t in proto.initializer:
            child.env[t.name] = g.add_constant(tensor_to_array(t, f"{where} initializer {t.name!r}"), t.name)
        for s in proto.sparse_initializer:
            nm = s.values.name
            child.env[nm] = g.add_constant(sparse_to_array(s, f"{where} initializer {nm!r}"), nm)
        for index in child._topological_order():
            child._convert(index)
        child._set_outputs()
        child._prune_constants()
        return g
