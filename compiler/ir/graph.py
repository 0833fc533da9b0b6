"""The Kiln graph: typed nodes over a private ``networkx.MultiDiGraph``.

Nodes are identified by ints that are never reused. An edge ``u -> v`` carries
``(src_port, dst_port)``: output ``src_port`` of ``u`` feeds input ``dst_port``
of ``v``. A :class:`Value` is ``(node, port)``. Graph inputs are ``Input`` nodes
and constants are ``Constant`` nodes holding read-only numpy arrays, each
distinct array stored once. Every edit goes through Graph methods, which keep
names unique and notify listeners (the rewriter counts changes that way).

A control-flow node (If, Loop, Scan) owns its subgraphs through Graph-valued attrs
fields (:attr:`Node.subgraphs`); the outer values a subgraph reads are explicit node
inputs (captures, :mod:`compiler.ops.control_flow`), so edges, passes and dead-code
elimination see them like any other use. :meth:`Graph.clone` deep-copies subgraphs.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from compiler.ir.types import TensorType

__all__ = ["Graph", "Node", "Value", "GraphError", "Listener", "subgraph_attrs", "clone_attrs"]

INPUT_OP = "Input"
CONSTANT_OP = "Constant"


class GraphError(ValueError):
    """An invalid edit or query on a graph; the message names the node."""


@dataclass(eq=False)
class Node:
    """One operation. ``attrs`` is the op's frozen attrs dataclass instance."""

    id: int
    op: str
    domain: str
    attrs: Any
    name: str
    num_inputs: int
    output_names: list[str]
    output_types: list[TensorType]

    @property
    def num_outputs(self) -> int:
        """Number of output ports."""
        return len(self.output_names)

    @property
    def qualified_op(self) -> str:
        """``domain::op`` for non-ONNX domains, else ``op``."""
        return f"{self.domain}::{self.op}" if self.domain else self.op

    @property
    def subgraphs(self) -> tuple[Graph, ...]:
        """The graphs this node owns (If's branches, Loop's and Scan's body), in attribute order."""
        return tuple(g for _, g in subgraph_attrs(self.attrs))

    def describe(self) -> str:
        """A short human description: op, source name and first output name."""
        src = f" '{self.name}'" if self.name else ""
        out = f" -> %{self.output_names[0]}" if self.output_names else ""
        return f"{self.qualified_op}{src} (#{self.id}{out})"


@dataclass(frozen=True)
class Value:
    """Output ``port`` of node ``node`` in a graph."""

    node: int
    port: int
    graph: Graph = field(compare=False, hash=False, repr=False)

    @property
    def producer(self) -> Node:
        """The node that computes this value."""
        return self.graph.node(self.node)

    @property
    def type(self) -> TensorType:
        """The value's tensor type."""
        return self.producer.output_types[self.port]

    @property
    def name(self) -> str:
        """The value's unique name in the graph."""
        return self.producer.output_names[self.port]

    @property
    def users(self) -> list[tuple[Node, int]]:
        """Consumers as ``(node, input port)`` pairs, in deterministic order."""
        return self.graph.users(self)

    @property
    def const(self) -> np.ndarray | None:
        """The array if this value is a constant, else None."""
        return self.graph.const_value(self)


def subgraph_attrs(attrs: Any) -> list[tuple[str, Graph]]:
    """The ``(attribute name, Graph)`` fields of an attrs dataclass, in field order.

    A control-flow node owns its subgraphs through its attrs (e.g. ``IfAttrs.then_branch``).
    """
    if not dataclasses.is_dataclass(attrs) or isinstance(attrs, type):
        return []
    return [(f.name, v) for f in dataclasses.fields(attrs) if isinstance(v := getattr(attrs, f.name), Graph)]


def clone_attrs(attrs: Any) -> Any:
    """``attrs`` with every subgraph deep-copied (the same object when it owns none)."""
    subs = subgraph_attrs(attrs)
    return dataclasses.replace(attrs, **{k: g.clone() for k, g in subs}) if subs else attrs


Listener = Callable[[str, "Node"], None]
"""Called as ``listener(event, node)`` with event in add/remove/rewire/update."""


