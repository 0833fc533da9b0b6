"""Export a Kiln Graph to an ONNX ModelProto (IR 10, default-domain opset 21).

* Constants become initializers named by their value names; graph inputs and
  outputs carry their types (symbolic dims as ``dim_param``) in value_info.
* Attributes: only non-default values (``OpDef.non_default_attrs``), typed by
  the attrs dataclass's field hints (ints, floats, strings, tuples, tensors).
* Absent optional inputs are ``""``; trailing ones are dropped.
* Optional outputs nobody reads (ports from ``OpDef.outputs[0]`` on, not variadic)
  are ``""`` too; trailing ones are dropped (a node keeps at least its first output).
* A control-flow node's subgraphs become its GRAPH attributes; its captured inputs are
  not written as node inputs: the subgraph reads those outer names directly (ONNX's
  implicit outer-scope references), and a subgraph value that would shadow an outer
  name is renamed.
* Kiln-domain ops are rewritten into standard ops with ``OpDef.expand`` on a
  clone; one without an expansion is an error. Ops of onnxruntime's contrib domain
  (``com.microsoft``, e.g. the MatMulNBits that ``kiln::WeightOnlyMatMul`` expands into) are
  written as they are, with an opset import of that domain at version 1.
* The declared default-domain opset is the requested one, raised to the newest
  ``OpDef.min_opset`` of the graph's ops (e.g. 23 for RMSNormalization).
* Graph outputs keep their public names (``Graph.output_names``). Every ONNX
  output is produced by a node: a constant output keeps its name on
  an Identity (its initializer becomes ``<name>__const``); a graph input or a
  repeated output gets an Identity named ``<name>_out``.

Export is deterministic: nodes go in the graph's lexicographic topological order
and the model is serialized with ``deterministic=True``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compiler.errors import ConversionError
from compiler.ir.graph import CONSTANT_OP, INPUT_OP, Graph, Node, Value, subgraph_attrs
from compiler.ir.types import DType, TensorType
from compiler.ops.matmul_nbits import RUNTIME_DOMAINS
from compiler.ops.registry import get_op

__all__ = ["export_onnx", "save_onnx", "model_bytes", "EXPORT_IR_VERSION", "EXPORT_OPSET"]

logger = logging.getLogger(__name__)

EXPORT_IR_VERSION = 10
EXPORT_OPSET = 21
_EXPAND_ROUNDS = 8


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    shape = None if t.shape is None else [d if isinstance(d, int) else str(d) for d in t.shape]
    return helper.make_tensor_value_info(name, int(t.dtype), shape)


def _tensor(array: np.ndarray, dtype: DType, name: str) -> onnx.TensorProto:
    if dtype is DType.BFLOAT16:
        arr = np.asarray(array, dtype=np.uint16, order="C")
        return helper.make_tensor(name, onnx.TensorProto.BFLOAT16, arr.shape, arr.tobytes(), raw=True)
    if dtype is DType.STRING:
        vals: list[Any] = [str(s).encode() for s in array.reshape(-1)]
        return helper.make_tensor(name, onnx.TensorProto.STRING, array.shape, vals)
    return numpy_helper.from_array(np.asarray(array, dtype=dtype.numpy, order="C"), name)


def _hint_kind(hint: Any) -> str:
    """'int', 'float', 'str', 'ints', 'floats', 'strs', 'tensor' or '' (infer from the value)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _hint_kind(inner[0]) if len(inner) == 1 else ""
    if origin is tuple:
        elem = _hint_kind(args[0]) if args else ""
        return elem + "s" if elem in ("int", "float", "str") else ""
    if hint is np.ndarray:
        return "tensor"
    if isinstance(hint, type) and issubclass(hint, bool | int):
        return "int"
    if hint is float:
        return "float"
    if hint is str:
        return "str"
    return ""


def _attribute(name: str, value: Any, kind: str, where: str) -> onnx.AttributeProto:
    A = onnx.AttributeProto
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, np.ndarray) or kind == "tensor":
        arr = np.asarray(value)
        return helper.make_attribute(name, _tensor(arr, DType.from_numpy(arr.dtype), ""))
    if isinstance(value, tuple | list):
        items = [v.value if isinstance(v, enum.Enum) else v for v in value]
        if not kind:
            kind = (
                "floats"
                if any(isinstance(v, float) for v in items)
                else ("strs" if any(isinstance(v, str) for v in items) else "ints")
            )
        if kind == "ints":
            return helper.make_attribute(name, [int(v) for v in items], attr_type=A.INTS)
        if kind == "floats":
            return helper.make_attribute(name, [float(v) for v in items], attr_type=A.FLOATS)
        if kind == "strs":
            return helper.make_attribute(name, [str(v).encode() for v in items], attr_type=A.STRINGS)
        raise ConversionError(f"{where}: attribute {name} has an unsupported list type")
    if kind == "float" or (not kind and isinstance(value, float)):
        return helper.make_attribute(name, float(value), attr_type=A.FLOAT)
    if kind == "int" or (not kind and isinstance(value, int | np.integer)):
        return helper.make_attribute(name, int(value), attr_type=A.INT)
    if kind == "str" or isinstance(value, str | bytes):
        data = value if isinstance(value, bytes) else str(value).encode()
        return helper.make_attribute(name, data, attr_type=A.STRING)
    raise ConversionError(f"{where}: attribute {name}={value!r} has no ONNX attribute type")


