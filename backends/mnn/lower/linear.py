"""Gemm and MatMul.

With a constant weight, A[..., K] @ W[K, N] (+ bias) becomes MNN's own form of a fully
connected layer, a 1x1 Convolution, so the weight encodings (fp16, int8/int4) apply:
Reshape A to [P, K, 1, 1] -> ConvertTensor to NC4HW4 -> Convolution(K -> N) ->
ConvertTensor to NCHW -> Reshape to [..., N]. Gemm arrives canonical (normalize-gemm:
transA = 0, alpha = beta = 1).
When A is a Reshape/Flatten of a [P, K, 1, 1] tensor (a global pool before the classifier), the
conv reads that tensor directly in NC4HW4 (same values, as [P, K, 1, 1] is A's 4-D form), which
saves two layout copies and two reshapes (the then unread Reshape is dropped from the net).
The packed [P, K, 1, 1] form of A is made once and shared by every fully connected layer that
reads A (attention's query, key and value), and the conv's output is kept as the packed form of
the result (:meth:`LowerContext.rows_view`), which an elementwise lowering (Gelu) or the next fully
connected layer reads without a layout copy; an unread NCHW copy is dropped.
A MatMul of two variable tensors becomes MatMul (2-D) or BatchMatMul.
A constant weight read by several layers (weights tied across layers, as deduplicate-constants
leaves them) would be copied into each layer's Convolution; it is written once, as a Const, and
each layer becomes Reshape -> MatMul(A [P, K], W) (+ bias) -> Reshape, MNN's converter's form
(about 13 % slower per layer than the conv form, observed above, but one copy of the weight).
The [P, K, 1, 1] conv form is also MNN 3.6.1's fastest fully connected kernel (observed, 1 thread,
4 chained 192 -> 192 layers on 197 rows: 258 us per layer, against 271 for a [1, K, P, 1] conv and
293-298 for a MatMul with a constant B, transposed or not; 128 -> 128 on 32 rows: 22.9, 22.7, 26-30).
"""

from __future__ import annotations

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext
from backends.mnn.lower.conv import conv_common, emit_conv
from backends.mnn.lower.elementwise import binary_table
from backends.mnn.lower.registry import Lowering, WeightView
from backends.mnn.model import Table
from backends.mnn.weights import WeightStorage
from compiler.ir.graph import Graph, Node, Value
from passes.normalize_gemm import canonical_gemm_reason
from schemas.mnn.schema import fb

__all__ = ["LOWERINGS", "reshape_table", "gemm_weight", "matmul_weight", "pooled_source", "emit_fc"]


def reshape_table(shape: tuple[int, ...]) -> Table:
    """A Reshape to a static shape (ONNX / NCHW semantics)."""
    return Table(
        "Reshape", {"dims": np.asarray(shape, np.int32), "dimType": Format.NCHW}, force=frozenset({"dimType"})
    )


_FLATTENING = frozenset({"Reshape", "Flatten", "Squeeze"})


def pooled_source(ctx: LowerContext, a_value: Value, rows: int, k: int) -> Value | None:
    """The [rows, k, 1, 1] tensor that ``a_value`` ([rows, k]-shaped) is a reshape of, else None.

    Only for a float tensor that is no graph input or constant, produced by a plain reshape-like
    node; an int8 net (QDQ casts) keeps the general form.
    """
    if ctx.int8_form or a_value.const is not None:
        return None
    producer = ctx.graph.node(a_value.node)
    if producer.op not in _FLATTENING or producer.domain:
        return None
    src = ctx.graph.inputs_of(producer)[0]
    if src is None or src.const is not None or not src.type.dtype.is_float:
        return None
    if ctx.graph.node(src.node).op == "Input" or ctx.shape(src) != (rows, k, 1, 1):
        return None
    return src


