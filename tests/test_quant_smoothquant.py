"""smooth-quant (issue 16): SmoothQuant scales folded into producers and MatMul/Gemm weights.

Structure: which activations are smoothed (a LayerNormalization read by q, k and v; the Mul/Add
tail of a decomposed LayerNorm; a MatMul's output columns) and why the others are not (a Relu
producer, an Add of two computed values, a post-norm LayerNorm also read by the residual Add);
with a fixed alpha the folded constants are exactly gamma / s and s W. The value path: attention's
out-projection input is smoothed into V's projection columns and bias through the heads' Reshape /
Transpose, a Split of a fused qkv and the probabilities' MatMul; paths that mix channels (a MatMul
contracting them, a reshape moving them into the token axis) fold nothing. Numerics: the smoothed
float model in onnxruntime matches the original within 1e-5 (max rel); on a net with outlier
channels, int8 with ``--smoothquant auto`` beats int8 without by a wide margin; the alpha search
scores with the range of ``--calib-method`` (entropy clips heavy tails and picks another alpha
than minmax); a second run changes nothing.
"""

from __future__ import annotations

import json
import types
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.calibration.methods import parse_calib_method
from compiler.calibration.observers import make_observer
from compiler.cli import main
from compiler.errors import OptionError
from compiler.ir import Graph
from compiler.ir.types import DType
from compiler.metrics import agreement
from compiler.onnx_export import export_onnx, model_bytes
from compiler.pass_infra import PassContext
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from compiler.quant.calibrate import graph_runner
from compiler.quant.options import QuantOptions
from compiler.quant.params import dequantize, quantize, range_params, weight_params
from compiler.quant.smoothquant import SmoothReport, find_groups, smooth_quant, smoothing_scales
from frontends.onnx.loader import load_onnx
from passes.smooth_quant import SmoothQuant
from tests.helpers.conformance import ort_session
from tests.helpers.onnx_text import rand
from tests.helpers.smooth_models import (
    attention_block,
    channel_mixes,
    channel_moves,
    outlier_net,
    scaled_input,
    smooth_block,
)

FLOAT_REL = 1e-5


def optimized(model: onnx.ModelProto) -> Graph:
    g = load_onnx(model)
    PassManager(pipeline("default")).run(g)
    return g


def samples(shape: tuple[int, ...], count: int = 8) -> np.ndarray:
    return np.stack([rand(*shape, seed=100 + s) for s in range(count)])


@pytest.fixture(scope="module")
def calib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("smooth") / "calib.npz"
    np.savez(path, x=samples((1, 16, 32)))
    return path


def run_pass(g: Graph, calib: Path, mode: str) -> tuple[bool, SmoothReport | None]:
    ctx = PassContext(options=types.SimpleNamespace(quant=QuantOptions(calib=calib, smoothquant=mode)))
    changed = SmoothQuant().run(g, ctx).changed
    return changed, ctx.state.get("smooth-quant")