def _attributes(node: Node) -> list[onnx.AttributeProto]:
    opdef = get_op(node.op, node.domain)
    fields = dataclasses.fields(node.attrs) if dataclasses.is_dataclass(node.attrs) else ()
    own = {f.name for f in fields if f.metadata.get("kiln_only")}  # Kiln's own fields (captures)
    values = {
        k: v
        for k, v in opdef.non_default_attrs(node.attrs).items()
        if k not in own and not isinstance(v, Graph)
    }
    if not values:
        return []
    hints = typing.get_type_hints(type(node.attrs)) if dataclasses.is_dataclass(node.attrs) else {}
    out = []
    for name, value in values.items():
        if value is None:
            continue
        out.append(_attribute(name, value, _hint_kind(hints.get(name)), node.describe()))
    return out


def _expand_custom(graph: Graph) -> Graph:
    """A clone of ``graph`` in which every Kiln-domain op is expanded into standard (or onnxruntime) ops."""
    if not any(n.domain not in RUNTIME_DOMAINS for n in graph.nodes() if n.domain):
        return graph
    g = graph.clone()
    for _ in range(_EXPAND_ROUNDS):
        custom = [n for n in g.nodes() if n.domain and n.domain not in RUNTIME_DOMAINS]
        if not custom:
            return g
        for node in custom:
            opdef = get_op(node.op, node.domain)
            if opdef.expand is None:
                raise ConversionError(
                    f"{node.describe()}: op {node.qualified_op} has no expansion into standard ONNX ops"
                )
            new = opdef.expand(g, node)
            old = g.outputs_of(node)
            if g.has_node(node.id):
                for o, n in zip(old, new, strict=False):
                    g.replace_all_uses(o, n)
                if not g.has_users(node):
                    feeders = [v for v in g.inputs_of(node) if v is not None]
                    g.remove(node)
                    _drop_unread_constants(g, feeders)
    raise ConversionError(
        f"graph {graph.name!r}: Kiln-domain ops still present after {_EXPAND_ROUNDS} rounds of expansion"
    )


def _drop_unread_constants(g: Graph, values: list[Value]) -> None:
    """Remove the constants among ``values`` that nothing reads any more (an expansion that
    re-encodes its weights, e.g. packed MatMulNBits blobs, leaves the originals unread)."""
    for v in values:
        if not g.has_node(v.node):
            continue
        producer = g.node(v.node)
        unread = producer.op == CONSTANT_OP and not producer.domain and not g.has_users(producer)
        if unread and not any(o.node == producer.id for o in g.outputs):
            g.remove(producer)


def export_onnx(graph: Graph, *, opset: int = EXPORT_OPSET) -> onnx.ModelProto:
    """Export ``graph`` as an ONNX model that passes ``onnx.checker`` (full check) and runs in onnxruntime.

    Args:
        graph: the graph to export (not modified).
        opset: the default-domain opset to declare (21 or newer; Kiln ops have opset-21 semantics).

    Raises:
        ConversionError: a Kiln-domain op has no expansion, or an attribute has no ONNX type.
    """
    if opset < EXPORT_OPSET:
        raise ValueError(f"export to opset {opset} is not supported (Kiln emits opset {EXPORT_OPSET} forms)")
    g = _expand_custom(graph)
    model_graph, domains, ops = _graph_proto(g, g.name or "main", set(), {})
    opset = max([opset] + [get_op(op).min_opset for op in ops])
    opsets = [helper.make_operatorsetid("", opset)]
    opsets += [helper.make_operatorsetid(d, 1) for d in sorted(domains)]
    model = helper.make_model(
        model_graph, opset_imports=opsets, ir_version=EXPORT_IR_VERSION, producer_name="kiln"
    )
    for key in sorted(graph.metadata):
        prop = model.metadata_props.add()
        prop.key, prop.value = f"kiln.{key}", str(graph.metadata[key])
    return model


