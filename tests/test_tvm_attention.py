"""fuse-attention and Kiln's fused attention kernel on `--target cpu` (fp32).

Synthetic blocks (onnx.helper) against onnxruntime at max rel 1e-5 (few ops, float noise only);
bert and vit_tiny from the zoo at the project's fp32 tolerance, 1e-4. Structure: the chain
becomes one Attention node (one ``kiln_attention`` kernel, no Softmax left); must-not-fire cases
keep the chain: a softmax over the query axis, a non-scalar scale, a second reader of the scores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.tvm.emit import prepare_graph
from backends.tvm.target import resolve_target
from compiler.api import load_model
from compiler.ir.graph import Graph
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from compiler.runners import run_onnxruntime
from tests.helpers.numerics import agreement
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

SMALL_MAX_REL = 1e-5
ZOO_MAX_REL = 1e-4
B, H, S, T, D = 2, 3, 13, 19, 16  # neither S nor T a multiple of the vector width


def _chain_model(
    *,
    queries: int = S,
    axis: int = -1,
    scale: np.ndarray | None = None,
    div: float | None = None,
    qk_scale: float | None = None,
    mask_shape: tuple[int, ...] | None = (B, 1, 1, T),
    bias_shape: tuple[int, ...] | None = None,
    window_mask: bool = False,
    extra_reader: bool = False,
) -> onnx.ModelProto:
    """MatMul(Q, Kᵀ) [· scale | / div] [+ mask] -> Softmax(axis) -> MatMul(·, V) on [B, H, ., D]."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    inits = []
    q, kt = "q", "kt"
    if qk_scale is not None:  # the scale split over Q and Kᵀ (timm's ViT)
        inits.append(numpy_helper.from_array(np.array(qk_scale, np.float32), "c"))
        nodes += [helper.make_node("Mul", ["q", "c"], ["qs"]), helper.make_node("Mul", ["kt", "c"], ["kts"])]
        q, kt = "qs", "kts"
    nodes.append(helper.make_node("MatMul", [q, kt], ["s0"]))
    cur = "s0"
    if scale is not None:
        inits.append(numpy_helper.from_array(scale.astype(np.float32), "scale"))
        nodes.append(helper.make_node("Mul", [cur, "scale"], ["s1"]))
        cur = "s1"
    if div is not None:
        inits.append(numpy_helper.from_array(np.array(div, np.float32), "div"))
        nodes.append(helper.make_node("Div", [cur, "div"], ["s2"]))
        cur = "s2"
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, H, queries, D]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, [B, H, T, D]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, H, T, D]),
    ]
    if bias_shape is not None:  # T5's position bias, added before the mask
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, list(bias_shape)))
        nodes.append(helper.make_node("Add", [cur, "bias"], ["s_b"]))
        cur = "s_b"
    if mask_shape is not None:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, list(mask_shape)))
        nodes.append(helper.make_node("Add", [cur, "mask"], ["s3"]))
        cur = "s3"
    if window_mask:  # Swin: a constant [1, B, 1, S, T] added through a 5-D view
        win = np.where(np.random.default_rng(7).random((1, B, 1, S, T)) > 0.3, 0.0, -100.0)
        inits += [
            numpy_helper.from_array(win.astype(np.float32), "win"),
            numpy_helper.from_array(np.array([1, B, H, S, T], np.int64), "shape5"),
            numpy_helper.from_array(np.array([B, H, S, T], np.int64), "shape4"),
        ]
        nodes += [
            helper.make_node("Reshape", [cur, "shape5"], ["s5"]),
            helper.make_node("Add", ["s5", "win"], ["s5m"]),
            helper.make_node("Reshape", ["s5m", "shape4"], ["s_w"]),
        ]
        cur = "s_w"
    soft_in = cur
    nodes.append(helper.make_node("Softmax", [soft_in], ["p"], axis=axis))
    nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info(soft_in, TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "attention_block", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    if "mask" in feeds:  # an additive mask: 0 or a large negative value (as HF writes it)
        feeds["mask"] = np.where(feeds["mask"] > -0.5, 0.0, -1e9).astype(np.float32)
    return feeds


def _legal(model: onnx.ModelProto, tmp: Path) -> tuple[Graph, Path]:
    path = tmp / "model.onnx"
    onnx.save(model, path)
    g = load_model(path)
    legal, _ = prepare_graph(g, resolve_target("cpu"))
    return legal, path


def _ops(g: Graph) -> dict[str, int]:
    hist: dict[str, int] = {}
    for n in g.ops():
        hist[n.op] = hist.get(n.op, 0) + 1
    return hist


def _run_tvm(g: Graph, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[dict]]:
    import tvm
    from tvm import relax

    from backends.tvm.build import compile_module
    from backends.tvm.lower import lower_graph

    spec = resolve_target("cpu")
    lowered = lower_graph(g, spec)
    ex = compile_module(lowered.mod, spec)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in g.inputs])
    outs = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
    return [o.numpy() for o in outs], lowered.kernels


_FUSED = {
    "mul-scale-mask": dict(scale=np.array(0.25)),
    "div-scale-no-mask": dict(div=4.0, mask_shape=None),
    "scale-on-q-and-k": dict(qk_scale=0.5, mask_shape=(S, T)),
    "per-row-mask": dict(scale=np.array(0.25), mask_shape=(B, H, S, T)),
    "bias-and-mask": dict(bias_shape=(1, H, S, T)),
    "window-mask": dict(scale=np.array(0.25), mask_shape=None, window_mask=True),
}


