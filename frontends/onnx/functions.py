"""Expand ONNX function ops Kiln has no converter for into their schema's function body.

Many ONNX ops are defined as functions of others (NegativeLogLikelihoodLoss,
CenterCropPad, GroupNormalization, the window functions...). A node of such an op that no Kiln
converter handles at the model's opset is replaced by its body, exactly as ONNX defines it:

* the body is the schema's function at the model's opset, or its *context-dependent* function,
  built from the node and its inputs' types (from ``onnx.shape_inference``);
* attributes the node leaves out take the schema's defaults first (a body reads them by
  reference, and an absent reference would drop the attribute, not default it);
* each node becomes a model-local function of its own (domain :data:`EXPAND_DOMAIN`), which
  ``onnx.inliner`` inlines with unique names, converting a body written for an older opset to
  the model's; a body may hold further function ops (SoftmaxCrossEntropyLoss calls
  NegativeLogLikelihoodLoss), so this repeats, at most :data:`MAX_ROUNDS` times.

Only top-level nodes are expanded. Whatever cannot be expanded (no function, shape inference
or the inliner fails) stays as it is, and the importer reports the op as unsupported.
"""

from __future__ import annotations

import logging
from typing import Any

import onnx
import onnx.defs
import onnx.inliner
import onnx.shape_inference

from frontends.onnx.converter import DEFAULT_DOMAIN, find_converter

__all__ = ["expand_functions", "EXPAND_DOMAIN", "MAX_ROUNDS"]

logger = logging.getLogger(__name__)

EXPAND_DOMAIN = "kiln.expand"
MAX_ROUNDS = 4


def _domain(d: str) -> str:
    return DEFAULT_DOMAIN if d in ("", "ai.onnx") else d


def _unconverted(model: onnx.ModelProto) -> list[int]:
    """Indices of top-level nodes no Kiln converter handles at the model's opset."""
    opsets = {_domain(o.domain): int(o.version) for o in model.opset_import}
    out = []
    for i, node in enumerate(model.graph.node):
        dom = _domain(node.domain)
        if dom in opsets and find_converter(dom, node.op_type, opsets[dom]) is None:
            out.append(i)
    return out


def _body(
    node: onnx.NodeProto, opset: int, types: dict[str, onnx.TypeProto]
) -> tuple[onnx.NodeProto, onnx.FunctionProto] | None:
    """``node`` with its missing attributes set to their defaults, and its function body at ``opset``."""
    try:
        schema: Any = onnx.defs.get_schema(node.op_type, opset, node.domain)  # stubs lack the function API
    except onnx.defs.SchemaError:
        return None
    given = {a.name for a in node.attribute}
    node = _copy(node)
    for name, attr in sorted(schema.attributes.items()):
        if name not in given and attr.default_value.type != onnx.AttributeProto.UNDEFINED:
            default = node.attribute.add()
            default.CopyFrom(attr.default_value)
            default.name = name
    if schema.has_function and opset >= min(schema.function_opset_versions):
        data = schema.get_function_with_opset_version(opset)
    elif schema.has_context_dependent_function and all(not x or x in types for x in node.input):
        ins = [(types[x] if x else onnx.TypeProto()).SerializeToString() for x in node.input]
        data = schema.get_context_dependent_function_with_opset_version(opset, node.SerializeToString(), ins)
    else:
        return None
    if not data:
        return None
    body = onnx.FunctionProto()
    body.ParseFromString(data)
    return (node, body) if body.node else None


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


def _expand_once(model: onnx.ModelProto, todo: list[int], counter: int) -> tuple[onnx.ModelProto, int]:
    """One round: every expandable node in ``todo`` through one model-local function each."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {vi.name: vi.type for vi in (*g.input, *g.value_info, *g.output)}
    for t in g.initializer:
        types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    opsets = {_domain(o.domain): int(o.version) for o in out.opset_import}
    expanded = 0
    for i in todo:
        node = out.graph.node[i]
        found = _body(node, opsets[_domain(node.domain)], types)
        if found is None:
            continue
        node.CopyFrom(found[0])
        body = found[1]
        counter += 1
        expanded += 1
        body.domain, body.name = EXPAND_DOMAIN, f"{node.op_type}_{counter}"
        node.domain, node.op_type = body.domain, body.name
        out.functions.append(body)
    if not expanded:
        return model, counter
    if EXPAND_DOMAIN not in opsets:
        out.opset_import.append(onnx.helper.make_opsetid(EXPAND_DOMAIN, 1))
    out = onnx.inliner.inline_local_functions(out, convert_version=True)  # bodies at the model opset
    kept = [o for o in out.opset_import if o.domain != EXPAND_DOMAIN]
    del out.opset_import[:]
    out.opset_import.extend(kept)
    return out, counter


def expand_functions(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    """``model`` with its unconverted function ops expanded (see the module docstring)."""
    counter = 0
    for _ in range(MAX_ROUNDS):
        todo = _unconverted(model)
        if not todo:
            break
        try:
            expanded, counter = _expand_once(model, todo, counter)
        except Exception as exc:  # noqa: BLE001 - shape inference or the inliner: keep the ops as they are
            logger.info("%s: cannot expand function ops: %s", source, exc)
            break
        if expanded is model:  # nothing left that has a function body
            break
        model = expanded
    return model
