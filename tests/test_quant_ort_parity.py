"""Bit-level parity of Kiln's QDQ op references with onnxruntime (ORT_DISABLE_ALL, CPU).

* QuantizeLinear is ``saturate(round_half_even(x / s) + z)`` with a true float32 division (ORT/MLAS
  divides; ``x * (1/s)`` disagrees at rounding ties), DequantizeLinear ``(q - z) * s``: bit exact.
* HardSwish is ``x * clip(x * float32(1/6) + 0.5, 0, 1)`` and HardSigmoid ``clip(alpha*x + beta, 0, 1)``,
  both without FMA: bit exact.
* Ops that sum (Conv, ReduceMean, Resize) or approximate (Sigmoid) differ from ORT by float rounding
  only; fed ORT's own inputs, Kiln's quantized tensors then differ by at most 1 LSB, and only where
  ORT's ``x / s`` lies within float noise of a ``.5`` rounding tie.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from compiler.ir.graph import CONSTANT_OP, INPUT_OP
from compiler.ir.interpreter import run_graph
from compiler.ops.elementwise import HardSigmoidAttrs
from compiler.ops.quantize import DequantizeLinearAttrs, QuantizeLinearAttrs
from compiler.ops.registry import get_op
from frontends.registry import load_model

_BIT_EXACT_OPS = {
    "QuantizeLinear",
    "DequantizeLinear",
    "Mul",
    "Add",
    "Relu",
    "HardSigmoid",
    "HardSwish",
    "MaxPool",
}
_TIE_NOISE = 1e-4  # |frac(x/s) - 0.5| below this counts as a rounding tie within float noise


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto],
) -> onnx.ModelProto:
    m = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, inits), opset_imports=[helper.make_opsetid("", 21)]
    )
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


def _ort_single(op: str, x: np.ndarray, params: list[np.ndarray], out_dtype: int, **attrs: Any) -> np.ndarray:
    names = ["x"] + [f"p{i}" for i in range(len(params))]
    inits = [numpy_helper.from_array(p, n) for p, n in zip(params, names[1:], strict=True)]
    x_vi = helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
    y_vi = helper.make_tensor_value_info("y", out_dtype, x.shape)
    m = _model([helper.make_node(op, names, ["y"], **attrs)], [x_vi], [y_vi], inits)
    out: np.ndarray = _session(m).run(None, {"x": x})[0]
    return out


def _tie_inputs(rng: np.random.Generator, s: np.ndarray, per_axis: bool) -> np.ndarray:
    """x[2, C, 5*33, 5]: exact ties (k + 1/2) s, their float neighbours, ties plus noise, generic values."""
    c = 7
    k = rng.integers(-300, 300, (2, c, 33, 5)).astype(np.float32)
    sb = s.reshape(1, c, 1, 1) if per_axis else s
    tie = ((k + np.float32(0.5)) * sb).astype(np.float32)
    parts = [
        tie,
        np.nextafter(tie, np.float32(np.inf)),
        np.nextafter(tie, np.float32(-np.inf)),
        tie + rng.standard_normal(k.shape).astype(np.float32) * np.float32(1e-6),
        k * sb * np.float32(1.37),
    ]
    return np.concatenate(parts, axis=2).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_dequantize_bit_exact_at_ties(dtype: type[np.integer], per_axis: bool) -> None:
    rng = np.random.default_rng(7 + int(per_axis) + 2 * (dtype is np.int8))
    shape = (7,) if per_axis else ()
    info = np.iinfo(dtype)
    for _ in range(5):
        s = rng.uniform(1e-3, 2.0, shape).astype(np.float32)
        z = rng.integers(info.min, info.max, shape).astype(dtype)
        x = _tie_inputs(rng, s, per_axis)
        want = _ort_single(
            "QuantizeLinear", x, [s, z], helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), axis=1
        )
        got = get_op("QuantizeLinear").reference([x, s, z], QuantizeLinearAttrs(axis=1), 1)[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        # the data does exercise ties: the reciprocal form would disagree with ORT somewhere
        sb = s.reshape(1, -1, 1, 1) if per_axis else s
        zb = (z.reshape(1, -1, 1, 1) if per_axis else z).astype(np.float32)
        recip = np.clip(np.rint(x * (np.float32(1) / sb)) + zb, info.min, info.max).astype(dtype)
        assert np.any(recip != want)
        back = _ort_single("DequantizeLinear", want, [s, z], TensorProto.FLOAT, axis=1)
        got_back = get_op("DequantizeLinear").reference([want, s, z], DequantizeLinearAttrs(axis=1), 1)[0]
        np.testing.assert_array_equal(got_back, back)


def test_saturation_bit_exact() -> None:
    x = np.array([-1e30, -1e4, -129.5, -128.5, -0.5, 0.5, 126.5, 127.5, 254.5, 255.5, 1e4, 1e30], np.float32)
    for dtype in (np.uint8, np.int8):
        for zv in (0, 3):
            s, z = np.array(1.0, np.float32), np.array(zv, dtype)
            want = _ort_single("QuantizeLinear", x, [s, z], helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
            got = get_op("QuantizeLinear").reference([x, s, z], QuantizeLinearAttrs(), 1)[0]
            np.testing.assert_array_equal(got, want)


def test_hard_activations_bit_exact() -> None:
    x = (np.random.default_rng(3).standard_normal(1 << 16) * 5).astype(np.float32)
    want = _ort_single("HardSwish", x, [], TensorProto.FLOAT)
    np.testing.assert_array_equal(get_op("HardSwish").reference([x], None, 1)[0], want)
    for alpha, beta in ((0.2, 0.5), (1.0 / 6.0, 0.5)):
        want = _ort_single("HardSigmoid", x, [], TensorProto.FLOAT, alpha=alpha, beta=beta)
        got = get_op("HardSigmoid").reference([x], HardSigmoidAttrs(alpha, beta), 1)[0]
        np.testing.assert_array_equal(got, want, err_msg=f"HardSigmoid {alpha} {beta}")


def _qdq(
    name: str, scale: float, zero: int, dtype: int, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]
) -> str:
    zt = np.uint8 if dtype == TensorProto.UINT8 else np.int8
    inits += [
        numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
        numpy_helper.from_array(np.array(zero, zt), f"{name}_z"),
    ]
    nodes += [
        helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
        helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"]),
    ]
    return f"{name}_dq"


def _se_block_model() -> onnx.ModelProto:
    """QDQ chain: Conv -> HardSwish -> ReduceMean -> HardSigmoid -> Mul -> Resize -> MaxPool -> Add -> Sigmoid."""
    rng = np.random.default_rng(11)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    u8, i8 = TensorProto.UINT8, TensorProto.INT8
    x = _qdq("x", 0.02, 128, u8, nodes, inits)
    w = rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    ws = rng.uniform(0.002, 0.01, 8).astype(np.float32)
    bs = (np.float32(0.02) * ws).astype(np.float32)
    b = rng.integers(-2000, 2000, 8).astype(np.int32)
    inits += [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(ws, "ws"),
        numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(bs, "bs"),
        numpy_helper.from_array(np.zeros(8, np.int32), "bz"),
        numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
    ]
    nodes += [
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["w_dq"], axis=0),
        helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["b_dq"], axis=0),
        helper.make_node("Conv", [x, "w_dq", "b_dq"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c"], ["h"]),
    ]
    h = _qdq("h", 0.01, 30, u8, nodes, inits)
    nodes.append(helper.make_node("ReduceMean", [h, "axes"], ["r"], keepdims=1))
    r = _qdq("r", 0.004, 20, u8, nodes, inits)
    nodes.append(helper.make_node("HardSigmoid", [r], ["g"], alpha=0.2, beta=0.5))
    g = _qdq("g", 1.0 / 255.0, 0, u8, nodes, inits)
    nodes.append(helper.make_node("Mul", [h, g], ["m"]))
    m = _qdq("m", 0.007, 20, u8, nodes, inits)
    nodes.append(
        helper.make_node(
            "Resize", [m, "", "scales"], ["up"], mode="linear", coordinate_transformation_mode="half_pixel"
        )
    )
    up = _qdq("up", 0.006, -100, i8, nodes, inits)
    nodes.append(helper.make_node("MaxPool", [up], ["mp"], kernel_shape=[2, 2], strides=[2, 2]))
    mp = _qdq("mp", 0.006, -100, i8, nodes, inits)
    nodes.append(helper.make_node("Add", [mp, h], ["a"]))
    a = _qdq("a", 0.015, 10, u8, nodes, inits)
    nodes.append(helper.make_node("Sigmoid", [a], ["y"]))
    nodes.append(helper.make_node("QuantizeLinear", ["y", "g_s", "g_z"], ["y_q"]))
    x_vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 12, 12))
    y_vi = helper.make_tensor_value_info("y_q", TensorProto.UINT8, (1, 8, 12, 12))
    return _model(nodes, [x_vi], [y_vi], inits)


def _ort_all_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inferred = shape_inference.infer_shapes(model)
    full = onnx.ModelProto()
    full.CopyFrom(model)
    have = {o.name for o in full.graph.output}
    full.graph.output.extend(v for v in inferred.graph.value_info if v.name not in have)
    s = _session(full)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds), strict=True))


@pytest.fixture(scope="module")
def se_block(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    model = _se_block_model()
    path = tmp_path_factory.mktemp("qdq") / "se_block.onnx"
    onnx.save(model, str(path))
    feeds = {"x": (np.random.default_rng(5).standard_normal((1, 4, 12, 12)) * 1.2).astype(np.float32)}
    return path, feeds, _ort_all_values(model, feeds)


def test_local_parity_each_node_fed_ort_inputs(
    se_block: tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]],
) -> None:
    path, feeds, ortv = se_block
    graph = load_model(path)
    checked = 0
    for node in graph.nodes():
        if node.op in (INPUT_OP, CONSTANT_OP):
            continue
        args: list[np.ndarray | None] = []
        for v in graph.inputs_of(node):
            if v is None:
                args.append(None)
                continue
            src = graph.node(v.node)
            name = src.output_names[v.port]
            args.append(
                ortv[name] if name in ortv else (src.attrs.value if src.op == CONSTANT_OP else feeds[name])
            )
        got = np.asarray(get_op(node.op, node.domain).reference(args, node.attrs, 1)[0])
        name = node.output_names[0]
        if name not in ortv:
            continue
        want = ortv[name]
        checked += 1
        if node.op in _BIT_EXACT_OPS:
            np.testing.assert_array_equal(got.astype(want.dtype), want, err_msg=f"{node.op} {name}")
        else:
            scale = float(np.abs(want).max())
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * scale, err_msg=f"{node.op} {name}")
    assert checked >= 25


def test_end_to_end_quantized_tensors_within_one_lsb_at_ties(
    se_block: tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]],
) -> None:
    path, feeds, ortv = se_block
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    kiln = run_graph(load_model(path), feeds, keep_all=True)
    values = {**feeds, **ortv}
    n_q, upstream_flipped = 0, False
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in inits:
            continue
        q = node.output[0]
        diff = np.abs(kiln[q].astype(np.int32) - ortv[q].astype(np.int32))
        assert diff.max() <= 1, q
        if not upstream_flipped:
            # the first flips come from float noise at a tie: ORT's own x/s sits within noise of k + 1/2
            frac = np.abs(np.mod(values[node.input[0]] / inits[node.input[1]], 1.0) - 0.5)
            assert np.all(frac[diff > 0] < _TIE_NOISE), q
        upstream_flipped |= bool(diff.any())
        n_q += 1
    assert n_q == 9