@pytest.mark.parametrize("case", sorted(_FUSED))
def test_chain_fuses_and_matches_onnxruntime(case: str, tmp_path: Path) -> None:
    model = _chain_model(**_FUSED[case])  # type: ignore[arg-type]
    legal, path = _legal(model, tmp_path)
    hist = _ops(legal)
    assert hist.get("Attention") == 1 and "Softmax" not in hist and "MatMul" not in hist, hist
    feeds = _feeds(model)
    (got,), kernels = _run_tvm(legal, feeds)
    assert sum(k["op_class"] == "attention" for k in kernels) == 1, kernels
    ref = run_onnxruntime(path, feeds)["y"]
    m = agreement(got, ref)
    assert m.max_rel <= SMALL_MAX_REL, f"{case}: max_rel {m.max_rel:.3g}"


_NOT_FUSED = {
    # softmax over the query axis is not attention (S = T so the shapes still fit)
    "softmax-over-queries": dict(axis=2, queries=T),
    "per-key-scale": dict(scale=np.linspace(0.1, 0.5, T).reshape(1, 1, 1, T)),
    "scores-read-twice": dict(scale=np.array(0.25), extra_reader=True),
}


@pytest.mark.parametrize("case", sorted(_NOT_FUSED))
def test_chain_must_not_fuse(case: str, tmp_path: Path) -> None:
    model = _chain_model(**_NOT_FUSED[case])  # type: ignore[arg-type]
    legal, path = _legal(model, tmp_path)
    hist = _ops(legal)
    assert "Attention" not in hist and hist.get("Softmax") == 1, hist
    feeds = _feeds(model)
    got, _ = _run_tvm(legal, feeds)
    ref = run_onnxruntime(path, feeds)
    for name, g in zip([o.name for o in model.graph.output], got, strict=True):
        m = agreement(g, ref[name])
        assert m.max_rel <= SMALL_MAX_REL, f"{case} {name}: max_rel {m.max_rel:.3g}"


@pytest.mark.parametrize("name", ["bert", "vit_tiny_patch16_224"])
def test_zoo_transformer_matches_onnxruntime(name: str, zoo: ZooCache) -> None:  # noqa: F811
    m = zoo.get(name)
    g = load_model(m.model)
    PassManager(pipeline("default")).run(g)
    legal, _ = prepare_graph(g, resolve_target("cpu"))
    hist = _ops(legal)
    assert hist.get("Attention", 0) >= 1 and "Softmax" not in hist, hist
    with np.load(m.inputs) as z:
        feeds = {k: np.asarray(z[k]) for k in z.files}
    got, kernels = _run_tvm(legal, feeds)
    assert sum(k["op_class"] == "attention" for k in kernels) >= 1
    ref = run_onnxruntime(m.model, feeds)
    for out, (oname, r) in zip(got, ref.items(), strict=True):
        a = agreement(out, r)
        assert a.max_rel <= ZOO_MAX_REL, f"{name} {oname}: max_rel {a.max_rel:.3g}"


@pytest.mark.parametrize(
    ("s", "t", "d", "dv"), [(1, 1, 1, 1), (5, 9, 8, 3), (7, 40, 24, 20), (8, 16, 32, 32)]
)
def test_attention_kernel_shapes(s: int, t: int, d: int, dv: int) -> None:
    """The kernel alone on unit, odd and whole-vector extents (rows, keys, depths), against float64;
    a query row whose mask is -inf on every key gives 0."""
    import tvm

    from backends.tvm.kernels.attention import AttentionSpec, attention_kernel, pick_attention_rows

    target = resolve_target("cpu")
    rows = pick_attention_rows(s, dv, target.lanes)
    sp, tp = -(-s // rows) * rows, -(-t // target.lanes) * target.lanes
    spec = AttentionSpec(1, 2, sp, d, t, tp, dv, (1, 1, sp), 0.3, rows)
    lib = tvm.compile(tvm.IRModule({"main": attention_kernel(spec, target).func}), target=target.tvm_target())
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, sp, d)).astype(np.float32)
    kt = np.zeros((1, 2, d, tp), np.float32)
    kt[..., :t] = rng.standard_normal((1, 2, d, t))
    v = rng.standard_normal((1, 2, t, dv)).astype(np.float32)
    mask = np.full((1, 1, sp, tp), -np.inf, np.float32)
    mask[..., :t] = rng.standard_normal((1, 1, sp, t))
    mask[0, 0, 0, :] = -np.inf  # a dead row
    args = [tvm.runtime.tensor(a) for a in (q, kt, v, mask, np.zeros((1, 2, sp, dv), np.float32))]
    lib["main"](*args)
    sc = (q.astype(np.float64) @ kt[..., :t]) * 0.3 + mask[..., :t]
    top = np.max(sc, -1, keepdims=True)
    e = np.exp(sc - np.where(np.isneginf(top), 0.0, top))
    p = np.where(np.isneginf(top), 0.0, e / np.maximum(e.sum(-1, keepdims=True), 1e-300))
    ref = p @ v
    got = args[4].numpy()
    assert np.all(got[:, :, 0] == 0.0)
    np.testing.assert_allclose(got, ref, rtol=0, atol=SMALL_MAX_REL * max(1.0, float(np.abs(ref).max())))
