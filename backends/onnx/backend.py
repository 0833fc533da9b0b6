"""The ONNX backend object (``--emit onnx``): ``model.onnx`` through :mod:`compiler.onnx_export`.

Its artifacts run in onnxruntime, the default runner of :mod:`compiler.runners` (``runtime``
None). It needs no legalization and no static shapes; it writes every default-domain op of the
op registry as itself, and a Kiln-domain op (``kiln::FusedConv``, ``kiln::QConv``...) only
through its ``OpDef.expand`` into standard ops (or onnxruntime's ``com.microsoft`` ops, which it
writes as they are): one without an expansion has no ONNX form.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
import onnx.defs

from compiler.backend import Artifact, BackendBase, CapabilityTable, OpSupport
from compiler.ops.matmul_nbits import RUNTIME_DOMAINS
from compiler.ops.registry import OpDef, all_ops

if TYPE_CHECKING:
    from compiler.ir.graph import Graph, Node
    from compiler.pass_infra import PassContext

__all__ = ["BACKEND", "OnnxBackend", "onnx_table"]


@cache
def onnx_table() -> CapabilityTable[OpDef]:
    """Every registered op the exporter can write (``lower`` is its OpDef; dynamic shapes allowed):
    default-domain ops, Kiln ops with an expansion and onnxruntime's contrib ops (written as they are).

    A default-domain op is checked against its ONNX schema at the opset it is exported at: an
    element type that schema does not allow (Celu on float16 before opset 28) has no ONNX form.
    """
    entries = {
        d.qualified: OpSupport(d, None if d.domain else _schema_dtype_check)
        for d in all_ops()
        if not d.domain or d.expand is not None or d.domain in RUNTIME_DOMAINS
    }
    return CapabilityTable("onnx", entries, requires_static=False)


_Formals = tuple[tuple[str, "frozenset[int] | None", bool], ...]  # (name, allowed dtype codes, variadic)


@cache
def _schema_formals(op: str, opset: int) -> tuple[int, _Formals, _Formals] | None:
    """(since_version, inputs, outputs) of the ONNX schema of ``op`` at ``opset``; None if there is none."""
    try:
        schema = onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None
    allowed = {c.type_param_str: _codes(c.allowed_type_strs) for c in schema.type_constraints}

    def formals(params: Sequence[onnx.defs.OpSchema.FormalParameter]) -> _Formals:
        variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
        out = []
        for p in params:
            codes = allowed[p.type_str] if p.type_str in allowed else _codes([p.type_str])
            out.append((p.name, codes, p.option == variadic))
        return tuple(out)

    return int(schema.since_version), formals(schema.inputs), formals(schema.outputs)


def _codes(type_strs: Sequence[str]) -> frozenset[int] | None:
    """The element type codes of ``tensor(...)`` type strings (None: something else is allowed too)."""
    codes = set()
    for t in type_strs:
        if not (t.startswith("tensor(") and t.endswith(")")):
            return None
        codes.add(int(onnx.TensorProto.DataType.Value(t[7:-1].upper())))
    return frozenset(codes)


def _formal(formals: _Formals, i: int) -> tuple[str, frozenset[int] | None, bool] | None:
    if i < len(formals):
        return formals[i]
    return formals[-1] if formals and formals[-1][2] else None


def _schema_dtype_check(graph: Graph, node: Node) -> str | None:
    """Why the ONNX schema of ``node`` at its export opset refuses its element types, or None."""
    from compiler.onnx_export import EXPORT_OPSET
    from compiler.ops.registry import get_op

    opset = max(EXPORT_OPSET, get_op(node.op).min_opset)
    found = _schema_formals(node.op, opset)
    if found is None:
        return None
    since, ins, outs = found
    values = [("input", i, v.type.dtype) for i, v in enumerate(graph.inputs_of(node)) if v is not None]
    values += [("output", i, t.dtype) for i, t in enumerate(node.output_types)]
    for kind, i, dtype in values:
        formal = _formal(ins if kind == "input" else outs, i)
        if formal is not None and formal[1] is not None and int(dtype.value) not in formal[1]:
            return (
                f"{dtype.name.lower()} {kind} {i} ({formal[0]}) is not supported by ONNX "
                f"{node.op}-{since} (exported at opset {opset})"
            )
    return None


class OnnxBackend(BackendBase):
    """``model.onnx`` (IR 10, opset 21), run by onnxruntime."""

    def capabilities(self, target: str) -> CapabilityTable[OpDef]:
        """The ops the ONNX exporter writes (:func:`onnx_table`)."""
        return onnx_table()

    def emit(self, graph: Graph, out_dir: Path, ctx: PassContext, target: str) -> list[Artifact]:
        """Export the optimized graph to ``out_dir/model.onnx`` (see :mod:`backends.onnx.emit`)."""
        from backends.onnx.emit import emit_onnx

        return emit_onnx(graph, out_dir, ctx.options)


BACKEND = OnnxBackend(name="onnx", flag="--emit", runtime=None, legalization_pipeline="legalize-onnx")
