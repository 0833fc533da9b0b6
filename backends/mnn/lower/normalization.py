"""LayerNormalization and RMSNormalization -> MNN's own LayerNorm op (OpType 603, param ``LayerNorm``).

MNN 3.6.1's CPU kernel (``CPULayerNorm``, reported under its own type by the per-op
callback) normalizes over the last ``len(axis)`` axes of an NCHW tensor:
mean = Σx / n, var = Σ(x - mean)² / n, y = (x - mean) / sqrt(var + epsilon) * gamma + beta,
with ``gamma``/``beta`` one float per normalized element (both or neither). Kiln writes
``axis = [axis, ..., rank - 1]`` (only its length is read), ONNX's scale and bias
broadcast to the normalized shape and flattened (a zero ``beta`` when B is absent), and
``group`` 1. Refused (the ``layer-norm`` decomposition then applies): a non-constant
scale or bias, a used Mean/InvStdDev output, a non-float32 input.

RMSNormalization (``fuse-rms-norm`` finds the decomposed form, T5's Pow / ReduceMean / Add /
Sqrt / Div / Mul) is the same op with ``useRMSNorm = true``, as MNN's converter writes it:
y = x / sqrt(Σx² / n + epsilon) * gamma (+ beta, written as zeros; no mean is subtracted).
MNN's decomposed form costs six ops, one of them a general ``POW`` (x²: 24 us of T5's 0.3 ms).
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.registry import Lowering
from backends.mnn.model import Table
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType
from compiler.ops.shapes import normalize_axis

__all__ = ["LOWERINGS"]


def _check_layer_norm(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    x = ins[0]
    assert x is not None
    if x.type.dtype != DType.FLOAT32:
        return "float32 input only"
    if any(v is not None and v.const is None for v in ins[1:]):
        return "scale and bias must be constant"
    if any(
        graph.users(graph.value(node, p)) or graph.is_output(graph.value(node, p))
        for p in range(1, node.num_outputs)
    ):
        return "the Mean / InvStdDev outputs"
    return None


def _lower_layer_norm(ctx: LowerContext, node: Node) -> None:
    _emit_norm(ctx, node, rms=False)


def _lower_rms_norm(ctx: LowerContext, node: Node) -> None:
    _emit_norm(ctx, node, rms=True)


def _emit_norm(ctx: LowerContext, node: Node, rms: bool) -> None:
    """One LayerNorm op over the axes [axis, rank) (``rms``: without the mean, no B input)."""
    ins = ctx.graph.inputs_of(node)
    x_value, scale_value = ins[0], ins[1]
    assert x_value is not None and scale_value is not None and scale_value.const is not None
    bias_value = ins[2] if len(ins) > 2 and not rms else None
    shape = ctx.shape(x_value)
    axis = normalize_axis(node.attrs.axis, len(shape))
    inner = shape[axis:]
    gamma = np.broadcast_to(scale_value.const.astype(np.float32), inner).reshape(-1)
    beta = np.zeros_like(gamma)
    if bias_value is not None and bias_value.const is not None:
        beta = np.broadcast_to(bias_value.const.astype(np.float32), inner).reshape(-1)
    fields: dict[str, object] = {
        "axis": np.arange(axis, len(shape), dtype=np.int32),
        "epsilon": float(node.attrs.epsilon),
        "gamma": np.ascontiguousarray(gamma),
        "beta": np.ascontiguousarray(beta),
    }
    if rms:
        fields["useRMSNorm"] = True
    x = ctx.tensor(x_value, Format.NCHW)
    out = ctx.define(ctx.graph.value(node), Format.NCHW)
    ctx.emit(
        "LayerNorm", ctx.op_name(node), [x], [out], Table("LayerNorm", fields, force=frozenset({"epsilon"}))
    )


def _check_rms_norm(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    x = ins[0]
    assert x is not None
    if x.type.dtype != DType.FLOAT32:
        return "float32 input only"
    if len(ins) < 2 or ins[1] is None or ins[1].const is None:
        return "scale must be constant"
    return None


LOWERINGS: dict[str, Lowering] = {
    "LayerNormalization": Lowering(_lower_layer_norm, _check_layer_norm),
    "RMSNormalization": Lowering(_lower_rms_norm, _check_rms_norm),
}
