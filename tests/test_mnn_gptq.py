"""GPTQ rounding of MNN weight-only int8/int4 weights (``--mnn-weights int8|int4 --calib DATA``).

* The grid GPTQ (backends/mnn/gptq_weights.py) equals nearest rounding bit for bit when H is
  diagonal (no coupling between columns), on every grid MNN stores (int8/int4, symmetric or
  asymmetric, per channel or block-wise, fp32 or fp16 scales); with a correlated H it keeps the
  grid (same scales, levels in range) and lowers the layer's output error (W - Ŵ) H (W - Ŵ)ᵀ.
* A Kiln ``.mnn`` written with GPTQ levels reads back (Kiln's reader) to exactly those levels
  times their scales, and the levels differ from nearest rounding.
* ``kiln compile --emit mnn --mnn-weights int8 --calib`` is byte-identical twice and
  records the calibration file; ``--calib`` with float MNN weights is exit 2.
* pan_mnv3s int8 with 2 calibration samples: fewer fp16 fallback layers than nearest rounding
  (0 against 2) and MNN's output cosine >= 0.999 on the real input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.mnn.gptq_weights import gptq_plan, gptq_quantized
from backends.mnn.options import MnnOptions
from backends.mnn.precision import weight_layers
from backends.mnn.weights import quantize_weights
from backends.mnn.writer import write_mnn
from compiler.api import PassManager, load_model
from compiler.cli import main
from compiler.ir.graph import Graph
from frontends.mnn.loader import load_mnn
from schemas.mnn.quantized_weights import QuantizedWeights, dequantize_weights
from tests.conftest import MODELS

STEM = "ppocr_mobile_v2_cls"
SHAPE = "x=1x3x48x192"
CALIB = MODELS / "data" / f"{STEM}.calib.npz"
GRIDS = [
    (8, False, None, False),
    (8, True, None, False),
    (4, False, None, True),
    (4, True, 8, False),
    (8, False, 8, True),
    (4, False, 16, False),
]


def _error(w: np.ndarray, wq: np.ndarray, h: np.ndarray) -> float:
    d = (w - wq).astype(np.float64)
    return float(np.einsum("ok,kl,ol->", d, h, d))


@pytest.mark.parametrize("bits,asym,block,fp16", GRIDS)
def test_diagonal_hessian_gives_nearest_rounding(
    bits: int, asym: bool, block: int | None, fp16: bool
) -> None:
    rng = np.random.default_rng(bits + 2 * asym)
    w = (rng.standard_normal((12, 32)) * rng.uniform(0.01, 3.0, (12, 1))).astype(np.float32)
    w[3] = 0.0  # a zero row: scale 0
    groups = 3  # three groups of four rows, each its own diagonal H
    h = np.stack([np.diag(rng.uniform(0.1, 10.0, 32)) for _ in range(groups)])
    h[1, 5, 5] = 0.0  # a column no input reaches
    near = quantize_weights(w, bits, asym, block, fp16)
    got = gptq_quantized(w, h, bits, asym, block, fp16)
    np.testing.assert_array_equal(got.q, near.q)
    np.testing.assert_array_equal(got.alpha, near.alpha)
    assert (got.groups, got.bits, got.asymmetric) == (near.groups, near.bits, near.asymmetric)


@pytest.mark.parametrize("bits,asym,block,fp16", GRIDS)
def test_correlated_hessian_keeps_the_grid_and_lowers_the_error(
    bits: int, asym: bool, block: int | None, fp16: bool
) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((400, 32)) @ rng.standard_normal((32, 32)) + 0.5
    h = (x.T @ x)[None]
    w = rng.standard_normal((16, 32)).astype(np.float32)
    near = quantize_weights(w, bits, asym, block, fp16)
    got = gptq_quantized(w, h, bits, asym, block, fp16)
    np.testing.assert_array_equal(got.alpha, near.alpha)
    half = 1 << (bits - 1)
    assert got.q.min() >= (-half if asym else -(half - 1)) and got.q.max() <= half - 1
    assert (got.q != near.q).mean() > 0.1
    e_near = _error(w, dequantize_weights(near), h[0])
    e_gptq = _error(w, dequantize_weights(got), h[0])
    assert e_gptq < 0.8 * e_near, (e_gptq, e_near)


@pytest.fixture(scope="module")
def optimized() -> Graph:
    from compiler.pipelines import pipeline

    graph = load_model(MODELS / f"{STEM}.onnx", input_shapes={"x": (1, 3, 48, 192)})
    PassManager(pipeline("default")).run(graph)
    return graph


def _conv_weights(graph: Graph) -> dict[str, np.ndarray]:
    out = {}
    for n in graph.nodes():
        if n.qualified_op in ("Conv", "kiln::FusedConv"):
            wv = graph.inputs_of(n)[1]
            assert wv is not None and wv.const is not None
            out[n.output_names[0]] = np.asarray(wv.const, np.float32)
    return out


def test_written_file_decodes_to_the_gptq_levels(optimized: Graph, tmp_path: Path) -> None:
    options = MnnOptions(
        weights="int4", asymmetric=True, block_size=8, scale="fp16", calib=CALIB, calib_count=4
    )
    plan = gptq_plan(optimized, options, None)
    layers = weight_layers(optimized)
    assert len(plan.storage) == len(layers) == 54  # 53 convs and the classifier's Gemm
    assert sorted({n.op for n, _ in layers}) == ["Conv", "FusedConv", "Gemm"]
    path = tmp_path / "model.mnn"
    write_mnn(optimized, path, options, STEM, storage=plan.storage)
    read = _conv_weights(load_mnn(path))
    changed = 0
    for node, view in layers:
        levels = plan.storage[node.id].levels
        assert isinstance(levels, QuantizedWeights)
        if node.op != "Gemm":
            name = node.output_names[0]  # a conv with a separate activation writes <name>__conv
            got = read[name] if name in read else read[f"{name}__conv"]
            np.testing.assert_array_equal(got, dequantize_weights(levels).reshape(got.shape))
        near = quantize_weights(view.rows, 4, True, view.block_elems(8), True)
        np.testing.assert_array_equal(levels.alpha, near.alpha)
        changed += int((levels.q != near.q).any())
    assert changed >= 40, changed


def _compile(out: Path, *extra: str) -> int:
    args = ["compile", str(MODELS / f"{STEM}.onnx"), "--input-shape", SHAPE, "--emit", "mnn", "-o", str(out)]
    return main([*args, "--inputs", str(MODELS / "data" / f"{STEM}.npz"), *extra])


def test_cli_gptq_is_deterministic_and_recorded(tmp_path: Path) -> None:
    flags = ("--mnn-weights", "int8", "--calib", str(CALIB), "--calib-count", "3", "--no-verify")
    assert _compile(tmp_path / "a", *flags) == 0
    assert _compile(tmp_path / "b", *flags) == 0
    a, b = (tmp_path / d / "model.mnn" for d in "ab")
    assert a.read_bytes() == b.read_bytes()
    import json

    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["options"]["mnn"]["calib"] == CALIB.name


@pytest.mark.parametrize(
    "extra",
    [
        ("--emit", "mnn", "--mnn-weights", "fp16", "--calib", str(CALIB)),
        ("--emit", "mnn", "--calib", str(CALIB)),
        ("--emit", "onnx", "--calib", str(CALIB)),
    ],
)
def test_calib_without_a_use_is_exit_2(tmp_path: Path, extra: tuple[str, ...]) -> None:
    assert main(["compile", str(MODELS / f"{STEM}.onnx"), "-o", str(tmp_path / "o"), *extra]) == 2
    assert not (tmp_path / "o").exists()


def test_pan_int8_gptq_needs_fewer_fp16_layers_and_meets_the_cosine(tmp_path: Path) -> None:
    """pan_mnv3s int8 on its real input: nearest rounding keeps 2 of 67 layers in fp16 (every layer
    int8: cosine 0.98809); GPTQ from 2 calibration samples keeps none (measured: 0 layers, MNN's
    output cosine 0.99951 against onnxruntime on the original model)."""
    import onnxruntime as ort

    from backends.mnn.precision import plan_weights
    from backends.mnn.runtime import run_mnn
    from compiler.metrics import agreement
    from compiler.pipelines import pipeline

    stem = "pan_mnv3s_skin_clothes_hair"
    with np.load(MODELS / "data" / f"{stem}.npz") as z:
        feeds = {k: z[k] for k in z.files}
    graph = load_model(MODELS / f"{stem}.onnx")
    PassManager(pipeline("default")).run(graph)
    nearest = plan_weights(graph, MnnOptions(weights="int8"), feeds)
    options = MnnOptions(weights="int8", calib=MODELS / "data" / f"{stem}.calib.npz", calib_count=2)
    plan = gptq_plan(graph, options, feeds)
    fp16 = [nid for nid, st in plan.storage.items() if st.kind == "fp16"]
    assert len(nearest.kept) == 2 and len(fp16) == len(plan.kept) < len(nearest.kept), (
        nearest.kept,
        plan.kept,
    )
    path = tmp_path / "model.mnn"
    write_mnn(graph, path, options, stem, storage=plan.storage)
    got = run_mnn(path, feeds)
    sess = ort.InferenceSession(str(MODELS / f"{stem}.onnx"), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    cos = min(agreement(got[k], ref[k]).cosine for k in ref)
    assert cos >= 0.999, cos
