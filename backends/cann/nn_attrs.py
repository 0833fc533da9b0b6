"""GE attribute builders shared by the float and the int8 lowerings.

* :func:`conv2d_reason`: why a Conv / kiln::FusedConv / kiln::QConv has no Conv2D form (its table check).
* :func:`conv2d_attrs`: Conv2D of a 2-D NCHW convolution. ONNX pads [t, l, b, r] become
  GE's [top, bottom, left, right]; strides and dilations get 4 elements (N, C, H, W).
* :func:`fc_attrs`: FullyConnection. GE's ``transpose`` is true when the weight is
  [K, N] (ONNX ``transB = 0``), false for Caffe's [N, K].
* :func:`activation_steps`: the GE op that follows a conv for a fused activation.
"""

from __future__ import annotations

import numpy as np

from backends.cann.lower import Lowerer, Step
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType
from compiler.ops.conv import ConvAttrs
from schemas.cann.om_graph import Attr
from schemas.cann.op_table import ACTIVATIONS

__all__ = ["conv2d_reason", "conv2d_attrs", "activation_steps", "fc_attrs"]


def conv2d_reason(graph: Graph, node: Node) -> str | None:
    """Why a Conv / kiln::FusedConv / kiln::QConv cannot become Conv2D, or None."""
    w = graph.inputs_of(node)[1]
    assert w is not None
    w_shape = w.type.static_shape
    a = node.attrs
    if len(w_shape) != 4:
        return f"only 2-D convolutions map to Conv2D (weight shape {list(w_shape)})"
    if a.auto_pad not in ("NOTSET", ""):
        return f"auto_pad={a.auto_pad} (run the default pipeline to make pads explicit)"
    if a.kernel_shape and tuple(a.kernel_shape) != tuple(w_shape[2:]):
        return f"kernel_shape {list(a.kernel_shape)} != weight shape {list(w_shape[2:])}"
    if node.domain and a.activation != "none" and a.activation not in ACTIVATIONS:
        return f"fused activation {a.activation!r} has no CANN op"
    return None


def conv2d_attrs(a: ConvAttrs, w_shape: tuple[int, ...]) -> dict[str, Attr]:
    """GE Conv2D attributes for a 2-D NCHW convolution (checked by :func:`conv2d_reason`)."""
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


def activation_steps(
    low: Lowerer, node: Node, name: str, alpha: float, beta: float, dtype: DType | None = None
) -> list[Step]:
    """The GE op after a conv for a fused activation (none for ``"none"``), in ``dtype`` (default: the
    node's output dtype; an int8 conv's activation runs in float32 before its AscendQuant)."""
    if name == "none":
        return []
    act = ACTIVATIONS[name]
    inputs: list[str] = []
    if act.bounds:
        dt = (dtype or low.g.value(node).type.dtype).numpy
        base = f"{low.g.value(node).name}/{act.ge}"
        inputs = [low.const(np.array(alpha, dt), f"{base}/min"), low.const(np.array(beta, dt), f"{base}/max")]
    return [Step(act.ge, inputs, act.attrs(alpha, beta), dtype)]


def fc_attrs(num_output: int, trans_b: int, offset_x: int = 0) -> dict[str, Attr]:
    """GE FullyConnection attributes."""
    return {
        "num_output": Attr.i(num_output),
        "transpose": Attr.b(not trans_b),
        "axis": Attr.i(1),
        "offset_x": Attr.i(offset_x),
    }
