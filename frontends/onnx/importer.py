"""Build a Kiln Graph from a validated ONNX ModelProto.

Order of work: opsets, a scan that collects *every* unsupported op (inside
subgraphs too), graph inputs (with ``input_shapes`` applied), initializers, nodes
in topological order (each through its converter, folding small constant
computations), outputs, and finally the removal of constants nothing uses any more.

A control-flow node's subgraphs are imported by a child importer of the same class
(:mod:`frontends.onnx.subgraphs`): the converter asks ``ctx.scope`` for them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import onnx

from compiler.errors import ConversionError, InputShapeError, ModelFileError, UnsupportedOpsError
from compiler.ir.graph import CONSTANT_OP, Graph, Value
from compiler.ir.types import Dim, TensorType
from frontends.onnx.converter import DEFAULT_DOMAIN, NodeContext, find_converter
from frontends.onnx.protos import node_attributes, sparse_to_array, tensor_to_array, type_of_value_info
from frontends.onnx.subgraphs import SubgraphScope, free_names, node_subgraphs

__all__ = ["OnnxImporter", "MIN_OPSET", "fixed_input_type"]

logger = logging.getLogger(__name__)

MIN_OPSET = 9
"""The oldest default-domain opset Kiln imports."""


def fixed_input_type(name: str, declared: TensorType, wanted: Sequence[int]) -> TensorType:
    """``declared`` with its dynamic dims fixed to ``wanted``; InputShapeError on any conflict."""
    want = tuple(int(d) for d in wanted)
    if declared.shape is None:
        return declared.with_shape(want)
    shown = "x".join(str(d) for d in declared.shape)
    given = "x".join(str(d) for d in want)
    if len(declared.shape) != len(want):
        raise InputShapeError(
            f"input {name!r}: --input-shape {given} has rank {len(want)}, the model declares "
            f"{shown} (rank {len(declared.shape)})"
        )
    for axis, (d, w) in enumerate(zip(declared.shape, want, strict=True)):
        if isinstance(d, int) and d != w:
            raise InputShapeError(
                f"input {name!r}: --input-shape {given} conflicts with the model's static shape {shown} "
                f"at axis {axis} ({w} != {d})"
            )
    return declared.with_shape(want)


def node_label(node: onnx.NodeProto, index: int) -> str:
    """The node's source name, or its first output name when it has none."""
    if node.name:
        return str(node.name)
    outs = [o for o in node.output if o]
    return outs[0] if outs else f"#{index}"


