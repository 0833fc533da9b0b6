"""Lower a whole Kiln Graph to an :class:`~backends.mnn.model.MnnNet`.

1. Check every node against the op table first and raise one UnsupportedOpsError that
   lists every unsupported op with its node names (and the reason, where there is one).
2. One Input op per graph input (NCHW, ``dformat`` written explicitly: its default is NC4HW4).
3. Every op node in the graph's deterministic topological order, through its lowering.
4. Graph outputs in NCHW under their public names: an output produced in NC4HW4 gets a
   trailing ConvertTensor, and the packed tensor is renamed ``<name>__before_tr`` (as
   MNN's converter does).
5. Net-level peepholes (float nets; an int8 net keeps its tensor indexes for the quant info):
   a ReLU whose input is the sole use of a float ``BinaryOp`` ADD/SUB/MUL result becomes that
   op's fused ``activationType = 1`` (``y = max(a op b, 0)``, one pass over the data instead of
   two), and one right after a float conv its ``relu`` / ``relu6`` flag (``fuse_conv_act``);
   ``BinaryOp MUL(a, UnaryOp SIGMOID(a))`` whose sigmoid nothing else reads becomes
   ``UnaryOp SILU(a)`` (SiLU / swish, as MNN's converter writes it: one kernel instead of two); then
   ops whose outputs nothing reads (and that are no graph output) are dropped, and
   the tensors no op names any more are removed from the tensor table (indexes compacted, order
   kept). A net without such ops is left exactly as lowered.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from backends.mnn.layout import Format
from backends.mnn.lower.context import LowerContext, mnn_dtype
from backends.mnn.lower.fuse_conv_act import fuse_conv_activation
from backends.mnn.lower.int8_net import finish_int8
from backends.mnn.lower.linear import reshape_table
from backends.mnn.lower.quant import expand_qconv, fold_weight_dequant, integer_form
from backends.mnn.lower.table import TABLE
from backends.mnn.model import MnnNet, MnnOp, Table
from backends.mnn.options import MnnOptions
from backends.mnn.weights import WeightStorage
from compiler.errors import UnsupportedOpsError
from compiler.ir.graph import Graph
from schemas.mnn.external import ExternalData
from schemas.mnn.schema import fb

__all__ = [
    "lower_graph",
    "unsupported_ops",
    "check_supported",
    "fuse_binary_relu",
    "fuse_silu",
    "drop_dead_ops",
]

log = logging.getLogger(__name__)


def unsupported_ops(graph: Graph) -> dict[str, list[str]]:
    """``{op (reason): [node names]}`` for every node the MNN writer cannot write.

    Weight dequantization is folded first (as the writer does); each node is then judged by
    :data:`backends.mnn.lower.table.TABLE` (an op without a lowering is listed by its name alone).
    """
    graph = fold_weight_dequant(graph)
    bad: dict[str, list[str]] = {}
    for v in graph.inputs:
        if not v.type.is_static or mnn_dtype(v.type.dtype) is None:
            bad.setdefault(f"graph input ({v.type})", []).append(v.name)
    for node in graph.nodes():
        reason = TABLE.reason(graph, node)
        if reason is not None:
            op = node.qualified_op
            key = f"{op} ({reason})" if op in TABLE else op
            bad.setdefault(key, []).append(node.name or node.output_names[0])
    return bad


def check_supported(graph: Graph, source: str = "") -> None:
    """Raise UnsupportedOpsError listing every node the MNN writer cannot write."""
    bad = unsupported_ops(graph)
    if bad:
        raise UnsupportedOpsError(f"{source or graph.name} (MNN writer)", bad)


def lower_graph(
    graph: Graph,
    options: MnnOptions,
    source: str = "",
    plan: Mapping[int, WeightStorage] | None = None,
) -> tuple[MnnNet, ExternalData | None]:
    """The MNN net of ``graph`` and its external data (None unless ``options.external``).

    ``plan`` overrides the weight storage of single nodes (by node id).
    """
    int8_form = integer_form(graph)
    if not int8_form:
        graph = expand_qconv(graph)  # the explicit form runs convs in float
    graph = fold_weight_dequant(graph)
    check_supported(graph, source)
    ctx = LowerContext(graph, options, plan)
    ctx.int8_form = int8_form
    for v in graph.inputs:
        idx = ctx.define(v, Format.NCHW)
        dtype = mnn_dtype(v.type.dtype)
        param = Table(
            "Input",
            {"dims": np.asarray(v.type.static_shape, np.int32), "dtype": dtype, "dformat": Format.NCHW},
            force=frozenset({"dtype", "dformat"}),
        )
        ctx.emit("Input", v.name, [], [idx], param)
    for node in graph.ops():
        TABLE.lower_for(node.qualified_op)(ctx, node)
    outputs = _finish_outputs(ctx)
    net = ctx.finish()
    if int8_form:
        log.info("MNN: %d int8 convolutions", finish_int8(net))
    net.output_names = outputs
    if not int8_form:
        dropped = drop_dead_ops(net)  # first the unread NCHW copies of packed rows (a fusion's reader)
        fused = fuse_binary_relu(net) + fuse_conv_activation(net)
        silu = fuse_silu(net)
        dropped += drop_dead_ops(net)
        log.debug("MNN: %d ReLU fused into BinaryOp, %d SiLU, %d dead ops dropped", fused, silu, dropped)
    log.info("MNN: %d ops, %d tensors", len(net.ops), len(net.tensor_names))
    return net, ctx.external


def _finish_outputs(ctx: LowerContext) -> list[str]:
    """Give every graph output an NCHW tensor named as its public name."""
    claimed: set[int] = set()
    for value, public in zip(ctx.graph.outputs, ctx.graph.output_names, strict=True):
        plain = ctx.tensor(value, Format.NCHW)
        if (
            ctx.format_of(value) == Format.NC4HW4
            and plain not in claimed
            and ctx.tensor_name(plain) != public
        ):
            packed = ctx.tensor(value, Format.NC4HW4)
            if ctx.tensor_name(packed) == public:
                ctx.rename(packed, f"{public}__before_tr")
            ctx.rename(plain, public, exact=True)
        is_input = ctx.graph.node(value.node).op == "Input"
        if plain in claimed or is_input or ctx.tensor_name(plain) != public:
            copy = ctx.temp(f"{public}__copy")
            ctx.rename(copy, public, exact=True)
            ctx.emit("Reshape", f"{public}__copy", [plain], [copy], reshape_table(ctx.shape(value)))
            plain = copy
        if ctx.tensor_name(plain) != public:
            raise ValueError(f"MNN writer: graph output {public!r} clashes with another tensor name")
        claimed.add(plain)
    return list(ctx.graph.output_names)


_RELU_FUSIBLE = frozenset({fb.BinaryOpOperation.ADD, fb.BinaryOpOperation.SUB, fb.BinaryOpOperation.MUL})


def _readers(net: MnnNet) -> dict[int, list[int]]:
    """Tensor index -> positions of the ops that read it."""
    readers: dict[int, list[int]] = {}
    for pos, op in enumerate(net.ops):
        for t in op.inputs:
            readers.setdefault(t, []).append(pos)
    return readers


def fuse_binary_relu(net: MnnNet) -> int:
    """Fold ``ReLU{slope 0}(BinaryOp(a, b))`` into the BinaryOp's ``activationType = 1``; returns the count.

    Only when the BinaryOp result is read by that ReLU alone and is no graph output. The fused op
    takes the ReLU's name and output tensor, so what the net exposes is unchanged.
    """
    producer: dict[int, int] = {t: pos for pos, op in enumerate(net.ops) for t in op.outputs}
    readers = _readers(net)
    outputs = set(net.output_names)
    drop: set[int] = set()
    for pos, op in enumerate(net.ops):
        if op.type != "ReLU" or len(op.inputs) != 1 or op.param is None or op.param.get("slope", 0.0) != 0.0:
            continue
        t = op.inputs[0]
        src_pos = producer.get(t)
        if src_pos is None or readers.get(t) != [pos] or net.tensor_names[t] in outputs:
            continue
        src = net.ops[src_pos]
        p = src.param
        if src.type != "BinaryOp" or p is None or len(src.outputs) != 1:
            continue
        if p.get("T", fb.DataType.DT_FLOAT) != fb.DataType.DT_FLOAT or p.get("activationType", 0) != 0:
            continue
        if p.get("opType", fb.BinaryOpOperation.ADD) not in _RELU_FUSIBLE:
            continue
        net.ops[src_pos] = MnnOp(
            src.type,
            op.name,
            src.inputs,
            list(op.outputs),
            Table(p.name, {**p.fields, "activationType": 1}, force=p.force),
        )
        drop.add(pos)
    net.ops = [op for pos, op in enumerate(net.ops) if pos not in drop]
    return len(drop)


def _unary_kind(op: MnnOp) -> int | None:
    """The UnaryOpOperation of a float UnaryOp, else None."""
    p = op.param
    if op.type != "UnaryOp" or p is None or p.get("T", fb.DataType.DT_FLOAT) != fb.DataType.DT_FLOAT:
        return None
    return int(p.get("opType", fb.UnaryOpOperation.ABS))


def fuse_silu(net: MnnNet) -> int:
    """Rewrite ``BinaryOp MUL(a, UnaryOp SIGMOID(a))`` as ``UnaryOp SILU(a)``; returns the count.

    Only a float MUL without a fused activation whose sigmoid result it alone reads (and that is
    no graph output). The SILU takes the MUL's name and output tensor; the sigmoid is left for
    :func:`drop_dead_ops`.
    """
    producer: dict[int, int] = {t: pos for pos, op in enumerate(net.ops) for t in op.outputs}
    readers = _readers(net)
    outputs = set(net.output_names)
    fused = 0
    for pos, op in enumerate(net.ops):
        p = op.param
        if op.type != "BinaryOp" or p is None or len(op.inputs) != 2 or len(op.outputs) != 1:
            continue
        if p.get("opType", fb.BinaryOpOperation.ADD) != fb.BinaryOpOperation.MUL:
            continue
        if p.get("T", fb.DataType.DT_FLOAT) != fb.DataType.DT_FLOAT or p.get("activationType", 0) != 0:
            continue
        for a, s in (op.inputs, op.inputs[::-1]):
            src = producer.get(s)
            if src is None or readers.get(s) != [pos] or net.tensor_names[s] in outputs:
                continue
            sig = net.ops[src]
            if _unary_kind(sig) != fb.UnaryOpOperation.SIGMOID or sig.inputs != [a] or a == s:
                continue
            fields = {"opType": fb.UnaryOpOperation.SILU, "T": fb.DataType.DT_FLOAT}
            param = Table("UnaryOp", fields, force=frozenset({"opType"}))
            net.ops[pos] = MnnOp("UnaryOp", op.name, [a], list(op.outputs), param)
            fused += 1
            break
    return fused


def drop_dead_ops(net: MnnNet) -> int:
    """Remove ops none of whose outputs is read or a graph output, then unused tensors; returns ops removed.

    Input ops always stay. Tensor indexes are renumbered in their old order (``tensor_quant`` too).
    """
    keep_names = set(net.output_names)
    live: set[int] = {i for i, nm in enumerate(net.tensor_names) if nm in keep_names}
    kept: list[MnnOp] = []
    for op in reversed(net.ops):
        if op.type == "Input" or any(t in live for t in op.outputs):
            kept.append(op)
            live.update(op.inputs)
    removed = len(net.ops) - len(kept)
    net.ops = kept[::-1]
    used = sorted({t for op in net.ops for t in (*op.inputs, *op.outputs)} | live)
    if len(used) == len(net.tensor_names):
        return removed
    new = {old: i for i, old in enumerate(used)}
    for op in net.ops:
        op.inputs = [new[t] for t in op.inputs]
        op.outputs = [new[t] for t in op.outputs]
    net.tensor_names = [net.tensor_names[t] for t in used]
    net.tensor_quant = {new[t]: q for t, q in net.tensor_quant.items() if t in new}
    return removed
