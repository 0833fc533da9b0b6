"""Weight-only int4/int8: ``kiln::WeightOnlyMatMul``, its MatMulNBits export and ``quantize-weights``.

* Export: onnxruntime running the exported ``com.microsoft::MatMulNBits`` equals the op's numpy
  reference, max|a - e| <= 1e-5 · max(1, max|e|) (measured <= 1e-6), for bits 4 and 8, blocks
  32/64/128, fp16 and fp32 scales, symmetric and asymmetric, K a multiple of the block or not;
  the interpreter on the expansion (the MatMulNBits reference, unpacking) equals it exactly.
* Pass: op counts, every must-not-fire case with its reason, idempotence, ``quantize-int4w``
  (normalize-gemm first), accuracy against onnxruntime fp32 (cosine), GPTQ with calibration data
  (same grid, lower output error than nearest rounding on the calibration inputs).
* CLI: the weight-only flags and their refusals; a compile's manifest and ONNX file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.cli import main
from compiler.errors import OptionError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.ir.types import DType, TensorType
from compiler.onnx_export import export_onnx
from compiler.ops.fused import KILN
from compiler.ops.registry import get_op
from compiler.ops.weight_only import WeightOnlyMatMulAttrs, block_count, level_range
from compiler.options import CompileOptions
from compiler.pass_infra import PassContext
from compiler.quant.options import QuantOptions
from frontends.onnx.loader import load_onnx
from passes.quantize_weights import QuantizeWeights
from tests.helpers.numerics import agreement, assert_close
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, ort, ort_graph, run_passes

EXPORT_TOL = 1e-5  # max|ORT - reference| / max(1, max|reference|); measured <= 1e-6
CONFIGS = [
    (b, bs, sd, sym) for b in (4, 8) for bs in (32, 64, 128) for sd in ("fp16", "fp32") for sym in (1, 0)
]


def _op_graph(
    k: int, n: int, bits: int, block: int, scale_dtype: str, symmetric: bool, bias: bool, seed: int
) -> Graph:
    """A graph y = kiln::WeightOnlyMatMul(a [2, 5, K], random full-range levels, scales, zero points)."""
    rng = np.random.default_rng(seed)
    lo, hi = level_range(bits)
    nb = block_count(k, block)
    g = Graph("wo")
    a = g.add_input("a", TensorType(DType.FLOAT32, (2, 5, k)))
    ins = [
        a,
        g.add_constant(rng.integers(lo, hi + 1, (n, k)).astype(np.int8), "levels"),
        g.add_constant(
            rng.uniform(0.001, 0.05, (n, nb)).astype(np.float16 if scale_dtype == "fp16" else np.float32), "s"
        ),
        None if symmetric else g.add_constant(rng.integers(lo, hi + 1, (n, nb)).astype(np.int8), "z"),
        g.add_constant(rng.standard_normal(n).astype(np.float32), "bias") if bias else None,
    ]
    while ins[-1] is None:
        ins.pop()
    node = g.add_node(
        "WeightOnlyMatMul",
        ins,
        WeightOnlyMatMulAttrs(bits, block),
        domain=KILN,
        name="wo",
        output_names=["y"],
    )
    g.set_outputs([g.value(node)])
    return g


@pytest.mark.parametrize("bits,block,scale_dtype,symmetric", CONFIGS)
@pytest.mark.parametrize("k", [256, 200])
def test_matmulnbits_export_matches_reference(
    bits: int, block: int, scale_dtype: str, symmetric: int, k: int
) -> None:
    g = _op_graph(k, 48, bits, block, scale_dtype, bool(symmetric), bias=k == 256, seed=bits + block + k)
    feeds = {"a": rand(2, 5, k, seed=7)}
    ref = run_graph(g, feeds)["y"]
    model = export_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == ("MatMulNBits", "com.microsoft")
    assert {o.domain: o.version for o in model.opset_import}["com.microsoft"] == 1
    assert len(model.graph.initializer) == (
        2 + (not symmetric) + (k == 256)
    )  # B, scales[, zp][, bias]: no int8 levels left
    got = ort(model, feeds)["y"]
    assert_close(got, ref, rtol=0.0, atol=EXPORT_TOL * max(1.0, float(np.abs(ref).max())))
    # the MatMulNBits reference (unpacking B and the zero points) is the op's arithmetic exactly
    expanded = g.clone()
    (wo,) = expanded.ops()
    expand = get_op("WeightOnlyMatMul", KILN).expand
    assert expand is not None
    (new,) = expand(expanded, wo)
    expanded.replace_all_uses(expanded.value(wo), new)
    np.testing.assert_array_equal(run_graph(expanded, feeds)["y"], ref)


@pytest.mark.parametrize(
    "bits,symmetric,k", [(4, True, 256), (4, False, 200), (8, False, 256), (8, True, 200)]
)
def test_matmulnbits_imports_back(bits: int, symmetric: bool, k: int) -> None:
    """The ONNX frontend lifts MatMulNBits back into the op: the same levels, scales, zero points."""
    g = _op_graph(k, 24, bits, 64, "fp16", symmetric, bias=True, seed=k + bits)
    back = load_onnx(export_onnx(g))
    (node,) = back.ops()
    assert (node.qualified_op, node.attrs) == ("kiln::WeightOnlyMatMul", WeightOnlyMatMulAttrs(bits, 64))
    (orig,) = g.ops()
    for port, (want, got) in enumerate(zip(g.inputs_of(orig)[1:], back.inputs_of(node)[1:], strict=True)):
        assert (want is None) == (got is None) == (port == 2 and symmetric), port
        if want is None or got is None:
            continue
        assert want.const is not None and got.const is not None
        np.testing.assert_array_equal(
            got.const, want.const.astype(got.const.dtype), err_msg=f"input {port + 1}"
        )
    feeds = {"a": rand(2, 5, k, seed=3)}
    np.testing.assert_array_equal(run_graph(back, feeds)["y"], run_graph(g, feeds)["y"])


def test_op_refuses_bad_operands() -> None:
    g = _op_graph(256, 8, 4, 32, "fp32", True, False, 0)
    (node,) = g.ops()
    ins = g.inputs_of(node)
    with pytest.raises(ValueError, match="levels must lie in \\[-8, 7\\]"):
        g.add_node(
            "WeightOnlyMatMul", [ins[0], g.add_constant(np.full((8, 256), 9, np.int8)), ins[2]], domain=KILN
        )
    with pytest.raises(ValueError, match="scales must be \\[N, n_blocks\\] = \\[8, 8\\]"):
        g.add_node(
            "WeightOnlyMatMul", [ins[0], ins[1], g.add_constant(np.ones((8, 4), np.float32))], domain=KILN
        )
    with pytest.raises(ValueError, match="power of two >= 16"):
        g.add_node("WeightOnlyMatMul", ins, {"block_size": 24}, domain=KILN)


# ------------------------------------------------------------------------------- the pass
W = {
    "W1": rand(256, 64, seed=1),
    "Ws": rand(16, 32, seed=2),
    "Wg": rand(48, 256, seed=3),
    "Wg0": rand(256, 40, seed=4),
    "C": rand(48, seed=5),
    "Cm": rand(16, 48, seed=6),
    "Wr": rand(200, 32, seed=7),
    "Wbig": rand(256, 8, seed=8, scale=1e6),
    "W3": rand(2, 256, 8, seed=9),
}
INPUTS = {"x": (2, 8, 256), "kb": (2, 256, 8), "xs": (2, 8, 16), "x2": (16, 256), "x3": (4, 200), "v": (256,)}
BODY = """
    y1 = MatMul(x, W1)
    y2 = MatMul(x, kb)
    y3 = MatMul(xs, Ws)
    y4 = Gemm<transB=1>(x2, Wg, C)
    y5 = Gemm(x2, Wg0)
    y6 = Gemm<transB=1>(x2, Wg, Cm)
    y7 = Gemm<alpha=0.5, transB=1>(x2, Wg, C)
    y8 = MatMul(x3, Wr)
    y9 = MatMul(v, W1)
    y10 = MatMul(x, Wbig)
    y11 = MatMul(x, W3)
    y12 = MatMul(x, W1)
