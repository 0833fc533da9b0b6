"""Top-1 accuracy of a digits model over the hold-out set, measured with onnxruntime.

Usage: ``python -m examples.digits.accuracy --holdout HOLDOUT.npz MODEL.onnx [MODEL.onnx ...]``
prints one line per model. The hold-out file holds "image" [S,1,1,8,8] float32 and "label" [S] int64;
each sample is fed on its own as a [1,1,8,8] batch to the model's first input, and the arg-max of the
first output is compared with the label.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

__all__ = ["evaluate"]


def evaluate(onnx_path: str | Path, holdout_npz: str | Path, exact: bool = False) -> float:
    """Top-1 accuracy in [0, 1] of the ONNX model at ``onnx_path`` over ``holdout_npz``.

    ``exact``: run the model as written (no graph optimization), so a QDQ model computes its
    definition instead of onnxruntime's fused integer kernels (which saturate on x86 without VNNI).
    """
    with np.load(holdout_npz) as data:
        images, labels = data["image"], data["label"]
    if images.ndim != 5 or images.shape[0] != labels.shape[0] or images.shape[0] == 0:
        got = f"image {images.shape}, label {labels.shape}"
        raise ValueError(f"{holdout_npz}: expected image [S,1,1,8,8] and label [S], got {got}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if exact:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    feed_name = session.get_inputs()[0].name
    out_name = session.get_outputs()[0].name
    correct = 0
    for image, label in zip(images, labels, strict=True):
        logits = session.run([out_name], {feed_name: image})[0]
        correct += int(np.argmax(logits.reshape(-1)) == label)
    return correct / int(labels.shape[0])


def _is_qdq(path: Path) -> bool:
    """True if the model holds QuantizeLinear nodes (an int8 QDQ model)."""
    import onnx

    return any(n.op_type == "QuantizeLinear" for n in onnx.load(str(path)).graph.node)


def _cli(argv: list[str] | None = None) -> int:
    """Print the accuracy of each model given on the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.digits.accuracy", description="Top-1 accuracy over the digits hold-out set."
    )
    parser.add_argument("models", nargs="+", type=Path, help="ONNX model(s) to evaluate")
    parser.add_argument("--holdout", type=Path, required=True, help="digits_holdout.npz written by train.py")
    args = parser.parse_args(argv)
    for model in args.models:
        kind = "int8 " if _is_qdq(model) else "float"
        print(f"{kind} accuracy {evaluate(model, args.holdout):.4f}  {model}")
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
