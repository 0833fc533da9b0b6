"""MNN's integer form, finished over the whole net: which ops run int8, and float islands.

After lowering, :func:`finish_int8` walks the :class:`~backends.mnn.model.MnnNet`: a conv with
symmetric IDST int8 weights between int8 tensors gets MNN's int8 conv metadata (``scaleIn``,
``scaleOut``, ``symmetricQuan``); a Pooling that MNN's int8 kernel gets wrong (see
:mod:`backends.mnn.lower.quant` for what MNN 3.6.1 was observed to do) runs in float between
identity depthwise 1x1 convs (:func:`_float_islands`), so the int8 convs around it stay int8.
"""

from __future__ import annotations

import logging

import numpy as np

from backends.mnn.model import MnnNet, MnnOp, Table, TensorQuant
from schemas.mnn.schema import fb

__all__ = ["finish_int8", "INT8_BINARY"]

log = logging.getLogger(__name__)

_CONV_OPS = ("Convolution", "ConvolutionDepthwise")
INT8_BINARY = True
"""Let MNN run BinaryOps between int8 tensors in int8 (its CPUBinaryInt8 rescales per tensor)."""


def _int8_weights(op: MnnOp) -> bool:
    """True for a conv whose weights are symmetric IDST int8 and that has no float ``weight``."""
    if op.type not in _CONV_OPS or op.param is None or op.param.get("weight") is not None:
        return False
    idst = op.param.get("quanParameter")
    return isinstance(idst, Table) and idst.get("type") == 1 and not idst.get("aMin", 0)


def _is_maxpool(op: MnnOp) -> bool:
    return op.type == "Pooling" and op.param is not None and op.param.get("type") == fb.PoolType.MAXPOOL


def _unsafe_pool(op: MnnOp, marked: dict[int, TensorQuant], producer: dict[int, MnnOp]) -> bool:
    """True for a Pooling that MNN's int8 kernel gets wrong (*observed*, MNN 3.6.1).

    That is, one on an asymmetric grid (about 128 LSB off), one whose input an int8 conv does
    not write, or a padded MaxPool whose input may be negative (the int8 kernel pads with
    q = 0, i.e. the value 0, not -inf).
    """
    if op.type != "Pooling" or not op.inputs or not op.outputs or op.param is None:
        return False
    if any(t in marked and marked[t].zero != 0 for t in (op.inputs[0], op.outputs[0])):
        return True
    pads = op.param.get("pads")
    padded = bool(op.param.get("padX", 0) or op.param.get("padY", 0)) or (
        pads is not None and bool(np.any(np.asarray(pads) != 0))
    )
    src = producer.get(op.inputs[0])
    if src is None or not _int8_weights(src):
        return True  # fed through a runtime cast (*observed*: wrong even on a symmetric grid)
    if not (_is_maxpool(op) and padded):
        return False
    common = None if src.param is None else src.param.get("common")
    return not (isinstance(common, Table) and bool(common.get("relu") or common.get("relu6")))