def _graph_proto(
    g: Graph, name: str, outer: set[str], alias: dict[int, str]
) -> tuple[onnx.GraphProto, set[str], set[str]]:
    """One graph (or subgraph) as a GraphProto, with the domains and default-domain ops it uses.

    ``outer`` holds the names of enclosing scopes (a subgraph value that would shadow one is
    renamed); ``alias`` maps a subgraph's capture inputs (node ids) to the outer names they
    read, so captures are written back as ONNX's implicit outer-scope references.
    """
    taken = set(outer) | {v.name for v in g.inputs} | {o for n in g.nodes() for o in n.output_names}
    renamed = _renamed_constants(g, taken)
    names: dict[tuple[int, int], str] = {}
    for node in g.nodes():
        for port, nm in enumerate(node.output_names):
            if node.id in alias:
                names[(node.id, port)] = alias[node.id]
            elif node.id in renamed:
                names[(node.id, port)] = renamed[node.id]
            else:
                names[(node.id, port)] = _fresh(nm, taken) if nm in outer else nm
    inputs = [_value_info(names[(v.node, 0)], v.type) for v in g.inputs if v.node not in alias]
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    domains: set[str] = set()
    ops: set[str] = set()
    for node in g.nodes():
        if node.op == INPUT_OP and not node.domain:
            continue
        if node.op == CONSTANT_OP and not node.domain:
            initializers.append(_tensor(node.attrs.value, node.output_types[0].dtype, names[(node.id, 0)]))
            continue
        n_in = node.num_inputs - int(getattr(node.attrs, "captures", 0) if node.subgraphs else 0)
        ins = ["" if v is None else names[(v.node, v.port)] for v in g.inputs_of(node)[:n_in]]
        while ins and not ins[-1]:
            ins.pop()
        if node.domain:
            domains.add(node.domain)
        else:
            ops.add(node.op)
        outs = [names[(node.id, p)] if nm else "" for p, nm in enumerate(_output_names(g, node))]
        proto = helper.make_node(node.op, ins, outs, name=node.name or None, domain=node.domain or None)
        proto.attribute.extend(_attributes(node))
        for attr, sub in subgraph_attrs(node.attrs):
            caps = node.num_inputs - n_in
            formal = len(sub.inputs) - caps
            bound = g.inputs_of(node)[n_in:]
            sub_alias = {
                sub.inputs[formal + k].node: names[(v.node, v.port)]
                for k, v in enumerate(bound)
                if v is not None
            }
            sub_proto, sub_domains, sub_ops = _graph_proto(sub, attr, taken, sub_alias)
            taken |= {vi.name for vi in sub_proto.input} | {o for n in sub_proto.node for o in n.output}
            proto.attribute.append(helper.make_attribute(attr, sub_proto))
            domains |= sub_domains
            ops |= sub_ops
        nodes.append(proto)
    outputs = _outputs(g, nodes, names, set(renamed), taken, outer)
    return helper.make_graph(nodes, name, inputs, outputs, initializer=initializers), domains, ops


def _output_names(g: Graph, node: Node) -> list[str]:
    """The node's output names; an unread optional output is ``""`` and trailing ones are dropped."""
    lo, hi = get_op(node.op, node.domain).outputs
    names = list(node.output_names)
    if hi < 0:  # variadic outputs (Split) are not optional
        return names
    for port, v in enumerate(g.outputs_of(node)):
        if port >= lo and not g.users(v) and not g.is_output(v):
            names[port] = ""
    while names and not names[-1]:
        names.pop()
    return names or node.output_names[:1]


def _renamed_constants(g: Graph, taken: set[str]) -> dict[int, str]:
    """Initializer names for constants that are graph outputs (the output name goes to an Identity)."""
    out: dict[int, str] = {}
    for v in g.outputs:
        producer = g.node(v.node)
        if producer.op == CONSTANT_OP and not producer.domain and v.node not in out:
            out[v.node] = _fresh(f"{v.name}__const", taken)
    return out


def _outputs(
    g: Graph,
    nodes: list[onnx.NodeProto],
    names: dict[tuple[int, int], str],
    renamed: set[int],
    taken: set[str],
    outer: set[str],
) -> list[onnx.ValueInfoProto]:
    """Graph outputs; Identity nodes give constants, inputs and repeated values an output of their own."""
    seen: set[tuple[int, int]] = set()
    input_ids = {i.node for i in g.inputs}
    out = []
    for v, public in zip(g.outputs, g.output_names, strict=True):
        key = (v.node, v.port)
        src = names[key]
        direct = public == src and key not in seen and v.node not in input_ids and v.node not in renamed
        name = public
        if not direct:
            shadows = name in outer or (name in taken and name != v.name)
            if shadows or key in seen or (v.node in input_ids and name == v.name):
                name = _fresh(f"{public}_out", taken)
            taken.add(name)
            nodes.append(helper.make_node("Identity", [src], [name], name=name))
        seen.add(key)
        out.append(_value_info(name, v.type))
    return out


def _fresh(base: str, taken: set[str]) -> str:
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def model_bytes(model: onnx.ModelProto) -> bytes:
    """The model serialized deterministically."""
    return model.SerializeToString(deterministic=True)


def save_onnx(graph: Graph, path: str | os.PathLike[str], *, opset: int = EXPORT_OPSET) -> Path:
    """Export ``graph`` and write it to ``path`` atomically (temporary file, then rename)."""
    p = Path(path)
    data = model_bytes(export_onnx(graph, opset=opset))
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    logger.info("wrote %s (%d bytes)", p, len(data))
    return p
