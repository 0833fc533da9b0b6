"""Net-level peephole: a ReLU / ReLU6 right after a float convolution becomes the conv's own flag.

    ReLU{slope 0}(Convolution(x)) = Convolution{relu}(x)
    ReLU6{0, 6}(Convolution(x))   = Convolution{relu6}(x)

``Convolution2DCommon.relu`` / ``relu6`` apply max(y, 0) / min(max(y, 0), 6) to the conv's output,
bias included (MNN's converter fuses them the same way). Only where the conv's output is read by
that activation alone, is no graph output, and the conv has neither flag yet; the conv takes the
activation's name and output tensor. Fully connected layers are 1x1 convs whose packed output the
activation lowering keeps (T5's and MobileBERT's FFN: one op and no ConvertTensor instead of three).
"""

from __future__ import annotations

from backends.mnn.model import MnnNet, MnnOp, Table

__all__ = ["fuse_conv_activation"]

_CONVS = frozenset({"Convolution", "ConvolutionDepthwise"})


def _flag(op: MnnOp) -> str | None:
    """``relu`` / ``relu6`` when ``op`` is that plain activation, else None."""
    p = op.param
    if p is None or len(op.inputs) != 1 or len(op.outputs) != 1:
        return None
    if op.type == "ReLU" and p.get("slope", 0.0) == 0.0:
        return "relu"
    if op.type == "ReLU6" and p.get("minValue", 0.0) == 0.0 and p.get("maxValue", 6.0) == 6.0:
        return "relu6"
    return None


def fuse_conv_activation(net: MnnNet) -> int:
    """Fold each such activation into its conv (see the module docstring); returns the count."""
    producer = {t: pos for pos, op in enumerate(net.ops) for t in op.outputs}
    readers: dict[int, int] = {}
    for op in net.ops:
        for t in op.inputs:
            readers[t] = readers.get(t, 0) + 1
    outputs = set(net.output_names)
    drop: set[int] = set()
    for pos, op in enumerate(net.ops):
        flag = _flag(op)
        t = op.inputs[0] if op.inputs else -1
        src_pos = producer.get(t)
        if flag is None or src_pos is None or readers.get(t) != 1 or net.tensor_names[t] in outputs:
            continue
        conv = net.ops[src_pos]
        p = conv.param
        common = p.get("common") if p is not None else None
        if conv.type not in _CONVS or p is None or not isinstance(common, Table) or len(conv.outputs) != 1:
            continue
        if common.get("relu", False) or common.get("relu6", False):
            continue
        fused = Table(common.name, {**common.fields, flag: True}, force=common.force)
        param = Table(p.name, {**p.fields, "common": fused}, force=p.force)
        net.ops[src_pos] = MnnOp(conv.type, op.name, conv.inputs, list(op.outputs), param)
        drop.add(pos)
    net.ops = [op for pos, op in enumerate(net.ops) if pos not in drop]
    return len(drop)