def _plan_int8(net: MnnNet) -> tuple[dict[str, list[str]], list[MnnOp]]:
    """Keep ``quantInfo`` only where MNN's int8 kernels compute what the QDQ model means.

    MNN runs an op in int8 when its input carries quantInfo and the op has an int8 kernel
    (conv with int8 weights, Pooling, BinaryOp, Interp, ...); other ops (and convs with float
    weights) get runtime casts. Rules (each one checked against MNN 3.6.1, *observed*):

    * quantInfo stays on the inputs and outputs of int8 convs (and the int8 inputs of the ops
      below), nowhere else;
    * a Pooling that MNN's int8 kernel gets wrong (:func:`_unsafe_pool`) runs in float
      between identity convs (returned as
      "islands", see :func:`_float_islands`); its output keeps the QDQ model's grid when an
      int8 conv reads it;
    * MNN's int8 Pooling ignores the scales (it assumes input grid = output grid), so a
      symmetric MaxPool between int8 tensors gets its input's grid (max commutes with the grid);
    * an int8 op (MaxPool, BinaryOp) whose variable input has no quantInfo gets a runtime cast
      that ignores the zero point, so that input gets the grid the QDQ model itself gave it
      (its QuantizeLinear), or, for a MaxPool that is its only reader, the pool's output grid
      (quantising before or after a max is the same), if a conv produces it (MNN then casts
      the conv's float output); failing that, the op stays in float and the grids it asked
      for are dropped again;
    * any other op between int8 tensors loses its output's quantInfo (its readers run in float).

    Returns ``({reason: [op names]}`` of ops kept in float that touch int8 tensors, islands).
    """
    quant = net.tensor_quant
    for op in net.ops:
        if op.type == "ConvertTensor" and op.inputs[0] in quant and op.outputs[0] not in quant:
            quant[op.outputs[0]] = quant[op.inputs[0]]
    marked = dict(quant)  # the QDQ model's own grids
    producer = {t: op for op in net.ops for t in op.outputs}
    readers: dict[int, list[MnnOp]] = {}
    for op in net.ops:
        for t in op.inputs:
            readers.setdefault(t, []).append(op)
    islands = [op for op in net.ops if _unsafe_pool(op, marked, producer)]
    island_ids = {id(op) for op in islands}
    island_outs = {
        op.outputs[0]
        for op in islands
        if op.outputs[0] in marked and any(_int8_weights(r) for r in readers.get(op.outputs[0], []))
    }
    extra: dict[int, dict[int, TensorQuant]] = {}  # id(op) -> grids it gave its inputs
    floated: set[int] = set()  # ops that fell back to float for good
    fallback: dict[str, list[str]] = {}
    while True:
        convs = [o for o in net.ops if _int8_weights(o) and o.inputs[0] in quant and o.outputs[0] in quant]
        keep = {t for op in convs for t in (op.inputs[0], op.outputs[0])} | (island_outs & set(quant))
        for t in [t for t in quant if t not in keep]:
            del quant[t]
        for grids in extra.values():
            for t, q in grids.items():
                quant.setdefault(t, q)
        changed = False
        for op in net.ops:
            if op in convs or id(op) in island_ids or not op.outputs or not op.inputs:
                continue
            if op.outputs[0] not in quant or id(op) in floated:
                changed |= extra.pop(id(op), None) is not None
                continue
            if op.type in _CONV_OPS and op.param is not None and op.param.get("weight") is not None:
                continue  # a float conv: MNN casts around it
            pool = _is_maxpool(op) and quant[op.outputs[0]].zero == 0
            int8_op = pool or (op.type == "BinaryOp" and INT8_BINARY)
            if int8_op:
                mine: dict[int, TensorQuant] = {}
                for t in op.inputs:
                    if t in quant or producer.get(t) is None or producer[t].type == "Const":
                        continue
                    if producer[t].type not in _CONV_OPS:
                        int8_op = False  # its producer might run in int8 on another grid
                        break
                    if t in marked:
                        mine[t] = marked[t]
                    elif pool and len(readers.get(t, [])) == 1:
                        mine[t] = quant[op.outputs[0]]
                    else:
                        int8_op = False
                        break
                if int8_op and mine:
                    extra.setdefault(id(op), {}).update(mine)
                    quant.update(mine)
                    changed = True
            if int8_op and pool:
                if quant[op.outputs[0]] != quant[op.inputs[0]]:
                    quant[op.outputs[0]] = quant[op.inputs[0]]
                    changed = True
                continue
            if int8_op:
                continue
            # MNN would run these in int8 on an input grid that is not the QDQ model's
            int8_kernel = op.type == "BinaryOp" or (op.type == "Pooling" and quant[op.outputs[0]].zero != 0)
            if not int8_kernel and any(t not in quant for t in op.inputs):
                continue  # MNN runs it in float with a cast on its output
            del quant[op.outputs[0]]
            if op.type == "BinaryOp":
                floated.add(id(op))
            for t in extra.pop(id(op), {}):
                quant.pop(t, None)  # the grids it asked for (re-added if another op needs them)
            fallback.setdefault(f"{op.type} (no exact int8 kernel)", []).append(op.name)
            changed = True
        if not changed:
            return fallback, islands


def _channels(net: MnnNet, t: int) -> int | None:
    """The channel count of tensor ``t``, from a conv that reads or writes it (None if none does)."""
    for op in net.ops:
        if op.type in _CONV_OPS and op.param is not None and (t in op.inputs[:1] or t in op.outputs):
            common = op.param.get("common")
            if isinstance(common, Table):
                return int(common.get("inputCount" if t in op.inputs[:1] else "outputCount"))
    return None