"""
OUT_SHAPES = {
    "y1": (2, 8, 64), "y2": (2, 8, 8), "y3": (2, 8, 32), "y4": (16, 48), "y5": (16, 40), "y6": (16, 48),
    "y7": (16, 48), "y8": (4, 32), "y9": (64,), "y10": (2, 8, 8), "y11": (2, 8, 8), "y12": (2, 8, 64),
}  # fmt: skip
FIRES = {"y1", "y4", "y5", "y8"}
REFUSED = {
    "y2": "B is not a constant",
    "y3": "K=16 is less than one block (32)",
    "y6": "C [16, 48] is not a float32 per-column bias of N=48 values",
    "y7": "Gemm with transA, alpha or beta (normalize-gemm rewrites it, unless B is dequantized)",
    "y9": "A must have rank >= 2",
    "y10": "fp16 scales would overflow",
    "y11": "B is 3-D, not 2-D",
    "y12": "kept float (--keep-float y12)",
}


def _shape(s: tuple[int, ...]) -> str:
    return ",".join(map(str, s))


def _model() -> onnx.ModelProto:
    ins = ", ".join(f"float[{_shape(s)}] {n}" for n, s in INPUTS.items())
    outs = ", ".join(f"float[{_shape(s)}] {n}" for n, s in OUT_SHAPES.items())
    return text_model(f"g ({ins}) => ({outs}) {{{BODY}}}", 17, 8, **W)


def _feeds() -> dict[str, np.ndarray]:
    return {n: rand(*s, seed=20 + i) for i, (n, s) in enumerate(INPUTS.items())}


def _ctx(calib: Path | None = None) -> PassContext:
    q = QuantOptions(mode="int4w", calib=calib, keep_float=("y12",))
    return PassContext(options=CompileOptions(model=Path("m.onnx"), out_dir=Path("out"), quant=q))


SPECS = {
    "int4-sym-fp16": (QuantizeWeights(), FIRES, REFUSED),
    # 8 bits, fp32 scales, zero points: Wbig fits; blocks of 64 leave K=16 short of one block
    "int8-asym-fp32-64": (
        QuantizeWeights(bits=8, block_size=64, scale_dtype="fp32", symmetric=False),
        FIRES | {"y10"},
        {k: v for k, v in REFUSED.items() if k != "y10"} | {"y3": "K=16 is less than one block (64)"},
    ),
}


@pytest.mark.parametrize("case", list(SPECS))
def test_pass_structure_reasons_and_idempotence(case: str) -> None:
    spec, fires, refused = SPECS[case]
    g = load_onnx(_model())
    ctx = _ctx()
    assert run_passes(g, [spec], ctx).changed
    counts = op_counts(g)
    assert counts["kiln::WeightOnlyMatMul"] == len(fires)
    assert {n for n in OUT_SHAPES if g.find_value(n).producer.op == "WeightOnlyMatMul"} == fires
    reasons = {m.node: m.reason for m in ctx.near_misses}
    assert set(reasons) == set(refused)
    for node, reason in refused.items():
        assert reasons[node].startswith(reason), (node, reasons[node])
    record = ctx.state["quantize-weights"]
    assert [layer["node"] for layer in record["layers"]] == sorted(fires, key=lambda n: int(n[1:]))
    assert record["rounding"] == "nearest"
    assert record["quantized_bytes"] < record["float_bytes"] / (2.5 if spec.bits == 8 else 5)
    assert not run_passes(g, [spec], _ctx()).changed  # idempotent


@pytest.mark.parametrize("mode,min_cosine", [("int4w", 0.99), ("int8w", 0.9999)])
def test_quantize_pipeline_accuracy(mode: str, min_cosine: float) -> None:
    """``quantize-int4w``/``-int8w`` with fp32 scales: normalize-gemm first, so y7 fires too, and
    Wbig (y10) fits; cosine against onnxruntime fp32, and ORT of the export = the interpreter."""
    from compiler.pipelines import quantization_pipeline

    model, feeds = _model(), _feeds()
    g = load_onnx(model)
    q = QuantOptions(mode=mode, keep_float=("y12",), weight_scale_type="fp32")
    ctx = PassContext(options=CompileOptions(model=Path("m.onnx"), out_dir=Path("out"), quant=q))
    run_passes(g, quantization_pipeline(q), ctx)
    fired = FIRES | {"y7", "y10"}
    assert {n for n in OUT_SHAPES if g.find_value(n).producer.op == "WeightOnlyMatMul"} == fired
    ref, got = ort(model, feeds), ort_graph(g, feeds)
    interp = run_graph(g, feeds)
    for name in sorted(OUT_SHAPES):
        scale = max(1.0, float(np.abs(interp[name]).max()))
        assert_close(got[name], interp[name], rtol=0.0, atol=EXPORT_TOL * scale, what=name)
        if name in fired:
            assert agreement(got[name], ref[name]).cosine >= min_cosine, name
        else:
            assert_close(got[name], ref[name], rtol=0.0, atol=EXPORT_TOL * scale, what=name)


def _gptq_model(tmp_path: Path) -> tuple[onnx.ModelProto, Path, dict[str, np.ndarray]]:
    """y = x @ W with strongly correlated input features (what GPTQ exploits), and calibration data."""
    rng = np.random.default_rng(3)
    mix = rng.standard_normal((16, 128)).astype(np.float32)
    samples = (rng.standard_normal((6, 32, 16)) @ mix + 0.05 * rng.standard_normal((6, 32, 128))).astype(
        np.float32
    )
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=samples)
    model = text_model(
        "g (float[32,128] x) => (float[32,48] y) { y = MatMul(x, W) }", 17, 8, W=rand(128, 48, seed=4)
    )
    return model, calib, {"x": samples[0]}


@pytest.mark.parametrize("symmetric", [True, False])
def test_gptq_keeps_the_grid_and_lowers_the_output_error(tmp_path: Path, symmetric: bool) -> None:
    model, calib, _ = _gptq_model(tmp_path)
    samples = np.load(calib)["x"]
    graphs = {}
    for rounding in ("nearest", "auto", "gptq"):
        g = load_onnx(model)
        ctx = _ctx(calib)
        run_passes(g, [QuantizeWeights(symmetric=symmetric, rounding=rounding)], ctx)
        assert ctx.state["quantize-weights"]["rounding"] == ("nearest" if rounding == "nearest" else "gptq")
        graphs[rounding] = g
    consts = {
        r: {n.output_names[0]: n.attrs.value for n in g.nodes() if n.op == "Constant"}
        for r, g in graphs.items()
    }
    for name in consts["nearest"]:
        if not name.endswith("_levels"):
            np.testing.assert_array_equal(consts["auto"][name], consts["nearest"][name])  # same grid
    assert not np.array_equal(consts["auto"]["y_levels"], consts["nearest"]["y_levels"])
    np.testing.assert_array_equal(consts["auto"]["y_levels"], consts["gptq"]["y_levels"])  # deterministic
    graphs.pop("gptq")
    err = {}
    for r, g in graphs.items():
        e = [agreement(ort_graph(g, {"x": s})["y"], ort(model, {"x": s})["y"]).sqnr_db for s in samples]
        err[r] = float(np.mean(e))
    # measured: 19.8 -> 34.7 dB (symmetric), 21.7 -> 35.7 dB (asymmetric)
    assert err["auto"] > err["nearest"] + 6.0, err


def test_gptq_needs_calibration_data() -> None:
    g = load_onnx(_model())
    with pytest.raises(OptionError, match="needs calibration data"):
        QuantizeWeights(rounding="gptq").run(g, _ctx())
    with pytest.raises(OptionError, match="block_size must be one of"):
        QuantizeWeights(block_size=16)


# ------------------------------------------------------------------------------- the CLI
def test_cli_weight_only_compile_and_flags(tmp_path: Path) -> None:
    model = text_model(
        "g (float[4,256] x) => (float[4,64] y) { h = Gemm<transB=1>(x, W, C) y = Relu(h) }",
        17,
        8,
        W=rand(64, 256, seed=1),
        C=rand(64, seed=2),
    )
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    out = tmp_path / "out"
    flags = ["--weight-block-size", "64", "--weight-scale-type", "fp32", "--weight-asymmetric"]
    assert main(["compile", str(src), "-o", str(out), "--quantize", "int8w", *flags]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (art,) = manifest["artifacts"]
    assert art["precision"] == "int8w"
    q = manifest["quantization"]
    assert (q["mode"], q["bits"], q["block_size"], q["scale_dtype"], q["symmetric"]) == (
        "int8w",
        8,
        64,
        "fp32",
        False,
    )
    assert [layer["node"] for layer in q["layers"]] == ["h"]
    assert manifest["verification"]["passed"]
    exported = onnx.load(str(out / "model.onnx"))
    (nbits,) = [n for n in exported.graph.node if n.op_type == "MatMulNBits"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nbits.attribute}
    assert attrs == {"K": 256, "N": 64, "bits": 8, "block_size": 64}
    assert len(nbits.input) == 6 and nbits.input[3] and not nbits.input[4]  # zero points and bias
    bad = tmp_path / "bad"
    assert main(["compile", str(src), "-o", str(bad), "--weight-block-size", "64"]) == 2
    assert main(["compile", str(src), "-o", str(bad), "--quantize", "int8", "--weight-asymmetric"]) == 2
    assert main(["compile", str(src), "-o", str(bad), "--quantize", "int4w", "--min-sqnr", "off"]) == 2
    with pytest.raises(SystemExit) as exc:  # argparse's own choices
        main(["compile", str(src), "-o", str(bad), "--quantize", "int4w", "--weight-block-size", "48"])
    assert exc.value.code == 2
    assert not bad.exists()