def emit_fc(
    ctx: LowerContext,
    node: Node,
    a_value: Value,
    view: WeightView,
    bias: np.ndarray,
    storage: WeightStorage | None = None,
) -> None:
    """out = A @ rows.T + bias through a 1x1 conv; ``view.rows`` is [N, K] (stored as planned, or
    as ``storage`` says: e.g. kiln::WeightOnlyMatMul's own integer levels and scales)."""
    name = ctx.op_name(node)
    value = ctx.graph.value(node)
    a_shape = ctx.shape(a_value)
    n, k = view.rows.shape
    rows = int(np.prod(a_shape[:-1], dtype=np.int64))
    src = pooled_source(ctx, a_value, rows, k)
    view_of_a = None if ctx.int8_form else ctx.rows_view(a_value)
    if view_of_a is not None:
        packed = view_of_a
    elif src is not None:
        packed = ctx.tensor(src, Format.NC4HW4)
    else:
        a = ctx.tensor(a_value, Format.NCHW)
        flat = ctx.temp(f"{value.name}__in4d")
        ctx.emit("Reshape", f"{name}__in4d", [a], [flat], reshape_table((rows, k, 1, 1)))
        packed = ctx.convert(flat, Format.NCHW, Format.NC4HW4, f"{value.name}__in4d{Format.NC4HW4.suffix}")
        if not ctx.int8_form:
            ctx.set_rows_view(a_value, packed)
    conv_out = ctx.temp(f"{value.name}__fc")
    common = conv_common((1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, n, k)
    emit_conv(ctx, node, "Convolution", name, packed, conv_out, common, view, bias, storage)
    if not ctx.int8_form:
        ctx.set_rows_view(value, conv_out)
    plain = ctx.convert(conv_out, Format.NC4HW4, Format.NCHW, f"{value.name}__fc{Format.NCHW.suffix}")
    out = ctx.define(value, Format.NCHW)
    ctx.emit("Reshape", f"{name}__out", [plain], [out], reshape_table(ctx.shape(value)))


def _float(node: Node) -> str | None:
    return None if node.output_types[0].dtype.is_float else "float tensors only"


def tied_weight(graph: Graph, node: Node) -> bool:
    """True when the node's constant weight (input 1) is read by another node too."""
    b = graph.inputs_of(node)[1]
    return b is not None and b.const is not None and len({n.id for n, _ in graph.users(b)}) > 1


def _emit_tied(
    ctx: LowerContext, node: Node, a_value: Value, b_value: Value, trans_b: bool, bias: np.ndarray | None
) -> None:
    """out = A @ B (B^T with ``trans_b``) (+ bias) with B one shared Const: Reshape, MatMul, Reshape."""
    name = ctx.op_name(node)
    value = ctx.graph.value(node)
    a_shape = ctx.shape(a_value)
    k = a_shape[-1]
    rows = int(np.prod(a_shape[:-1], dtype=np.int64))
    a = ctx.tensor(a_value, Format.NCHW)
    flat = ctx.temp(f"{value.name}__in2d")
    ctx.emit("Reshape", f"{name}__in2d", [a], [flat], reshape_table((rows, k)))
    b = ctx.tensor(b_value, Format.NCHW)
    param = Table("MatMul", {"T": fb.DataType.DT_FLOAT, "transposeA": False, "transposeB": bool(trans_b)})
    prod = ctx.temp(f"{value.name}__mm")
    ctx.emit("MatMul", name, [flat, b], [prod], param)
    if bias is not None and np.any(bias):
        biased = ctx.temp(f"{value.name}__bias")
        c = ctx.const_tensor(np.asarray(bias, np.float32), f"{value.name}__b")
        ctx.emit("BinaryOp", f"{name}__bias", [prod, c], [biased], binary_table(fb.BinaryOpOperation.ADD))
        prod = biased
    out = ctx.define(value, Format.NCHW)
    ctx.emit("Reshape", f"{name}__out", [prod], [out], reshape_table(ctx.shape(value)))


# ------------------------------------------------------------------------ Gemm
def _check_gemm(graph: Graph, node: Node) -> str | None:
    if (reason := _float(node)) is not None:
        return reason
    ins = graph.inputs_of(node)
    b = ins[1]
    c = ins[2] if len(ins) > 2 else None
    assert b is not None
    if (reason := canonical_gemm_reason(node)) is not None:
        return reason
    if b.const is None:
        return "B must be constant"
    n = node.output_types[0].static_shape[1]
    if c is not None and (
        c.const is None or c.const.size not in (1, n) or c.const.shape[-1:] not in ((1,), (n,), ())
    ):
        return "C must be a constant of N values"
    return None


def _gemm_view(graph: Graph, node: Node) -> WeightView | None:
    return None if tied_weight(graph, node) else gemm_weight(graph, node)


def gemm_weight(graph: Graph, node: Node) -> WeightView:
    """Gemm (canonical: alpha = 1): rows = B^T ([N, K]; B as given when transB)."""
    b_value = graph.inputs_of(node)[1]
    assert b_value is not None and b_value.const is not None
    trans_b = node.attrs.transB
    b = b_value.const.astype(np.float32)
    rows = np.ascontiguousarray(b if trans_b else b.T, np.float32)

    def restore(r: np.ndarray) -> np.ndarray:
        return r if trans_b else np.ascontiguousarray(r.T)

    return WeightView(1, rows, restore, rows.shape[1], 1)


def _lower_gemm(ctx: LowerContext, node: Node) -> None:
    ins = ctx.graph.inputs_of(node)
    a_value, b_value = ins[0], ins[1]
    assert a_value is not None and b_value is not None
    n = node.output_types[0].static_shape[-1]
    c_value = ins[2] if len(ins) > 2 else None
    bias = np.zeros(n, np.float32)
    if c_value is not None and c_value.const is not None:
        c = c_value.const.astype(np.float32).reshape(-1)
        bias = np.broadcast_to(c, (n,))
    if tied_weight(ctx.graph, node):
        _emit_tied(ctx, node, a_value, b_value, bool(node.attrs.transB), np.asarray(bias, np.float32))
        return
    emit_fc(ctx, node, a_value, gemm_weight(ctx.graph, node), np.asarray(bias, np.float32))


# ---------------------------------------------------------------------- MatMul
def _check_matmul(graph: Graph, node: Node) -> str | None:
    if (reason := _float(node)) is not None:
        return reason
    a, b = graph.inputs_of(node)
    assert a is not None and b is not None
    ra, rb = len(a.type.static_shape), len(b.type.static_shape)
    if b.const is not None:
        return None if rb == 2 and ra >= 2 else "constant B must be 2-D and A at least 2-D"
    if ra == rb == 2:
        return None
    if ra == rb and ra > 2 and a.type.static_shape[:-2] == b.type.static_shape[:-2]:
        return None
    return "batched MatMul needs equal batch dims"


def matmul_weight(graph: Graph, node: Node) -> WeightView:
    """MatMul with a constant B [K, N]: rows = B^T."""
    b_value = graph.inputs_of(node)[1]
    assert b_value is not None and b_value.const is not None
    rows = np.ascontiguousarray(b_value.const.astype(np.float32).T)
    return WeightView(1, rows, lambda r: np.ascontiguousarray(r.T), rows.shape[1], 1)


def _matmul_view(graph: Graph, node: Node) -> WeightView | None:
    b_value = graph.inputs_of(node)[1]
    if b_value is None or b_value.const is None or tied_weight(graph, node):
        return None
    return matmul_weight(graph, node)


def _lower_matmul(ctx: LowerContext, node: Node) -> None:
    a_value, b_value = ctx.graph.inputs_of(node)
    assert a_value is not None and b_value is not None
    if b_value.const is not None and tied_weight(ctx.graph, node):
        _emit_tied(ctx, node, a_value, b_value, False, None)
        return
    if b_value.const is not None:
        view = matmul_weight(ctx.graph, node)
        emit_fc(ctx, node, a_value, view, np.zeros(view.rows.shape[0], np.float32))
        return
    a = ctx.tensor(a_value, Format.NCHW)
    b = ctx.tensor(b_value, Format.NCHW)
    out = ctx.define(ctx.graph.value(node), Format.NCHW)
    if len(ctx.shape(a_value)) == 2:
        param = Table("MatMul", {"T": fb.DataType.DT_FLOAT, "transposeA": False, "transposeB": False})
        ctx.emit("MatMul", ctx.op_name(node), [a, b], [out], param)
    else:
        ctx.emit("BatchMatMul", ctx.op_name(node), [a, b], [out], Table("BatchMatMulParam", {}))


LOWERINGS: dict[str, Lowering] = {
    "Gemm": Lowering(_lower_gemm, _check_gemm, _gemm_view),
    "MatMul": Lowering(_lower_matmul, _check_matmul, _matmul_view),
}