def _identity_dw(name: str, x: int, out: int, channels: int) -> MnnOp:
    """A 1x1 depthwise conv with float weights 1 and bias 0 (an exact copy of ``x``)."""
    common = Table(
        "Convolution2DCommon",
        {"group": channels, "outputCount": channels, "inputCount": channels, "pads": np.zeros(4, np.int32)},
    )
    weights = {"weight": np.ones(channels, np.float32), "bias": np.zeros(channels, np.float32)}
    param = Table("Convolution2D", {"common": common, **weights})
    return MnnOp("ConvolutionDepthwise", name, [x], [out], param)


def _float_islands(net: MnnNet, islands: list[MnnOp]) -> int:
    """Run each island op in float between identity convs; returns the number of convs added.

    MNN runs a conv with float weights in float and casts around it with the zero points
    (``x = (q - z) * s`` before, ``q = clamp(round(x / s) + z)`` after), which makes an
    identity depthwise 1x1 conv (w = 1, b = 0) an exact int8 <-> float boundary: one before an
    island with an int8 input, one after an island with an int8 output. (Explicit casts did
    not work in the integer form in MNN 3.6.1, *observed*: an ``Int8ToFloat`` made its
    producer conv run in float and then read its float output as int8, and a ``FloatToInt8``
    read by an int8 conv corrupted the heap.) An island input or output whose channel count
    no conv tells loses its quantInfo instead (its producer / readers then run in float).
    """
    quant = net.tensor_quant
    names = set(net.tensor_names)
    count = 0

    def fresh(base: str) -> int:
        name, k = base, 0
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.add(name)
        net.tensor_names.append(name)
        return len(net.tensor_names) - 1

    ids = {id(op) for op in islands}
    ops: list[MnnOp] = []
    for op in net.ops:
        if id(op) not in ids:
            ops.append(op)
            continue
        t_in, t_out = op.inputs[0], op.outputs[0]
        c_in = _channels(net, t_in) if t_in in quant else None
        if c_in is not None:
            f_in = fresh(f"{net.tensor_names[t_in]}__float")
            ops.append(_identity_dw(f"{op.name}__dequant", t_in, f_in, c_in))
            op.inputs = [f_in, *op.inputs[1:]]
            count += 1
        elif t_in in quant:
            del quant[t_in]
        ops.append(op)
        c_out = _channels(net, t_out) if t_out in quant else None
        if c_out is not None:
            f_out = fresh(f"{net.tensor_names[t_out]}__float")
            op.outputs = [f_out, *op.outputs[1:]]
            ops.append(_identity_dw(f"{op.name}__requant", f_out, t_out, c_out))
            count += 1
        elif t_out in quant:
            del quant[t_out]
    net.ops = ops
    return count


def finish_int8(net: MnnNet) -> int:
    """Integer form, after lowering: choose the int8 tensors, and scaleIn/scaleOut on convs.

    A Convolution whose input and output tensors both carry quantInfo (:func:`_plan_int8`) and
    whose weights are IDST int8 gets ``scaleIn``/``scaleOut`` and the ``symmetricQuan``
    metadata that MNN's quantization tool writes (NOTES §2). Returns the number of such convs.
    """
    fallback, islands = _plan_int8(net)
    for reason, names in fallback.items():
        log.info("MNN int8: %s kept in float: %s", reason, ", ".join(names))
    if islands:
        casts = _float_islands(net, islands)
        log.info("MNN int8: %d pooling ops in float (%d identity convs)", len(islands), casts)
    quant = net.tensor_quant
    count = 0
    for op in net.ops:
        if not _int8_weights(op) or op.inputs[0] not in quant or op.outputs[0] not in quant:
            continue
        assert op.param is not None
        idst = op.param.get("quanParameter")
        assert isinstance(idst, Table)
        fields = {**idst.fields, "scaleIn": quant[op.inputs[0]].scale, "scaleOut": quant[op.outputs[0]].scale}
        qin, qout = quant[op.inputs[0]], quant[op.outputs[0]]
        meta = Table(
            "QuantizedFloatParam",
            {
                "nbits": 8,
                "zeroPoint": int(qin.zero),
                "outputZeroPoint": int(qout.zero),
                "clampMin": int(qout.min),
                "clampMax": int(qout.max),
                "outputDataType": fb.DataType.DT_INT8,
            },
            force=frozenset({"nbits", "clampMin", "clampMax"}),
        )
        op.param = Table(
            op.param.name,
            {
                **op.param.fields,
                "quanParameter": Table("IDSTQuan", fields, idst.force),
                "symmetricQuan": meta,
            },
            op.param.force,
        )
        count += 1
    return count