def ort_outputs(model: onnx.ModelProto | bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(
        ort_session(model if isinstance(model, bytes) else model.SerializeToString()).run(None, feeds)
    )


# --------------------------------------------------------------------------------- structure
def test_foldable_groups_and_the_reasons_for_the_rest() -> None:
    groups, skipped = find_groups(optimized(smooth_block()))
    assert [(gr.x, gr.fold, len(gr.readers)) for gr in groups] == [
        ("n1", "LayerNormalization", 3),  # gamma and beta / s; q, k, v rows * s
        ("ln2", "Mul+Add", 1),  # the decomposed norm's * gamma and + beta
        ("y1", "MatMul", 1),  # fc2's output columns / s, z's rows * s
    ]
    assert skipped == {
        "h": "produced by Add 'a' without one per-channel constant operand",
        "y1": "produced by Relu 'rl', which has no per-channel parameters to fold 1/s into",
        "p": "also read by Add 'y' (input 1), which has no weight rows to absorb s",  # post-norm residual
    }


def test_through_ops_that_keep_the_channel_axis() -> None:
    groups, skipped = find_groups(optimized(channel_moves()))
    assert [(gr.x, gr.fold) for gr in groups] == [("c", "LayerNormalization>Gather")]
    assert skipped == {
        "t": "produced by LayerNormalization 'n2', whose constants are per channel while the scale "
        "varies along axis 1 of 'n2'"  # the transpose moved the tokens into the channel axis
    }


def test_off_changes_nothing(calib: Path) -> None:
    g = optimized(smooth_block())
    assert run_pass(g, calib, "off") == (False, None)


def consts(g: Graph) -> dict[str, list[np.ndarray]]:
    """Each node's constant inputs (by its output name), in port order."""
    return {
        n.output_names[0]: [c for v in g.inputs_of(n) if v is not None and (c := v.const) is not None]
        for n in g.ops()
    }


def test_fixed_alpha_folds_gamma_over_s_and_s_times_w(calib: Path) -> None:
    g = optimized(smooth_block())
    before = consts(g)
    x = np.asarray(np.load(calib)["x"], np.float64)  # n1 = LN(x): max|n1_j| from the same samples
    mu, sd = x.mean(-1, keepdims=True), np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    g1, b1 = before["n1"]
    n1 = (x - mu) / sd * g1 + b1
    wmax = np.max([np.abs(before[k][0]).max(axis=1) for k in ("q", "k", "v")], axis=0)
    s = smoothing_scales(np.abs(n1).reshape(-1, 32).max(0), wmax, 0.5)
    changed, report = run_pass(g, calib, "0.5")
    assert changed and report is not None
    assert [grp["alpha"] for grp in report.groups] == [0.5, 0.5, 0.5]
    after = consts(g)
    np.testing.assert_allclose(after["n1"][0] * s, g1, rtol=1e-5)  # gamma / s
    np.testing.assert_allclose(after["n1"][1] * s, b1, rtol=1e-5)  # beta / s
    for k in ("q", "k", "v"):
        np.testing.assert_allclose(after[k][0] / s[:, None], before[k][0], rtol=1e-5)  # s W
    ops = Counter(n.op for n in optimized(smooth_block()).ops())
    assert Counter(n.op for n in g.ops()) == ops  # no op added


@pytest.mark.parametrize("fused", [False, True], ids=["qkv", "fused-qkv"])
def test_value_path_folds_out_proj_scale_into_v_columns(calib: Path, fused: bool) -> None:
    g = optimized(attention_block(fused=fused))
    groups, skipped = find_groups(g)
    proj = "MatMul+Add>Split" if fused else "MatMul+Add"
    assert [(gr.x, gr.fold, len(gr.readers)) for gr in groups] == [
        ("n", "LayerNormalization", 1 if fused else 3),
        ("ctx", f"{proj}>Reshape>Transpose>MatMul>Transpose>Reshape", 1),  # through the heads
    ]
    assert skipped == {}
    before, ops = consts(g), Counter(n.op for n in g.ops())
    run = graph_runner(g, ["n", "ctx"])
    outs = [run({"x": x}) for x in np.load(calib)["x"]]
    n1, ctx = (np.abs(np.concatenate([o[k].reshape(-1, 32) for o in outs])).max(0) for k in ("n", "ctx"))
    wv, bv = before["m" if fused else "vm"][0], before["mb" if fused else "v"][0]
    readers = [wv] if fused else [before[k][0] for k in ("qm", "km", "vm")]
    s1 = smoothing_scales(n1, np.max([np.abs(w).max(axis=1) for w in readers], axis=0), 0.5)
    s2 = smoothing_scales(ctx, np.abs(before["o"][0]).max(axis=1), 0.5)
    changed, report = run_pass(g, calib, "0.5")
    assert changed and report is not None and [grp["alpha"] for grp in report.groups] == [0.5, 0.5]
    after = consts(g)
    assert Counter(n.op for n in g.ops()) == ops  # no op added
    np.testing.assert_allclose(after["o"][0], before["o"][0] * s2[:, None], rtol=1e-5)  # s W_o
    cols = s2  # V's columns take 1 / s2; a fused projection's q and k columns keep their values
    if fused:
        cols = np.concatenate([np.ones(64), s2])
    else:
        for k in ("qm", "km"):  # q and k: only LN's s1 on their rows
            np.testing.assert_allclose(after[k][0], before[k][0] * s1[:, None], rtol=1e-5)
        np.testing.assert_array_equal(after["q"][0], before["q"][0])
    w_new, b_new = after["m" if fused else "vm"][0], after["mb" if fused else "v"][0]
    np.testing.assert_allclose(w_new, wv * s1[:, None] / cols[None, :], rtol=1e-5)  # diag(s1) W_v / s2
    np.testing.assert_allclose(b_new, bv / cols, rtol=1e-5)  # b_v / s2


def test_paths_that_mix_channels_fold_nothing(calib: Path) -> None:
    g = optimized(channel_mixes())
    groups, skipped = find_groups(g)
    assert groups == []
    assert {k: v for k, v in skipped.items() if k.startswith("y")} == {
        "y1": "produced by Softmax 'gm', which has no per-channel parameters to fold 1/s into",
        "y2": "produced by MatMul 'aa': the scale varies along both its output's rows and columns",
        "y3": "produced by MatMul 'v3', whose constants are per channel while the scale varies "
        "along axis 1 of 'v3'",  # reshape [1,16,32] -> [1,8,64]: channel j or 32 + j by parity
        "y4": "produced by Expand 'e4': the scale varies along axis 2, which the operand broadcasts over",
    }
    before = consts(g)
    assert run_pass(g, calib, "0.5")[0] is False
    after = consts(g)
    assert all(np.array_equal(a, b) for k in before for a, b in zip(after[k], before[k], strict=True))


def _held_out_sqnr(rows: list[np.ndarray], w: np.ndarray, method: str) -> tuple[float, float]:
    """Unsmoothed int8 SQNR of rows W, each fold (sample i mod 4) on the method's range of the rest."""
    sig = err = width = 0.0
    for f in range(4):
        fit = np.concatenate([r for i, r in enumerate(rows) if i % 4 != f])
        test = np.concatenate([r for i, r in enumerate(rows) if i % 4 == f]).astype(np.float32)
        obs = make_observer(parse_calib_method(method))
        for p in range(obs.passes):
            if p:
                obs.next_pass()
            obs.update(fit)
        lo, hi = obs.range(symmetric=False)
        xp, wp = range_params(lo, hi, DType.UINT8, symmetric=False), weight_params(w, 1)
        ref = test.astype(np.float64) @ w
        d = dequantize(quantize(test, xp), xp).astype(np.float64) @ dequantize(quantize(w, wp), wp) - ref
        sig, err, width = sig + np.square(ref).sum(), err + np.square(d).sum(), width + hi - lo
    return 10 * float(np.log10(sig / err)), width


def test_alpha_search_scores_with_the_calibration_method() -> None:
    rng = np.random.default_rng(1)  # Student-t (5 dof): heavy tails, which entropy clips
    feeds = [{"x": rng.standard_t(5.0, size=(1, 32, 64)).astype(np.float32)} for _ in range(8)]
    g0 = optimized(scaled_input())
    rows = [f["x"].reshape(-1, 64) * consts(g0)["h"][0] for f in feeds]
    chosen = {}
    for name in ("minmax", "entropy"):
        off, width = _held_out_sqnr(rows, consts(g0)["y"][0], name)
        method = parse_calib_method(name)
        (grp,) = smooth_quant(optimized(scaled_input()), None, feeds, method=method).groups
        assert grp["sqnr_db"]["off"] == pytest.approx(off, abs=0.01), name  # the method's range, held out
        chosen[name] = grp["alpha"], width
    assert chosen["entropy"][1] < chosen["minmax"][1]  # entropy clips the tails
    assert chosen["minmax"][0] != chosen["entropy"][0], chosen  # 0.05 vs 0.3: the clipped grid moves it


# ---------------------------------------------------------------------------------- numerics
BLOCKS = {
    "block": smooth_block,
    "attention": attention_block,
    "fused-attention": lambda: attention_block(fused=True),
}


@pytest.mark.parametrize("mode", ["auto", "0.5", "1"])
@pytest.mark.parametrize("block", list(BLOCKS))
def test_smoothed_float_model_matches_the_original(calib: Path, mode: str, block: str) -> None:
    model = BLOCKS[block]()
    g = optimized(model)
    changed, report = run_pass(g, calib, mode)
    assert changed and report is not None and any(grp["alpha"] is not None for grp in report.groups)
    feeds = {"x": rand(1, 16, 32, seed=7)}
    (want,) = ort_outputs(model, feeds)
    (got,) = ort_outputs(model_bytes(export_onnx(g)), feeds)
    assert agreement(got, want).max_rel <= FLOAT_REL


def test_second_run_changes_nothing(calib: Path) -> None:
    g = optimized(smooth_block())
    assert run_pass(g, calib, "auto")[0]
    changed, report = run_pass(g, calib, "auto")
    assert not changed and report is not None
    assert all(grp["alpha"] is None for grp in report.groups)


def _compile_sqnr(
    tmp: Path, *extra: str, net: onnx.ModelProto | None = None
) -> tuple[float, dict[str, object]]:
    model, calib, inputs = tmp / "m.onnx", tmp / "calib.npz", tmp / "in.npz"
    if not model.exists():
        net = net or outlier_net()
        onnx.save(net, str(model))
        shape = tuple(d.dim_value for d in net.graph.input[0].type.tensor_type.shape.dim)
        np.savez(calib, x=samples(shape))
        np.savez(inputs, x=rand(*shape, seed=99))
    out = tmp / f"out{len(extra)}"
    args = ["compile", model, "-o", out, "--quantize", "int8", "--calib", calib, "--inputs", inputs]
    assert main([str(a) for a in [*args, "--min-sqnr", "off", *extra]]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (art,) = manifest["verification"]["artifacts"]
    return min(o["sqnr_db"] for o in art["outputs"]), manifest["quantization"]


def test_smoothquant_lifts_int8_sqnr_on_outlier_channels(tmp_path: Path) -> None:
    plain, q0 = _compile_sqnr(tmp_path)
    smoothed, q1 = _compile_sqnr(tmp_path, "--smoothquant", "auto")
    assert "smoothquant" not in q0 and q1["options"]["smoothquant"] == "auto"  # type: ignore[index]
    (grp,) = q1["smoothquant"]["groups"]  # type: ignore[index]
    assert grp["fold"] == "LayerNormalization" and grp["alpha"] is not None
    assert grp["sqnr_db"][f"{grp['alpha']:g}"] > grp["sqnr_db"]["off"] + 6.0  # the search's measurement
    assert smoothed >= plain + 6.0, (plain, smoothed)  # the emitted model on --inputs, vs onnxruntime fp32


def test_value_path_lifts_int8_sqnr_of_attention(tmp_path: Path) -> None:
    plain, _ = _compile_sqnr(tmp_path, net=attention_block())
    smoothed, q = _compile_sqnr(tmp_path, "--smoothquant", "auto")
    groups = {g["x"]: g for g in q["smoothquant"]["groups"]}  # type: ignore[index]
    ctx = groups["ctx"]
    assert ctx["fold"].endswith(">MatMul>Transpose>Reshape") and ctx["alpha"] is not None
    assert ctx["sqnr_db"][f"{ctx['alpha']:g}"] > ctx["sqnr_db"]["off"] + 2.0  # out_proj's, held out
    assert smoothed >= plain + 1.5, (plain, smoothed)  # 31.1 -> 33.3 dB


# ------------------------------------------------------------------------------------ options
def test_options() -> None:
    calib = Path("c.npz")
    assert QuantOptions(calib=calib, smoothquant="0.35").smooth_alpha == 0.35
    assert QuantOptions(calib=calib, smoothquant="auto").smooth_alpha is None
    for mode in ("1.5", "loud", "-0.1"):
        with pytest.raises(OptionError):
            QuantOptions(calib=calib, smoothquant=mode)
    with pytest.raises(OptionError):  # --scales were calibrated on an unsmoothed graph
        QuantOptions(scales=calib, smoothquant="auto")
    with pytest.raises(OptionError):
        QuantOptions(mode="fp16", smoothquant="auto")
    assert QuantOptions().manifest_view()["smoothquant"] == "off"


def test_cli_needs_quantize_int8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(outlier_net(), str(model))
    assert main(["compile", str(model), "-o", str(tmp_path / "o"), "--smoothquant", "auto"]) == 2
    assert "--smoothquant needs --quantize int8" in capsys.readouterr().err
