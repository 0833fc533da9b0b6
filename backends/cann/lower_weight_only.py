"""kiln::WeightOnlyMatMul -> AscendAntiQuant of the int4/int8 levels feeding BatchMatMulV2.

The reference (``shared/reference/cann/NOTES.md``, ``schemas/cann``) documents no fused weight-only
matrix product: no WeightQuantBatchMatmulV2 with per-group antiquant_scale / antiquant_offset.
It documents ``AscendAntiQuant`` (y = (x + offset) · scale, one scale and offset per tensor) and
``BatchMatMulV2``, so the op is written with those, keeping the levels in WEIGHTS_DATA:

    L = Const(Qᵀ [n_blocks, bs, N], DT_INT8, or DT_INT4 when bits = 4)  (K padded with the zero point)
    W = Reshape((AscendAntiQuant(L; scale 1, offset 0) - z₃) · s₃, [n_blocks · bs, N])[:K]
    Y = BatchMatMulV2(A, W) (+ Add(bias))

with z₃, s₃ = the zero points and scales as float32 Consts [n_blocks, 1, N] (no Sub when
symmetric; fp16 scales widened exactly). Each weight is (q - z) · s in float32, as the op's
reference computes it, so the read-back graph (AscendAntiQuant lifts to DequantizeLinear) gives
the op's numbers up to the order of the sums.

4-bit levels are a ``DT_INT4`` Const (``ge.proto.DataType`` 28 in ``ge_ir.proto``): GE sizes it at
ceil(4 · n / 8) bytes (``kDataTypeSizeBitOffset + 4``), so L takes n_blocks · bs · N / 2 bytes,
packed low nibble first (:mod:`schemas.cann.int4`); Kiln's reader unpacks them to the same int8
values. The reference does not document AscendAntiQuant's accepted input types (only its
formula), so an int4 ``x`` on a real device is unverified here. ``--cann-schema domi`` has no
4-bit type and keeps a byte per level.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from backends.cann.lower import Lowerer, lowering
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType, TensorType
from compiler.ops.weight_only import block_count
from schemas.cann.om_graph import Attr

__all__: list[str] = []


def _const_reason(graph: Graph, node: Node) -> str | None:
    ins = graph.inputs_of(node)
    for port, what in ((1, "levels"), (2, "scales"), (3, "zero points"), (4, "bias")):
        v = ins[port] if port < len(ins) else None
        if v is not None and v.const is None:
            return f"{what} (input {port}) must be a constant"
    return None


def _const_of(low: Lowerer, node: Node, port: int) -> np.ndarray | None:
    ins = low.g.inputs_of(node)
    v = ins[port] if port < len(ins) else None
    return None if v is None else v.const


@lowering("kiln::WeightOnlyMatMul", check=_const_reason)
def _weight_only_matmul(low: Lowerer, node: Node) -> None:
    q, s = _const_of(low, node, 1), _const_of(low, node, 2)
    assert q is not None and s is not None
    z, bias = _const_of(low, node, 3), _const_of(low, node, 4)
    bs = int(node.attrs.block_size)
    n, k = q.shape
    nb = block_count(k, bs)
    fill = np.zeros((n, nb), np.int8) if z is None else z.astype(np.int8)
    levels = np.repeat(fill, bs, axis=1)
    levels[:, :k] = q
    out = low.g.value(node)
    base = out.name
    blocks = TensorType(DType.FLOAT32, (nb, bs, n))
    lt = np.ascontiguousarray(levels.T.reshape(nb, bs, n))
    if int(node.attrs.bits) == 4:
        desc = replace(low.desc(TensorType.of(lt)), int4=True)
        lref = low.emit(low.names.fresh(f"{base}/levels"), "Const", [], [desc], value=lt)
    else:
        lref = low.const(lt, f"{base}/levels")
    w = low.emit(
        low.names.fresh(f"{base}/AscendAntiQuant"),
        "AscendAntiQuant",
        [lref],
        [low.desc(blocks)],
        {"scale": Attr.f(1.0), "offset": Attr.f(0.0), "dtype": Attr.i(0), "sqrt_mode": Attr.b(False)},
    )
    per_block = (nb, 1, n)
    if z is not None:
        zf = low.const(np.ascontiguousarray(z.T.astype(np.float32).reshape(per_block)), f"{base}/zero_points")
        w = low.emit(low.names.fresh(f"{base}/Sub"), "Sub", [w, zf], [low.desc(blocks)])
    sf = low.const(np.ascontiguousarray(s.T.astype(np.float32).reshape(per_block)), f"{base}/scales")
    w = low.emit(low.names.fresh(f"{base}/Mul"), "Mul", [w, sf], [low.desc(blocks)])
    full = TensorType(DType.FLOAT32, (nb * bs, n))
    shape = low.const(np.array([nb * bs, n], np.int64), f"{base}/weight_shape")
    reshape_attrs = {"axis": Attr.i(0), "num_axes": Attr.i(-1)}
    w = low.emit(low.names.fresh(f"{base}/Reshape"), "Reshape", [w, shape], [low.desc(full)], reshape_attrs)
    if nb * bs != k:
        w = low.slice(w, TensorType(DType.FLOAT32, (k, n)), 0, k, 0, low.names.fresh(f"{base}/weight"))
    a = low.g.inputs_of(node)[0]
    mm_attrs = {"adj_x1": Attr.b(False), "adj_x2": Attr.b(False)}
    name = base if bias is None else low.names.fresh(f"{base}/BatchMatMulV2")
    y = low.emit(name, "BatchMatMulV2", [low.ref_of(a), w], [low.desc(out.type, node)], mm_attrs)
    if bias is not None:
        b = low.const(np.ascontiguousarray(bias, np.float32), f"{base}/bias")
        y = low.emit(base, "Add", [y, b], [low.desc(out.type, node)])
    low.bind(node, y)
