"""GE attribute builders shared by the float and the int8 lowerings.

* :func:`conv2d_attrs`: Conv2D of a 2-D NCHW convolution. ONNX pads [t, l, b, r] become
  GE's [top, bottom, left, right]; strides and dilations get 4 elements (N, C, H, W).
* :func:`fc_attrs`: FullyConnection. GE's ``transpose`` is true when the weight is
  [K, N] (ONNX ``transB = 0``), false for Caffe's [N, K].
* :func:`activation_steps`: the GE op that follows a conv for a fused activation.
"""

from __future__ import annotations

import numpy as np

from backends.cann.lower import Lowerer, Step
from backends.cann.om_graph import Attr
from backends.cann.op_table import ACTIVATIONS
from compiler.ir.graph import Node
from compiler.ops.conv import ConvAttrs

__all__ = ["conv2d_attrs", "activation_steps", "fc_attrs"]


def conv2d_attrs(low: Lowerer, node: Node, a: ConvAttrs, w_shape: tuple[int, ...]) -> dict[str, Attr]:
    """GE Conv2D attributes for a 2-D NCHW convolution."""
    if len(w_shape) != 4:
        raise low.fail(node, f"only 2-D convolutions map to Conv2D (weight shape {list(w_shape)})")
    if a.auto_pad not in ("NOTSET", ""):
        raise low.fail(node, f"auto_pad={a.auto_pad} (run the default pipeline to make pads explicit)")
    if a.kernel_shape and tuple(a.kernel_shape) != tuple(w_shape[2:]):
        raise low.fail(node, f"kernel_shape {list(a.kernel_shape)} != weight shape {list(w_shape[2:])}")
    pads = tuple(a.pads) or (0, 0, 0, 0)
    strides = tuple(a.strides) or (1, 1)
    dilations = tuple(a.dilations) or (1, 1)
    return {
        "strides": Attr.li((1, 1, *strides)),
        "pads": Attr.li((pads[0], pads[2], pads[1], pads[3])),
        "dilations": Attr.li((1, 1, *dilations)),
        "groups": Attr.i(a.group),
        "data_format": Attr.s("NCHW"),
        "offset_x": Attr.i(0),
    }


def activation_steps(low: Lowerer, node: Node, name: str, alpha: float, beta: float) -> list[Step]:
    """The GE op after a conv for a fused activation (none for ``"none"``)."""
    if name == "none":
        return []
    act = ACTIVATIONS.get(name)
    if act is None:
        raise low.fail(node, f"fused activation {name!r} has no CANN op")
    inputs: list[str] = []
    if act.bounds:
        dt = low.g.value(node).type.dtype.numpy
        base = f"{low.g.value(node).name}/{act.ge}"
        inputs = [low.const(np.array(alpha, dt), f"{base}/min"), low.const(np.array(beta, dt), f"{base}/max")]
    return [Step(act.ge, inputs, act.attrs(alpha, beta))]


def fc_attrs(num_output: int, trans_b: int, offset_x: int = 0) -> dict[str, Attr]:
    """GE FullyConnection attributes."""
    return {
        "num_output": Attr.i(num_output),
        "transpose": Attr.b(not trans_b),
        "axis": Attr.i(1),
        "offset_x": Attr.i(offset_x),
    }
