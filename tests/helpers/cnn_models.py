"""ResNet-18-, ResNet-50- and MobileNetV2-shaped ONNX models with seeded random weights, for CPU benchmarks.

Both take ``input`` 1x3x224x224 and return ``logits`` 1x1000 (opset 13, IR 8). Convolutions are
followed by an unfused BatchNormalization, as in training exports. Weights are He-initialised
(std = sqrt(2 / fan_in)); each BN has random statistics and the BN closing a residual branch has
small gammas, so activations stay O(1) through the residual adds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["resnet18", "resnet50", "mobilenet_v2", "save_cnn_models", "CNN_MODELS"]

INPUT_SHAPE = (1, 3, 224, 224)
CLASSES = 1000


class _Net:
    """A tiny graph builder: nodes, initializers and fresh tensor names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def _const(self, prefix: str, a: np.ndarray) -> str:
        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(a.astype(np.float32), name))
        return name

    def conv_bn(
        self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, gamma: float = 1.0
    ) -> str:
        """Conv (no bias, pads k // 2) -> BatchNormalization; He-initialised weights."""
        fan_in = cin // groups * k * k
        w = self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / fan_in)
        c = self._name("conv")
        pad = k // 2
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, self._const("w", w)],
                [c],
                name=c,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
                group=groups,
            )
        )
        scale = gamma * self.rng.uniform(0.8, 1.2, cout)
        bias = self.rng.uniform(-0.1, 0.1, cout)
        mean = self.rng.uniform(-0.1, 0.1, cout)
        var = self.rng.uniform(0.8, 1.2, cout)
        b = self._name("bn")
        params = [self._const(p, a) for p, a in (("g", scale), ("b", bias), ("m", mean), ("v", var))]
        self.nodes.append(helper.make_node("BatchNormalization", [c, *params], [b], name=b, epsilon=1e-5))
        return b

    def op(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        """One node with a fresh output name."""
        y = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [y], name=y, **attrs))
        return y

    def relu6(self, x: str) -> str:
        """Clip(x, 0, 6) with min/max as inputs (opset 13)."""
        if not any(t.name == "zero" for t in self.inits):
            self.inits += [
                numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                numpy_helper.from_array(np.array(6.0, np.float32), "six"),
            ]
        return self.op("Clip", [x, "zero", "six"])

    def head(self, x: str, channels: int) -> None:
        """GlobalAveragePool -> Flatten -> Gemm(1000) into ``logits``."""
        p = self.op("GlobalAveragePool", [x])
        f = self.op("Flatten", [p], axis=1)
        w = self.rng.standard_normal((CLASSES, channels)) / np.sqrt(channels)
        b = self.rng.uniform(-0.1, 0.1, CLASSES)
        self.nodes.append(
            helper.make_node(
                "Gemm", [f, self._const("fc_w", w), self._const("fc_b", b)], ["logits"], name="fc", transB=1
            )
        )

    def model(self, name: str) -> onnx.ModelProto:
        """The checked model: ``input`` -> ``logits``."""
        g = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(INPUT_SHAPE))],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
            initializer=self.inits,
        )
        m = helper.make_model(
            g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8, producer_name="kiln"
        )
        onnx.checker.check_model(m, full_check=True)
        return m


def resnet18(seed: int = 0) -> onnx.ModelProto:
    """ResNet-18: conv7x7/2 + BN + relu, maxpool 3x3/2, 4 stages x 2 basic blocks (64-512), GAP, Gemm."""
    n = _Net(seed)
    x = n.op("Relu", [n.conv_bn("input", 3, 64, 7, stride=2)])
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = n.op("Relu", [n.conv_bn(x, cin, cout, 3, stride)])
            y = n.conv_bn(y, cout, cout, 3, gamma=0.3)
            short = n.conv_bn(x, cin, cout, 1, stride) if (stride != 1 or cin != cout) else x
            x = n.op("Relu", [n.op("Add", [y, short])])
            cin = cout
    n.head(x, 512)
    return n.model("resnet18")


def resnet50(seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 (v1.5): stem as ResNet-18, 3-4-6-3 bottlenecks (1x1, 3x3 with the stride, 1x1 x4), GAP, Gemm."""
    n = _Net(seed)
    x = n.op("Relu", [n.conv_bn("input", 3, 64, 7, stride=2)])
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        cout = 4 * width
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = n.op("Relu", [n.conv_bn(x, cin, width, 1)])
            y = n.op("Relu", [n.conv_bn(y, width, width, 3, stride)])
            y = n.conv_bn(y, width, cout, 1, gamma=0.3)
            short = n.conv_bn(x, cin, cout, 1, stride) if (stride != 1 or cin != cout) else x
            x = n.op("Relu", [n.op("Add", [y, short])])
            cin = cout
    n.head(x, 2048)
    return n.model("resnet50")


# (expansion t, output channels c, repeats n, first stride s): MobileNetV2 1.0
_MNV2 = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def mobilenet_v2(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 1.0: conv3x3/2 (32), 17 inverted residuals (1x1 expand, dw 3x3, linear 1x1), 1x1 1280."""
    n = _Net(seed)
    x = n.relu6(n.conv_bn("input", 3, 32, 3, stride=2))
    cin = 32
    for t, c, reps, s in _MNV2:
        for i in range(reps):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = n.relu6(n.conv_bn(x, cin, hidden, 1)) if t != 1 else x
            y = n.relu6(n.conv_bn(y, hidden, hidden, 3, stride, groups=hidden))
            residual = stride == 1 and cin == c
            y = n.conv_bn(y, hidden, c, 1, gamma=0.3 if residual else 1.0)
            x = n.op("Add", [x, y]) if residual else y
            cin = c
    x = n.relu6(n.conv_bn(x, cin, 1280, 1))
    n.head(x, 1280)
    return n.model("mobilenet_v2")


# the models tests and benchmarks/cpu_vs_ort.py iterate over; resnet50 (4.1 GFLOP) is for the int8
# benchmark only (benchmarks/int8_vs_ort.py), kept out to hold the test time down
CNN_MODELS = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2}


def save_cnn_models(directory: Path) -> dict[str, Path]:
    """Write ``resnet18.onnx`` and ``mobilenet_v2.onnx`` into ``directory``; paths by name."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, build in CNN_MODELS.items():
        paths[name] = directory / f"{name}.onnx"
        onnx.save(build(), str(paths[name]))
    return paths