class OnnxImporter:
    """Converts one ONNX model into a Kiln Graph (use :meth:`run` once)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        source: str,
        input_shapes: Mapping[str, Sequence[int]],
        *,
        proto: onnx.GraphProto | None = None,
    ) -> None:
        self.model = model
        self.source = source
        self.input_shapes = dict(input_shapes)
        self.opsets = self._opsets()
        self.proto = model.graph if proto is None else proto  # a subgraph's importer reads its GraphProto
        self.graph = Graph(self.proto.name or "main")
        self.env: dict[str, Value] = {}

    # ---------------------------------------------------------------- setup
    def _opsets(self) -> dict[str, int]:
        opsets: dict[str, int] = {}
        for imp in self.model.opset_import:
            dom = DEFAULT_DOMAIN if imp.domain in ("", "ai.onnx") else imp.domain
            opsets[dom] = int(imp.version)
        if opsets.get(DEFAULT_DOMAIN, MIN_OPSET) < MIN_OPSET:
            raise ConversionError(
                f"{self.source}: default-domain opset {opsets[DEFAULT_DOMAIN]} is not supported (the oldest "
                f"supported is {MIN_OPSET}) and onnx.version_converter cannot upgrade it faithfully"
            )
        return opsets

    def _check_default_opset(self) -> None:
        """A model without a default-domain opset (checked after the scan, which names its ops)."""
        if DEFAULT_DOMAIN not in self.opsets:
            raise ModelFileError(f"{self.source}: the model imports no default-domain (ai.onnx) opset")

    def _set_metadata(self) -> None:
        m = self.model
        md = self.graph.metadata
        md["source_format"] = "onnx"
        md["producer"] = f"{m.producer_name} {m.producer_version}".strip()
        md["ir_version"] = str(m.ir_version)
        md["opset"] = str(self.opsets[DEFAULT_DOMAIN])
        for dom, ver in sorted(self.opsets.items()):
            if dom:
                md[f"opset.{dom}"] = str(ver)
        for prop in m.metadata_props:
            md[f"onnx.{prop.key}"] = prop.value

    # ----------------------------------------------------------------- scan
    def check_supported(self) -> None:
        """Raise UnsupportedOpsError listing every unsupported op with all its node names."""
        missing: dict[str, list[str]] = {}
        self._scan(self.proto, "", missing)
        if missing:
            raise UnsupportedOpsError(self.source, missing)

    def _scan(self, graph: onnx.GraphProto, path: str, missing: dict[str, list[str]]) -> None:
        """Collect unsupported ops of ``graph`` and of every subgraph in it (labelled ``node/attr/``)."""
        for i, node in enumerate(graph.node):
            dom = DEFAULT_DOMAIN if node.domain in ("", "ai.onnx") else node.domain
            opset = self.opsets.get(dom)
            entry = None if opset is None else find_converter(dom, node.op_type, opset)
            label = path + node_label(node, i)
            if entry is None:
                key = f"{dom}::{node.op_type}" if dom else node.op_type
                missing.setdefault(key, []).append(label)
            for attr, sub in node_subgraphs(node):
                self._scan(sub, f"{label}/{attr}/", missing)

    # ---------------------------------------------------------------- build
    def run(self) -> Graph:
        """Convert the whole model."""
        self.check_supported()
        self._check_default_opset()
        self._set_metadata()
        g = self.model.graph
        init_names = {t.name for t in g.initializer} | {s.values.name for s in g.sparse_initializer}
        self._add_inputs([vi for vi in g.input if vi.name not in init_names])
        for t in g.initializer:
            self.env[t.name] = self.graph.add_constant(tensor_to_array(t, f"initializer {t.name!r}"), t.name)
        for s in g.sparse_initializer:
            name = s.values.name
            self.env[name] = self.graph.add_constant(sparse_to_array(s, f"initializer {name!r}"), name)
        for index in self._topological_order():
            self._convert(index)
        self._set_outputs()
        self._prune_constants()
        logger.info("imported %s: %d nodes", self.source, len(self.graph))
        return self.graph

    def _add_inputs(self, inputs: Sequence[onnx.ValueInfoProto]) -> None:
        names = [vi.name for vi in inputs]
        unknown = sorted(set(self.input_shapes) - set(names))
        if unknown:
            verb = "is not a graph input" if len(unknown) == 1 else "are not graph inputs"
            raise InputShapeError(
                f"{self.source}: --input-shape names {', '.join(map(repr, unknown))}, which {verb} "
                f"(inputs: {', '.join(names) or 'none'})"
            )
        types = {vi.name: type_of_value_info(vi, f"{self.source}: graph input") for vi in inputs}
        bound: dict[str, int] = {}  # symbol -> size fixed through input_shapes
        for name, want in self.input_shapes.items():
            fixed = fixed_input_type(name, types[name], want)
            for d, w in zip(types[name].shape or (), fixed.static_shape, strict=False):
                if isinstance(d, str):
                    bound[d] = w
            types[name] = fixed
        for vi in inputs:
            t = types[vi.name]
            if bound and t.shape is not None:
                dims: tuple[Dim, ...] = tuple(bound.get(d, d) if isinstance(d, str) else d for d in t.shape)
                t = t.with_shape(dims)
            self.env[vi.name] = self.graph.add_input(vi.name, t)

    def _topological_order(self) -> list[int]:
        nodes = list(self.proto.node)
        reads = [list(n.input) + [x for _, sub in node_subgraphs(n) for x in free_names(sub)] for n in nodes]
        known = set(self.env)
        order: list[int] = []
        pending = list(range(len(nodes)))
        while pending:
            progress = []
            for i in pending:
                if all(not x or x in known for x in reads[i]):
                    order.append(i)
                    known.update(o for o in nodes[i].output if o)
                    progress.append(i)
            if not progress:
                i = pending[0]
                miss = next(x for x in reads[i] if x and x not in known)
                raise ModelFileError(
                    f"{self.source}: node {node_label(nodes[i], i)!r} ({nodes[i].op_type}) reads "
                    f"{miss!r}, which no node, input or initializer defines (corrupt or truncated model?)"
                )
            done = set(progress)
            pending = [i for i in pending if i not in done]
        return order

    def _convert(self, index: int) -> None:
        node = self.proto.node[index]
        label = node_label(node, index)
        where = f"{self.source}: node {label!r} ({node.op_type})"
        dom = DEFAULT_DOMAIN if node.domain in ("", "ai.onnx") else node.domain
        opset = self.opsets[dom]
        entry = find_converter(dom, node.op_type, opset)
        assert entry is not None  # check_supported ran first
        ins: list[Value | None] = [self.env[x] if x else None for x in node.input]
        ctx = NodeContext(
            graph=self.graph,
            proto=node,
            opset=opset,
            inputs=ins,
            attrs=node_attributes(node, where),
            name=str(node.name),
            where=where,
            scope=SubgraphScope(self, where),
        )
        outs = list(entry.fn(ctx))
        if ctx.attrs:
            raise ConversionError(f"{where}: unsupported attribute(s) {', '.join(sorted(ctx.attrs))}")
        for i, name in enumerate(node.output):
            if not name:
                continue
            v = outs[i] if i < len(outs) else None
            if v is None:
                if self._is_read(name):
                    raise ConversionError(
                        f"{where}: output {i} ({name!r}) is used but Kiln's canonical "
                        f"{node.op_type} does not produce it"
                    )
                continue
            self.env[name] = v

    def _is_read(self, name: str) -> bool:
        g = self.proto
        return (
            any(name in n.input for n in g.node)
            or any(o.name == name for o in g.output)
            or any(name in free_names(sub) for n in g.node for _, sub in node_subgraphs(n))
        )

    def _set_outputs(self) -> None:
        outs: list[Value] = []
        for o in self.proto.output:
            if o.name not in self.env:
                raise ModelFileError(f"{self.source}: graph output {o.name!r} is never computed")
            outs.append(self.env[o.name])
        self.graph.set_outputs(outs)

    def _prune_constants(self) -> None:
        for node in self.graph.nodes():
            if node.op == CONSTANT_OP and not node.domain and not self.graph.has_users(node):
                self.graph.remove(node)
