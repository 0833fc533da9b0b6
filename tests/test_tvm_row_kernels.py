"""Kiln's row kernels on `--target cpu` (fp32): LayerNorm / RMSNorm (:mod:`backends.tvm.kernels.
row_norm`) and Softmax over the last axis (:mod:`backends.tvm.kernels.row_softmax`).

Each is one kernel (checked in the kernel log) and matches onnxruntime (RMSNorm: a float64
reference) at max rel 1e-5; a softmax over another axis keeps Relax's softmax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.runners import run_onnxruntime
from tests.helpers.numerics import agreement
from tests.test_tvm_attention import SMALL_MAX_REL, _legal, _run_tvm


def _norm_model(op: str, shape: tuple[int, ...], axis: int, opset: int) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    inner = shape[axis:]
    inits = [numpy_helper.from_array(rng.standard_normal(inner).astype(np.float32), "gamma")]
    ins = ["x", "gamma"]
    if op == "LayerNormalization":
        inits.append(numpy_helper.from_array(rng.standard_normal(inner).astype(np.float32), "beta"))
        ins.append("beta")
    node = helper.make_node(op, ins, ["y"], axis=axis, epsilon=1e-5)
    graph = helper.make_graph(
        [node],
        "norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(
    ("op", "shape", "axis"),
    [
        ("LayerNormalization", (2, 7, 48), -1),
        ("LayerNormalization", (3, 4, 5, 8), 2),
        ("RMSNormalization", (2, 7, 64), -1),
    ],
)
def test_row_norm_kernel_matches_onnxruntime(
    op: str, shape: tuple[int, ...], axis: int, tmp_path: Path
) -> None:
    model = _norm_model(op, shape, axis, 23 if op == "RMSNormalization" else 21)
    legal, path = _legal(model, tmp_path)
    x = (np.random.default_rng(2).standard_normal(shape) * 3 + 1).astype(np.float32)
    (got,), kernels = _run_tvm(legal, {"x": x})
    assert [k["op_class"] for k in kernels] == ["normalization"], kernels
    if op == "RMSNormalization":  # float64 reference (x / sqrt(mean x^2 + eps) * gamma)
        g = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
        x64 = x.astype(np.float64)
        axes = tuple(range(axis % len(shape), len(shape)))
        ref = x64 / np.sqrt(np.mean(x64 * x64, axis=axes, keepdims=True) + 1e-5) * g
    else:
        ref = run_onnxruntime(path, {"x": x})["y"]
    m = agreement(got, ref)
    assert m.max_rel <= SMALL_MAX_REL, f"{op}: max_rel {m.max_rel:.3g}"


@pytest.mark.parametrize(
    ("shape", "axis", "fused"),
    [
        ((2, 3, 5, 20), -1, True),  # 4-wide partials
        ((4, 16), 1, True),
        ((3, 37), -1, True),  # vector partials and a scalar tail
        ((3, 8, 6), 1, False),  # not the last axis
        ((5, 6), -1, False),  # rows shorter than a vector
    ],
)
def test_row_softmax_kernel_matches_onnxruntime(
    shape: tuple[int, ...], axis: int, fused: bool, tmp_path: Path
) -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], axis=axis)
    graph = helper.make_graph(
        [node],
        "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    legal, path = _legal(model, tmp_path)
    x = (np.random.default_rng(4).standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[0] = -np.inf  # a masked entry
    (got,), kernels = _run_tvm(legal, {"x": x})
    rules = [k["rule"] for k in kernels]
    assert (rules == ["row_softmax"]) == fused, rules
    ref = run_onnxruntime(path, {"x": x})["y"]
    m = agreement(got, ref)
    assert m.max_rel <= SMALL_MAX_REL, f"max_rel {m.max_rel:.3g}"


def _rms_chain(*, mul_form: bool, weight: bool, axes: list[int], eps: np.ndarray) -> onnx.ModelProto:
    """x / sqrt(mean(x^2) + eps) [* w] on [2, 6, 32], written the two ways exporters do."""
    shape = [2, 6, 32]
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(np.array(axes, np.int64), "axes"),
        numpy_helper.from_array(eps.astype(np.float32), "eps"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(rng.standard_normal(shape[-1]).astype(np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"])
        if mul_form
        else helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
    ]
    if mul_form:
        nodes.append(helper.make_node("Div", ["x", "rms"], ["n"]))
    else:
        nodes += [
            helper.make_node("Div", ["one", "rms"], ["inv"]),
            helper.make_node("Mul", ["x", "inv"], ["n"]),
        ]
    out = "n"
    if weight:
        nodes.append(helper.make_node("Mul", ["w", "n"], ["y"]))
        out = "y"
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


_RMS = {
    "pow-reciprocal-weight": (dict(mul_form=False, weight=True, axes=[-1], eps=np.array(1e-6)), True),
    "mul-div-no-weight": (dict(mul_form=True, weight=False, axes=[2], eps=np.array(1e-5)), True),
    # must not fire: the mean over a non-trailing axis, a per-channel eps
    "mean-over-axis-1": (dict(mul_form=False, weight=True, axes=[1], eps=np.array(1e-6)), False),
    "vector-eps": (dict(mul_form=False, weight=True, axes=[-1], eps=np.full((1, 6, 1), 1e-6)), False),
}


@pytest.mark.parametrize("case", sorted(_RMS))
def test_decomposed_rms_norm_fuses_and_matches_onnxruntime(case: str, tmp_path: Path) -> None:
    kwargs, fused = _RMS[case]
    model = _rms_chain(**kwargs)  # type: ignore[arg-type]
    legal, path = _legal(model, tmp_path)
    ops = [n.op for n in legal.ops()]
    assert (ops.count("RMSNormalization") == 1 and "ReduceMean" not in ops) == fused, ops
    x = (np.random.default_rng(6).standard_normal((2, 6, 32)) * 2).astype(np.float32)
    (got,), _ = _run_tvm(legal, {"x": x})
    ref = next(iter(run_onnxruntime(path, {"x": x}).values()))
    m = agreement(got, ref)
    assert m.max_rel <= SMALL_MAX_REL, f"{case}: max_rel {m.max_rel:.3g}"
