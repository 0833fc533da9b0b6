"""Build small ``.mnn`` files with MNN's TFLite-style quantized ops (``TFQuantizeOp.fbs``).

The files are written with Kiln's own format model and serializer
(``backends.mnn.model`` / ``backends.mnn.serializer``): each op's parameter table is
built directly, the way MNN's TFLite converter fills it. Tensors are NHWC, as in the
converter's output for quantized TFLite models (``sourceType`` TFLITE, uint8 inputs).
Weight layouts follow the converter: a conv's ``weight`` is [kh, kw, ci, co] (HWIO),
a depthwise conv's is [kh, kw, ci * depth_multiplier].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backends.mnn.model import MnnNet, MnnOp, Table
from backends.mnn.serializer import serialize
from schemas.mnn.schema import fb

__all__ = ["QParam", "TfqNet", "ACT"]

ACT = {
    "none": fb.FusedActivation.kTfLiteActNone,
    "relu": fb.FusedActivation.kTfLiteActRelu,
    "relu1": fb.FusedActivation.kTfLiteActRelu1,
    "relu6": fb.FusedActivation.kTfLiteActRelu6,
    "tanh": fb.FusedActivation.kTfLiteActTanh,
    "sigmoid": fb.FusedActivation.kTfLiteActSigmoid,
}


@dataclass(frozen=True)
class QParam:
    """uint8 asymmetric quantisation: real = scale * (q - zero_point)."""

    scale: float
    zero_point: int

    def table(self) -> Table:
        """The ``QuantizedParam`` table (both fields always written)."""
        return Table(
            "QuantizedParam",
            {"zeroPoint": int(self.zero_point), "scale": float(self.scale)},
            force=frozenset({"zeroPoint", "scale"}),
        )


class TfqNet:
    """An MNN net under construction; methods add one op each and return output tensor indexes."""

    def __init__(self) -> None:
        self.net = MnnNet(source_type=fb.NetSource.TFLITE)

    def _tensor(self, name: str) -> int:
        self.net.tensor_names.append(name)
        return len(self.net.tensor_names) - 1

    def _op(self, type_: str, name: str, ins: Sequence[int], param: Table | None) -> int:
        out = self._tensor(name)
        self.net.ops.append(MnnOp(type_, name, list(ins), [out], param))
        return out

    # ------------------------------------------------------------------ ops
    def input(self, name: str, shape: Sequence[int], dtype: int = fb.DataType.DT_UINT8) -> int:
        """A graph input (NHWC dims, uint8 by default)."""
        p = Table(
            "Input",
            {"dims": np.asarray(shape, np.int32), "dtype": dtype, "dformat": fb.MNN_DATA_FORMAT.NHWC},
            force=frozenset({"dtype", "dformat"}),
        )
        return self._op("Input", name, [], p)

    def const(self, name: str, value: np.ndarray) -> int:
        """A float32 constant (for QuantizeV2 / TF Dequantize ranges)."""
        a = np.asarray(value, np.float32)
        fields: dict[str, object] = {"dims": np.asarray(a.shape, np.int32)} if a.ndim else {}
        fields.update(
            {
                "dataFormat": fb.MNN_DATA_FORMAT.NHWC,
                "dataType": fb.DataType.DT_FLOAT,
                "float32s": a.reshape(-1),
            }
        )
        return self._op("Const", name, [], Table("Blob", fields, force=frozenset({"dataType"})))

    def conv(
        self,
        name: str,
        x: int,
        weight: np.ndarray,
        bias: np.ndarray,
        pin: QParam,
        pw: QParam,
        pout: QParam,
        *,
        stride: tuple[int, int] = (1, 1),
        dilation: tuple[int, int] = (1, 1),
        padding: str = "SAME",
        act: str = "none",
        depth_multiplier: int = 0,
    ) -> int:
        """TfQuantizedConv2D (or QuantizedDepthwiseConv2D when ``depth_multiplier`` > 0).

        ``weight``: uint8 [kh, kw, ci, co], or [kh, kw, ci * m] for depthwise; ``bias``: int32 [co].
        """
        w = np.asarray(weight, np.uint8)
        kh, kw = w.shape[:2]
        co = w.shape[-1]
        common = Table(
            "Convolution2DCommon",
            {
                "kernelX": kw,
                "kernelY": kh,
                "strideX": stride[1],
                "strideY": stride[0],
                "dilateX": dilation[1],
                "dilateY": dilation[0],
                "padMode": {"SAME": fb.PadMode.SAME, "VALID": fb.PadMode.VALID}[padding],
                "group": 1,
                "outputCount": co,
            },
        )
        pb = QParam(pin.scale * pw.scale, 0)
        p = Table(
            "TfQuantizedConv2D",
            {
                "bias": np.asarray(bias, np.int32).reshape(-1),
                "biasflag": True,
                "common": common,
                "weight": w.reshape(-1),
                "activationType": ACT[act],
                "biasQuantizedParam": pb.table(),
                "depthMultiplier": depth_multiplier or 1,
                "filterQuantizedParam": pw.table(),
                "inputQuantizedParam": pin.table(),
                "modelFormat": fb.ModeFormat.TFLITE,
                "outputQuantizedParam": pout.table(),
            },
        )
        kind = "QuantizedDepthwiseConv2D" if depth_multiplier else "TfQuantizedConv2D"
        return self._op(kind, name, [x], p)

    def add(self, name: str, a: int, b: int, pa: QParam, pb: QParam, pout: QParam, act: str = "none") -> int:
        """QuantizedAdd."""
        p = Table(
            "QuantizedAdd",
            {
                "activationType": ACT[act],
                "input1QuantizedParam": pa.table(),
                "input2QuantizedParam": pb.table(),
                "outputQuantizedParam": pout.table(),
            },
        )
        return self._op("QuantizedAdd", name, [a, b], p)

    def pool(
        self,
        name: str,
        x: int,
        kind: str,
        kernel: tuple[int, int],
        stride: tuple[int, int],
        padding: str = "VALID",
        act_range: tuple[int, int] = (0, 255),
    ) -> int:
        """QuantizedAvgPool (``kind`` "avg") or QuantizedMaxPool ("max") on uint8 NHWC."""
        table = {"avg": "QuantizedAvgPool", "max": "QuantizedMaxPool"}[kind]
        p = Table(
            table,
            {
                "kernelX": kernel[1],
                "kernelY": kernel[0],
                "modelFormat": fb.ModeFormat.TFLITE,
                "outputActivationMax": act_range[1],
                "outputActivationMin": act_range[0],
                "padType": {"SAME": fb.PoolPadType.SAME, "VALID": fb.PoolPadType.VALID}[padding],
                "strideX": stride[1],
                "strideY": stride[0],
                "type": fb.DataType.DT_UINT8,
            },
            force=frozenset({"padType", "outputActivationMin"}),
        )
        return self._op(table, name, [x], p)

    def concat(
        self, name: str, xs: Sequence[int], axis: int, pins: Sequence[QParam], pout: QParam, act: str = "none"
    ) -> int:
        """QuantizedConcat with per-input scale / zero point."""
        p = Table(
            "QuantizedConcat",
            {
                "activationType": ACT[act],
                "axis": axis,
                "inputScale": np.asarray([q.scale for q in pins], np.float32),
                "inputZeroPoint": np.asarray([q.zero_point for q in pins], np.int32),
                "outputQuantizedParam": pout.table(),
            },
            force=frozenset({"axis"}),
        )
        return self._op("QuantizedConcat", name, xs, p)

    def logistic(self, name: str, x: int, pin: QParam, pout: QParam = QParam(1 / 256, 0)) -> int:
        """QuantizedLogistic (TFLite's output is fixed at scale 1/256, zero point 0)."""
        p = Table(
            "QuantizedLogistic", {"inputQuantizedParam": pin.table(), "outputQuantizedParam": pout.table()}
        )
        return self._op("QuantizedLogistic", name, [x], p)

    def softmax(self, name: str, x: int, in_scale: float, beta: float = 1.0) -> int:
        """QuantizedSoftmax over the last axis (output scale 1/256, zero point 0)."""
        p = Table("QuantizedSoftmax", {"beta": float(beta), "inputScale": float(in_scale)})
        return self._op("QuantizedSoftmax", name, [x], p)

    def reshape(self, name: str, x: int, dims: Sequence[int]) -> int:
        """QuantizedReshape (dims in the param)."""
        p = Table(
            "QuantizedReshape", {"dims": np.asarray(dims, np.int32), "modelFormat": fb.ModeFormat.TFLITE}
        )
        return self._op("QuantizedReshape", name, [x], p)

    def quantize_v2(self, name: str, x: int, lo: float, hi: float, mode: str = "MIN_COMBINED") -> int:
        """TF QuantizeV2 (float -> uint8) with its range as two float Const inputs."""
        lo_i = self.const(f"{name}_min", np.asarray(lo, np.float32))
        hi_i = self.const(f"{name}_max", np.asarray(hi, np.float32))
        p = Table(
            "QuantizeV2",
            {
                "type": fb.DataType.DT_UINT8,
                "mode": getattr(fb.QuantizeMode, mode),
                "roundMode": fb.QuantizeRoundMode.HALF_AWAY_FROM_ZERO,
            },
            force=frozenset({"mode", "roundMode"}),
        )
        return self._op("QuantizeV2", name, [x, lo_i, hi_i], p)

    def dequantize(self, name: str, x: int, pin: QParam) -> int:
        """TFLite Dequantize (uint8 -> float) with the input's QuantizedParam."""
        p = Table(
            "Dequantize",
            {
                "inputQuantizedParam": pin.table(),
                "modelFormat": fb.ModeFormat.TFLITE,
                "type": fb.DataType.DT_UINT8,
            },
        )
        return self._op("Dequantize", name, [x], p)

    # --------------------------------------------------------------- output
    def outputs(self, *idx: int) -> None:
        """Declare the net's outputs."""
        self.net.output_names = [self.net.tensor_names[i] for i in idx]

    def to_bytes(self) -> bytes:
        """The serialized ``.mnn`` flatbuffer."""
        return serialize(self.net)

    def write(self, path: Path) -> Path:
        """Write the file; returns ``path``."""
        path.write_bytes(self.to_bytes())
        return path
