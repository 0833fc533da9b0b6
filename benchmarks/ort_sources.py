"""The zoo as users often get it: models that onnxruntime already optimized or quantized.

``benchmarks/zoo_matrix.py --source S`` derives, from each materialized zoo model, the file that
onnxruntime's own tools write, into a new zoo directory (same ``inputs.npz``, ``calib.npz`` and
``meta.json``), and runs the matrix on those:

* ``ort-extended``: the model as onnxruntime saves it after its extended-level graph optimizations
  (``SessionOptions.optimized_model_filepath``: FusedConv, FusedMatMul, QuickGelu,
  SimplifiedLayerNormalization...);
* ``ort-transformers``: ``onnxruntime.transformers.optimizer.optimize_model`` (Attention,
  EmbedLayerNormalization, SkipLayerNormalization, BiasGelu...), for the models whose ``meta.json``
  constructor names heads and hidden size (the transformers-library ones);
* ``ort-qoperator`` / ``ort-qdq``: ``quantize_static`` with per-channel int8 weights, uint8
  activations and the first 4 ``calib.npz`` samples, in QOperator (QLinearConv, QLinearMatMul,
  com.microsoft QLinear*) or QDQ form.

A model onnxruntime's tool fails on is skipped with the tool's reason (printed, and counted
apart): it is onnxruntime's failure, not Kiln's.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

__all__ = ["SOURCES", "derive"]

CALIB_SAMPLES = 4
_HEADS = re.compile(r"\b(?:num_attention_heads|n_heads|n_head|num_heads|encoder_attention_heads)=(\d+)")
_HIDDEN = re.compile(r"\b(?:hidden_size|dim|n_embd|d_model)=(\d+)")
_MODEL_TYPE = {
    "Bert": "bert",
    "DistilBert": "bert",
    "Albert": "bert",
    "MobileBert": "bert",
    "GPT2": "gpt2",
    "Llama": "gpt2",
    "ViT": "vit",
    "CLIPVision": "clip",
    "T5": "t5",
    "Whisper": "bart",
}


def _extended(src: Path, dst: Path) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 4
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])


def _transformers(src: Path, dst: Path) -> None:
    import json

    from onnxruntime.transformers.optimizer import optimize_model

    ctor = json.loads((src.parent / "meta.json").read_text()).get("ctor", "")
    heads, hidden = _HEADS.search(ctor), _HIDDEN.search(ctor)
    kind = next((v for k, v in _MODEL_TYPE.items() if f"transformers.{k}" in ctor), None)
    if heads is None or hidden is None or kind is None:
        raise ValueError("meta.json's constructor names no transformers model with heads and hidden size")
    model = optimize_model(
        str(src),
        model_type=kind,
        num_heads=int(heads.group(1)),
        hidden_size=int(hidden.group(1)),
        opt_level=0,
    )
    model.save_model_to_file(str(dst))


def _quantized(form: str) -> Callable[[Path, Path], None]:
    def run(src: Path, dst: Path) -> None:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        calib = dict(np.load(src.parent / "calib.npz"))

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                n = min(CALIB_SAMPLES, min(len(v) for v in calib.values()))
                self._it: Iterator[dict[str, np.ndarray]] = iter(
                    [{k: v[i] for k, v in calib.items()} for i in range(n)]
                )

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self._it, None)

        quantize_static(
            str(src),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QOperator if form == "qoperator" else QuantFormat.QDQ,
            per_channel=True,
            weight_type=QuantType.QInt8,
            activation_type=QuantType.QUInt8,
        )

    return run


SOURCES: dict[str, Callable[[Path, Path], None]] = {
    "ort-extended": _extended,
    "ort-transformers": _transformers,
    "ort-qoperator": _quantized("qoperator"),
    "ort-qdq": _quantized("qdq"),
}


def derive(source: str, zoo_dir: Path, names: Sequence[str], out_dir: Path) -> dict[str, str]:
    """Write ``source``'s file of each model into ``out_dir/<name>/`` (with the model's samples);
    returns the models skipped, with onnxruntime's reason."""
    make = SOURCES[source]
    skipped: dict[str, str] = {}
    for name in names:
        d = out_dir / name
        d.mkdir(parents=True, exist_ok=True)
        for f in (zoo_dir / name).iterdir():
            if f.is_file() and f.name != "model.onnx":
                shutil.copy(f, d / f.name)
        try:
            make(zoo_dir / name / "model.onnx", d / "model.onnx")
        except Exception as exc:  # noqa: BLE001 - onnxruntime's tools raise anything
            shutil.rmtree(d)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            skipped[name] = f"{type(exc).__name__}: {first}"[:160]
    return skipped