def _freeze(array: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(array).reshape(np.shape(array))  # ascontiguousarray makes 0-d arrays 1-d
    if arr.flags.writeable or arr.base is not None:
        arr = arr.copy()
    arr.setflags(write=False)
    return arr


def array_digest(array: np.ndarray) -> str:
    """A content digest of an array (dtype, shape and bytes)."""
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(
        np.ascontiguousarray(array).tobytes() if array.dtype != object else repr(array.tolist()).encode()
    )
    return h.hexdigest()


class Graph:
    """A typed dataflow graph. See the module docstring for the model."""

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.metadata: dict[str, str] = {}
        self._g: nx.MultiDiGraph = nx.MultiDiGraph()
        self._next_id = 0
        self._inputs: list[int] = []
        self._outputs: list[tuple[int, int]] = []
        self._output_names: list[str] = []
        self._names: set[str] = set()
        self._pool: dict[str, np.ndarray] = {}
        self._listeners: list[Listener] = []

    # ------------------------------------------------------------------ queries
    def node(self, node_id: int) -> Node:
        """The node with this id."""
        try:
            return self._g.nodes[node_id]["node"]
        except KeyError:
            raise GraphError(f"no node #{node_id} in graph {self.name!r}") from None

    def has_node(self, node_id: int) -> bool:
        """True if the node id is live."""
        return node_id in self._g

    def value(self, node: Node | int, port: int = 0) -> Value:
        """The value at output ``port`` of ``node``."""
        nid = node if isinstance(node, int) else node.id
        n = self.node(nid)
        if not 0 <= port < n.num_outputs:
            raise GraphError(f"{n.describe()} has no output {port}")
        return Value(nid, port, self)

    def outputs_of(self, node: Node) -> list[Value]:
        """All output values of a node."""
        return [Value(node.id, p, self) for p in range(node.num_outputs)]

    def nodes(self) -> list[Node]:
        """All nodes in deterministic topological order (ties broken by id)."""
        order = nx.lexicographical_topological_sort(self._g, key=lambda n: n)
        return [self._g.nodes[n]["node"] for n in order]

    def __len__(self) -> int:
        return int(self._g.number_of_nodes())

    def ops(self) -> list[Node]:
        """Nodes that are neither inputs nor constants, in topological order."""
        return [n for n in self.nodes() if n.op not in (INPUT_OP, CONSTANT_OP) or n.domain]

    def inputs_of(self, node: Node) -> list[Value | None]:
        """The values feeding each input port of ``node`` (None where absent)."""
        ins: list[Value | None] = [None] * node.num_inputs
        for src, _, data in self._g.in_edges(node.id, data=True):
            ins[data["dst_port"]] = Value(src, data["src_port"], self)
        return ins

    def users(self, value: Value) -> list[tuple[Node, int]]:
        """Consumers of ``value`` as ``(node, input port)``, sorted by node id and port."""
        out = [
            (dst, data["dst_port"])
            for _, dst, data in self._g.out_edges(value.node, data=True)
            if data["src_port"] == value.port
        ]
        return [(self.node(d), p) for d, p in sorted(out)]

    def has_users(self, node: Node) -> bool:
        """True if any output of ``node`` is consumed or is a graph output."""
        return self._g.out_degree(node.id) > 0 or any(o[0] == node.id for o in self._outputs)

    def is_output(self, value: Value) -> bool:
        """True if ``value`` is a graph output."""
        return (value.node, value.port) in self._outputs

    @property
    def inputs(self) -> list[Value]:
        """Graph inputs in order."""
        return [Value(i, 0, self) for i in self._inputs]

    @property
    def outputs(self) -> list[Value]:
        """Graph outputs in order."""
        return [Value(n, p, self) for n, p in self._outputs]

    @property
    def output_names(self) -> list[str]:
        """The public names of the graph outputs (usually equal to the values' names).

        They differ only where an output value is also a graph input or another
        output; exporters then add an Identity to keep the public name.
        """
        return list(self._output_names)

    def const_value(self, value: Value) -> np.ndarray | None:
        """The read-only array of a constant value, else None."""
        n = self.node(value.node)
        if n.op == CONSTANT_OP and not n.domain:
            return n.attrs.value
        return None

    def find_value(self, name: str) -> Value:
        """The value with this name."""
        for n in self.nodes():
            for p, nm in enumerate(n.output_names):
                if nm == name:
                    return Value(n.id, p, self)
        raise GraphError(f"no value named {name!r} in graph {self.name!r}")

    # -------------------------------------------------------------------- edits
    def add_listener(self, listener: Listener) -> None:
        """Register a callback for every edit."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Unregister a callback."""
        self._listeners.remove(listener)

    def _notify(self, event: str, node: Node) -> None:
        for fn in list(self._listeners):
            fn(event, node)

    def has_name(self, name: str) -> bool:
        """True if a value already uses ``name``."""
        return name in self._names

    def unique_name(self, base: str) -> str:
        """A value name not used yet in this graph, derived from ``base``."""
        base = base or "v"
        if base not in self._names:
            return base
        i = 1
        while f"{base}_{i}" in self._names:
            i += 1
        return f"{base}_{i}"

    def _new_node(
        self,
        op: str,
        domain: str,
        attrs: Any,
        name: str,
        num_inputs: int,
        names: Sequence[str],
        types: Sequence[TensorType],
    ) -> Node:
        nid = self._next_id
        self._next_id += 1
        out_names = []
        for nm in names:
            unique = self.unique_name(nm)
            self._names.add(unique)
            out_names.append(unique)
        node = Node(nid, op, domain, attrs, name, num_inputs, out_names, list(types))
        self._g.add_node(nid, node=node)
        return node

    def add_input(self, name: str, type_: TensorType) -> Value:
        """Append a graph input."""
        if name in self._names:
            raise GraphError(f"graph input name {name!r} is already used")
        from compiler.ops.registry import NO_ATTRS

        node = self._new_node(INPUT_OP, "", NO_ATTRS, name, 0, [name], [type_])
        self._inputs.append(node.id)
        self._notify("add", node)
        return Value(node.id, 0, self)

    def set_input_type(self, value: Value, type_: TensorType) -> None:
        """Change the declared type of a graph input (e.g. to fix a dynamic dim)."""
        node = self.node(value.node)
        if node.op != INPUT_OP:
            raise GraphError(f"{node.describe()} is not a graph input")
        node.output_types[0] = type_
        self._notify("update", node)

    def add_constant(self, array: np.ndarray, name: str = "const") -> Value:
        """Add a constant; identical arrays share one read-only buffer."""
        from compiler.ops.registry import make_constant_attrs

        arr = np.asarray(array)
        digest = array_digest(arr)
        stored = self._pool.get(digest)
        if stored is None:
            stored = _freeze(arr)
            self._pool[digest] = stored
        node = self._new_node(
            CONSTANT_OP, "", make_constant_attrs(stored), name, 0, [name], [TensorType.of(stored)]
        )
        self._notify("add", node)
        return Value(node.id, 0, self)

    def add_node(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Any = None,
        *,
        domain: str = "",
        name: str = "",
        output_names: Sequence[str] | None = None,
        num_outputs: int | None = None,
        output_types: Sequence[TensorType] | None = None,
    ) -> Node:
        """Add an operation; attrs may be a dict or the op's attrs dataclass.

        Output types are inferred through the op registry unless given.
        """
        from compiler.ops.registry import get_op, infer_node_types

        opdef = get_op(op, domain)
        attrs_obj = opdef.make_attrs(attrs, where=name or op)
        if num_outputs is None:
            num_outputs = len(output_names) if output_names is not None else opdef.default_outputs
        names = list(output_names) if output_names is not None else []
        base = name or op.lower()
        while len(names) < num_outputs:
            names.append(f"{base}_out{len(names)}" if num_outputs > 1 else base)
        for v in inputs:
            if v is not None and v.graph is not self:
                raise GraphError(f"{op} '{name}': input {v.name!r} belongs to another graph")
        types = (
            list(output_types)
            if output_types is not None
            else infer_node_types(opdef, attrs_obj, list(inputs), num_outputs, where=name or op)
        )
        node = self._new_node(op, domain, attrs_obj, name, len(inputs), names, types)
        for port, v in enumerate(inputs):
            if v is not None:
                self._g.add_edge(v.node, node.id, src_port=v.port, dst_port=port)
        self._notify("add", node)
        return node

    def set_input(self, node: Node, port: int, value: Value | None) -> None:
        """Connect ``value`` to input ``port`` of ``node`` (None disconnects)."""
        if not 0 <= port < node.num_inputs:
            raise GraphError(f"{node.describe()} has no input port {port}")
        for src, _, key, data in list(self._g.in_edges(node.id, keys=True, data=True)):
            if data["dst_port"] == port:
                self._g.remove_edge(src, node.id, key)
        if value is not None:
            if value.node == node.id or nx.has_path(self._g, node.id, value.node):
                raise GraphError(f"connecting {value.name!r} to {node.describe()} creates a cycle")
            self._g.add_edge(value.node, node.id, src_port=value.port, dst_port=port)
        self._notify("rewire", node)

    def set_attrs(self, node: Node, attrs: Any) -> None:
        """Replace a node's attributes (dict or dataclass) and re-infer its types."""
        from compiler.ops.registry import get_op

        node.attrs = get_op(node.op, node.domain).make_attrs(attrs, where=node.name or node.op)
        self._notify("update", node)

    def reinfer(self, node: Node) -> None:
        """Recompute a node's output types from its inputs."""
        from compiler.ops.registry import get_op, infer_node_types

        if node.op in (INPUT_OP, CONSTANT_OP) and not node.domain:
            return
        opdef = get_op(node.op, node.domain)
        node.output_types = infer_node_types(
            opdef, node.attrs, self.inputs_of(node), node.num_outputs, where=node.name or node.op
        )

    def replace_all_uses(self, old: Value, new: Value, *, keep: Iterable[Node] = ()) -> None:
        """Make every consumer of ``old`` (and graph outputs) read ``new`` instead.

        A graph output keeps its public name; ``new`` also takes that name as its
        value name when it is an internal value (not a graph input or output).
        The producer of ``new`` keeps reading ``old`` (so ``y = f(x)`` can be put
        after ``x`` with ``replace_all_uses(x, y)``); so do the nodes in ``keep``.
        """
        if old == new:
            return
        kept = {n.id for n in keep} | {new.node}
        for user, port in self.users(old):
            if user.id not in kept:
                self.set_input(user, port, new)
        if not self.is_output(old):
            return
        key_old, key_new = (old.node, old.port), (new.node, new.port)
        internal = key_new not in self._outputs and new.node not in self._inputs
        self._outputs = [key_new if o == key_old else o for o in self._outputs]
        public = [nm for o, nm in zip(self._outputs, self._output_names, strict=True) if o == key_new]
        if internal and len(public) == 1:
            self.rename(old, self.unique_name(public[0] + "__old"))
            self.rename(new, public[0])

    def rename(self, value: Value, name: str) -> None:
        """Give ``value`` a new unique name."""
        node = self.node(value.node)
        old = node.output_names[value.port]
        if name == old:
            return
        if name in self._names:
            raise GraphError(f"value name {name!r} is already used")
        self._names.discard(old)
        self._names.add(name)
        node.output_names[value.port] = name
        if node.op == INPUT_OP:
            node.name = name

    def remove(self, node: Node) -> None:
        """Delete a node; refuses while any output still has users."""
        if self.has_users(node):
            raise GraphError(f"cannot remove {node.describe()}: it still has users")
        self._g.remove_node(node.id)
        for nm in node.output_names:
            self._names.discard(nm)
        if node.id in self._inputs:
            self._inputs.remove(node.id)
        self._notify("remove", node)

    def set_outputs(self, outputs: Iterable[Value], names: Sequence[str] | None = None) -> None:
        """Set the ordered graph outputs and their public names (default: the value names)."""
        values = list(outputs)
        self._outputs = [(v.node, v.port) for v in values]
        self._output_names = list(names) if names is not None else [v.name for v in values]
        if len(self._output_names) != len(values):
            raise GraphError("set_outputs: names and outputs differ in count")

    # -------------------------------------------------------------------- copies
    def clone(self) -> Graph:
        """A deep structural copy, subgraphs included; constant arrays are shared (they are read-only)."""
        g = Graph(self.name)
        g.metadata = dict(self.metadata)
        g._g = nx.MultiDiGraph()
        for nid in self._g.nodes:
            node: Node = self._g.nodes[nid]["node"]
            g._g.add_node(
                nid,
                node=Node(
                    node.id,
                    node.op,
                    node.domain,
                    clone_attrs(node.attrs),
                    node.name,
                    node.num_inputs,
                    list(node.output_names),
                    list(node.output_types),
                ),
            )
        for u, v, data in self._g.edges(data=True):
            g._g.add_edge(u, v, **copy.deepcopy(data))
        g._next_id = self._next_id
        g._inputs = list(self._inputs)
        g._outputs = list(self._outputs)
        g._output_names = list(self._output_names)
        g._names = set(self._names)
        g._pool = dict(self._pool)
        return g

    def input_types(self) -> Mapping[str, TensorType]:
        """Graph input names to types, in order."""
        return {v.name: v.type for v in self.inputs}
