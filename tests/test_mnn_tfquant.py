"""MNN's TFLite-style quantized ops (TFQuantizeOp.fbs) read into Kiln's QDQ form (issue 5).

Each op is written into a small ``.mnn`` file with Kiln's own serializer
(``tests/helpers/mnn_tfquant.py``), imported with ``load_mnn``, run with Kiln's interpreter
and compared with an independent numpy reference of TFLite's uint8 arithmetic (integer
accumulation, real multipliers in float64, rounding half away from zero, clamping to the
activation range). Kiln's QuantizeLinear rounds halves to even and computes in float32,
so the two may differ by 1 LSB, and only where the value before rounding is (within
float32 error) a .5 tie: ``_check_lsb`` asserts exactly that. Average pooling hits exact ties
((sum + count/2) / count in TFLite vs round-half-even); the other ops hit them rarely.
The imported graphs also export to ONNX and run in onnxruntime with the same outputs.

MNN 3.6.1's runtime (pip ``mnn``) no longer executes these ops (its wheel is built without
MNN_SUPPORT_DEPRECATED_OP): loading works, but the first forward prints
``Don't support type [<op>]`` / ``Create execution error : <OpType>`` and returns no outputs.
QuantizedReshape runs (a plain reshape), and QuantizedConcat runs as a plain byte concat that
ignores the per-input scales. So Kiln offers no writer option for these ops.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from compiler.api import PassManager
from compiler.errors import ModelFileError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.onnx_export import export_onnx
from compiler.pipelines import pipeline
from frontends.mnn.loader import load_mnn
from tests.helpers.mnn_tfquant import QParam, TfqNet

RNG_SEED = 20240605
TIE_TOL = 2e-3  # how close to .5 (in LSB) a pre-rounding value must be for a 1-LSB mismatch


# ----------------------------------------------------------------- numpy reference
def _round_away(v: np.ndarray) -> np.ndarray:
    """TFLite's rounding (std::round): halves away from zero."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _act_range(act: str, q: QParam) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeUint8."""

    def qz(x: float) -> int:
        return q.zero_point + int(_round_away(np.asarray(x / q.scale, np.float64)))

    lo, hi = 0, 255
    if act == "relu":
        lo = max(lo, qz(0.0))
    elif act == "relu6":
        lo, hi = max(lo, qz(0.0)), min(hi, qz(6.0))
    elif act == "relu1":
        lo, hi = max(lo, qz(-1.0)), min(hi, qz(1.0))
    return lo, hi


def _requant(real: np.ndarray, q: QParam, act: str = "none") -> tuple[np.ndarray, np.ndarray]:
    """(uint8 result, pre-rounding value real / s + z) of requantizing a real value."""
    if act == "tanh":
        real = np.tanh(real)
    elif act == "sigmoid":
        real = 1.0 / (1.0 + np.exp(-real))
    pre = real / q.scale + q.zero_point
    lo, hi = _act_range(act, q)
    return np.clip(_round_away(pre), lo, hi).astype(np.uint8), pre


def _same_pads(size: int, k: int, s: int, d: int) -> tuple[int, int]:
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def _windows(
    x: np.ndarray, k: tuple[int, int], s: tuple[int, int], d: tuple[int, int], padding: str, fill: int
) -> tuple[np.ndarray, np.ndarray]:
    """NHWC x -> (patches [n, oh, ow, kh, kw, c], valid mask [oh, ow, kh, kw]), padded with ``fill``."""
    n, h, w, c = x.shape
    if padding == "SAME":
        (pt, pb), (pl, pr) = _same_pads(h, k[0], s[0], d[0]), _same_pads(w, k[1], s[1], d[1])
    else:
        pt = pb = pl = pr = 0
    xp = np.pad(x.astype(np.int64), ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    valid = np.pad(np.ones((h, w), bool), ((pt, pb), (pl, pr)))
    oh = (h + pt + pb - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (w + pl + pr - d[1] * (k[1] - 1) - 1) // s[1] + 1
    iy = np.arange(oh)[:, None] * s[0] + np.arange(k[0])[None, :] * d[0]
    ix = np.arange(ow)[:, None] * s[1] + np.arange(k[1])[None, :] * d[1]
    patches = xp[:, iy[:, None, :, None], ix[None, :, None, :], :]
    return patches, valid[iy[:, None, :, None], ix[None, :, None, :]]


def ref_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    px: QParam,
    pw: QParam,
    py: QParam,
    *,
    stride: tuple[int, int] = (1, 1),
    dilation: tuple[int, int] = (1, 1),
    padding: str = "SAME",
    act: str = "none",
    mult: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """TFLite uint8 conv: acc = sum (x - zx)(w - zw) + b (int), y = zy + round(acc * sx*sw/sy)."""
    kh, kw = w.shape[:2]
    patches, _ = _windows(x, (kh, kw), stride, dilation, padding, px.zero_point)
    xs = patches - px.zero_point
    ws = w.astype(np.int64) - pw.zero_point
    if mult:
        xs = np.repeat(xs, mult, axis=-1)  # output channel o reads input channel o // mult
        acc = np.einsum("nyxhwc,hwc->nyxc", xs, ws)
    else:
        acc = np.einsum("nyxhwi,hwio->nyxo", xs, ws)
    acc = acc + b.astype(np.int64)
    return _requant(acc.astype(np.float64) * (px.scale * pw.scale), py, act)


def ref_pool(
    x: np.ndarray, kind: str, k: tuple[int, int], s: tuple[int, int], padding: str, rng_: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """TFLite uint8 pools: max, or (sum + count / 2) / count over the valid (unpadded) elements."""
    patches, valid = _windows(x, k, s, (1, 1), padding, 0)
    m = valid[None, :, :, :, :, None]
    if kind == "max":
        out = np.where(m, patches, -1).max(axis=(3, 4))
        pre = out.astype(np.float64)
    else:
        total = np.where(m, patches, 0).sum(axis=(3, 4))
        count = m.sum(axis=(3, 4))
        out = (total + count // 2) // count
        pre = total / count
    return np.clip(out, *rng_).astype(np.uint8), pre


# -------------------------------------------------------------------------- helpers
def _check_lsb(got: np.ndarray, ref: np.ndarray, pre: np.ndarray) -> int:
    """|got - ref| <= 1, and only where the pre-rounding value is a .5 tie; returns the mismatches."""
    assert got.shape == ref.shape and got.dtype == ref.dtype == np.uint8
    diff = np.abs(got.astype(np.int64) - ref.astype(np.int64))
    assert diff.max(initial=0) <= 1
    frac = np.abs(pre - np.floor(pre) - 0.5)
    assert np.all(frac[diff == 1] <= TIE_TOL), "a 1-LSB mismatch away from a rounding tie"
    return int((diff == 1).sum())


def _write_and_load(net: TfqNet, tmp_path: Path, name: str = "m") -> Graph:
    return load_mnn(net.write(tmp_path / f"{name}.mnn"))


def _ort(graph: Graph, feeds: dict[str, np.ndarray], optimize: bool) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(export_onnx(graph).SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds), strict=True))


def _check_ort(graph: Graph, feeds: dict[str, np.ndarray], kiln: dict[str, np.ndarray]) -> None:
    """onnxruntime on the exported graph agrees with Kiln's interpreter.

    Unoptimized (the QDQ graph as is): at most 1 LSB on at most 1% of the elements (float32
    summation order at rounding ties). Optimized, ORT fuses DQ -> op -> Q into its own
    integer kernels (QLinearConv, QLinearAdd...) with their own rounding: at most 1 LSB.
    """
    for optimize, share in ((False, 0.01), (True, 1.0)):
        got = _ort(graph, feeds, optimize)
        assert sorted(got) == sorted(kiln)
        for k, v in kiln.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape
            if v.dtype == np.uint8:
                d = np.abs(got[k].astype(np.int64) - v.astype(np.int64))
                assert d.max(initial=0) <= 1 and (d > 0).mean() <= share, (k, optimize)
            else:
                np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-6)


def _u8(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, shape).astype(np.uint8)


def _single(
    tmp_path: Path,
    build: Callable[[TfqNet, list[int]], int],
    feeds: dict[str, np.ndarray],
    expect_ops: set[str],
) -> np.ndarray:
    """Build a one-op net over uint8 inputs ``feeds``, import it, run it (and ORT); returns y."""
    net = TfqNet()
    ins = [net.input(k, v.shape, 4 if v.dtype == np.uint8 else 1) for k, v in feeds.items()]
    net.outputs(build(net, ins))
    g = _write_and_load(net, tmp_path)
    assert expect_ops <= {n.op for n in g.ops()}
    out = run_graph(g, feeds)
    _check_ort(g, feeds, out)
    return out["y"]


# ----------------------------------------------------------------------------- conv
CONV_CASES = {
    "same_relu6": dict(stride=(1, 1), dilation=(1, 1), padding="SAME", act="relu6"),
    "valid_stride2_relu": dict(stride=(2, 2), dilation=(1, 1), padding="VALID", act="relu"),
    "same_stride2_relu1": dict(stride=(2, 1), dilation=(1, 1), padding="SAME", act="relu1"),
    "dilated_none": dict(stride=(1, 1), dilation=(2, 2), padding="SAME", act="none"),
    "tanh": dict(stride=(1, 1), dilation=(1, 1), padding="VALID", act="tanh"),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv(tmp_path: Path, case: str) -> None:
    kw = CONV_CASES[case]
    rng = np.random.default_rng(RNG_SEED)
    x = _u8(rng, (1, 9, 8, 5))
    w = _u8(rng, (3, 3, 5, 6))
    b = rng.integers(-2000, 2000, 6).astype(np.int32)
    px, pw, py = QParam(0.03, 117), QParam(0.004, 131), QParam(0.04, 60)
    y = _single(
        tmp_path,
        lambda n, i: n.conv("y", i[0], w, b, px, pw, py, **kw),  # type: ignore[arg-type]
        {"x": x},
        {"Conv", "DequantizeLinear", "QuantizeLinear"},
    )
    ref, pre = ref_conv(x, w, b, px, pw, py, **kw)  # type: ignore[arg-type]
    _check_lsb(y, ref, pre)
    assert len(np.unique(ref)) > 20  # the test data spans the range (not all clamped)


@pytest.mark.parametrize("mult", [1, 2])
def test_depthwise_conv(tmp_path: Path, mult: int) -> None:
    rng = np.random.default_rng(RNG_SEED + mult)
    x = _u8(rng, (1, 7, 7, 4))
    w = _u8(rng, (3, 3, 4 * mult))
    b = rng.integers(-500, 500, 4 * mult).astype(np.int32)
    px, pw, py = QParam(0.05, 128), QParam(0.01, 125), QParam(0.03, 100)
    y = _single(
        tmp_path,
        lambda n, i: n.conv("y", i[0], w, b, px, pw, py, stride=(2, 2), act="relu", depth_multiplier=mult),
        {"x": x},
        {"Conv"},
    )
    ref, pre = ref_conv(x, w, b, px, pw, py, stride=(2, 2), act="relu", mult=mult)
    assert y.shape == (1, 4, 4, 4 * mult)
    _check_lsb(y, ref, pre)


def test_conv_graph_is_qdq(tmp_path: Path) -> None:
    """Weights stay uint8 behind DequantizeLinear with the filter zero point; bias is int32."""
    rng = np.random.default_rng(RNG_SEED)
    net = TfqNet()
    x = net.input("x", (1, 4, 4, 2))
    w = _u8(rng, (1, 1, 2, 3))
    net.outputs(net.conv("y", x, w, np.zeros(3), QParam(0.1, 1), QParam(0.2, 77), QParam(0.3, 2)))
    g = _write_and_load(net, tmp_path)
    consts = {n.output_names[0]: n.attrs.value for n in g.nodes() if n.op == "Constant"}
    assert consts["y_weight"].dtype == np.uint8 and consts["y_weight"].shape == (3, 2, 1, 1)
    np.testing.assert_array_equal(consts["y_weight"][:, :, 0, 0], w[0, 0].T)
    assert (
        consts["y__dq_weight_zero_point"].dtype == np.uint8 and int(consts["y__dq_weight_zero_point"]) == 77
    )
    assert consts["y_bias"].dtype == np.int32
    assert [v.name for v in g.outputs] == ["y"] and g.outputs[0].type.dtype.numpy == np.uint8


# ------------------------------------------------------------------------ elementwise
@pytest.mark.parametrize("act", ["none", "relu", "relu6", "relu1"])
def test_add(tmp_path: Path, act: str) -> None:
    rng = np.random.default_rng(RNG_SEED)
    a, b = _u8(rng, (1, 6, 5, 4)), _u8(rng, (1, 6, 5, 4))
    pa, pb, py = QParam(0.02, 128), QParam(0.035, 90), QParam(0.03, 110)
    y = _single(tmp_path, lambda n, i: n.add("y", i[0], i[1], pa, pb, py, act), {"a": a, "b": b}, {"Add"})
    real = pa.scale * (a.astype(np.float64) - pa.zero_point) + pb.scale * (
        b.astype(np.float64) - pb.zero_point
    )
    ref, pre = _requant(real, py, act)
    _check_lsb(y, ref, pre)


def test_concat_per_input_params(tmp_path: Path) -> None:
    rng = np.random.default_rng(RNG_SEED)
    feeds = {"a": _u8(rng, (1, 3, 4, 2)), "b": _u8(rng, (1, 3, 4, 3)), "c": _u8(rng, (1, 3, 4, 1))}
    ps = [QParam(0.1, 100), QParam(0.05, 10), QParam(0.2, 128)]
    py = QParam(0.15, 90)
    y = _single(tmp_path, lambda n, i: n.concat("y", i, 3, ps, py, "relu"), feeds, {"Concat"})
    real = np.concatenate(
        [p.scale * (v.astype(np.float64) - p.zero_point) for p, v in zip(ps, feeds.values(), strict=True)], 3
    )
    ref, pre = _requant(real, py, "relu")
    _check_lsb(y, ref, pre)


def test_logistic(tmp_path: Path) -> None:
    x = np.arange(256, dtype=np.uint8).reshape(1, 4, 8, 8)
    pin = QParam(0.05, 128)
    y = _single(tmp_path, lambda n, i: n.logistic("y", i[0], pin), {"x": x}, {"Sigmoid"})
    ref, pre = _requant(pin.scale * (x.astype(np.float64) - pin.zero_point), QParam(1 / 256, 0), "sigmoid")
    _check_lsb(y, ref, pre)
    assert y.min() == 0 and y.max() == 255


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_softmax(tmp_path: Path, beta: float) -> None:
    rng = np.random.default_rng(RNG_SEED)
    x = _u8(rng, (1, 2, 3, 10))
    s = 0.04
    y = _single(tmp_path, lambda n, i: n.softmax("y", i[0], s, beta), {"x": x}, {"Softmax"})
    z = beta * s * x.astype(np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    ref, pre = _requant(e / e.sum(-1, keepdims=True), QParam(1 / 256, 0))
    _check_lsb(y, ref, pre)


# ------------------------------------------------------------------------------ pools
POOL_CASES = {
    "avg_valid": ("avg", (2, 2), (2, 2), "VALID", (0, 255)),
    "avg_same_clamped": ("avg", (3, 3), (2, 2), "SAME", (20, 200)),
    "max_same": ("max", (3, 3), (2, 2), "SAME", (0, 255)),
    "max_valid_clamped": ("max", (2, 3), (1, 2), "VALID", (30, 220)),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool(tmp_path: Path, case: str) -> None:
    kind, k, s, pad, rng_ = POOL_CASES[case]
    rng = np.random.default_rng(RNG_SEED)
    x = _u8(rng, (1, 7, 9, 3))
    want = {"avg": "AveragePool", "max": "MaxPool"}[kind]
    y = _single(tmp_path, lambda n, i: n.pool("y", i[0], kind, k, s, pad, rng_), {"x": x}, {want})
    ref, pre = ref_pool(x, kind, k, s, pad, rng_)
    mismatches = _check_lsb(y, ref, pre)
    if kind == "max":
        assert mismatches == 0
    elif case == "avg_valid":
        # 2x2 windows: sums that are 2 mod 4 are exact .5 ties: TFLite rounds up, QDQ to even.
        ties = (pre - np.floor(pre) == 0.5) & (np.floor(pre) % 2 == 0)
        assert mismatches == int(ties.sum()) > 0


# ---------------------------------------------------------------- reshape / (de)quantize
def test_reshape(tmp_path: Path) -> None:
    x = _u8(np.random.default_rng(RNG_SEED), (1, 2, 3, 4))
    y = _single(tmp_path, lambda n, i: n.reshape("y", i[0], [1, -1]), {"x": x}, {"Reshape"})
    np.testing.assert_array_equal(y, x.reshape(1, 24))


@pytest.mark.parametrize("mode", ["MIN_COMBINED", "MIN_FIRST"])
def test_quantize_v2_then_dequantize(tmp_path: Path, mode: str) -> None:
    """float -> QuantizeV2 [lo, hi] -> uint8 -> Dequantize(s, z) -> float."""
    lo, hi = -1.5, 2.5
    s = (hi - lo) / 255.0
    zp = 0 if mode == "MIN_COMBINED" else int(-np.round(lo / s))
    x = np.linspace(-2.0, 3.0, 2 * 3 * 4 * 5, dtype=np.float32).reshape(1, 3, 4, 10)
    net = TfqNet()
    xi = net.input("x", x.shape, dtype=1)
    q = net.quantize_v2("q", xi, lo, hi, mode)
    net.outputs(q, net.dequantize("y", q, QParam(s, zp)))
    g = _write_and_load(net, tmp_path)
    out = run_graph(g, {"x": x})
    _check_ort(g, {"x": x}, out)
    x64 = x.astype(np.float64)
    if mode == "MIN_COMBINED":
        pre = (x64 - lo) / s
        ref = np.clip(_round_away(pre), 0, 255)
    else:
        pre = x64 / s + zp
        ref = np.clip(_round_away(x64 / s) + zp, 0, 255)
    _check_lsb(out["q"], ref.astype(np.uint8), pre)
    np.testing.assert_allclose(out["y"], s * (out["q"].astype(np.float64) - zp), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- network
def test_network(tmp_path: Path) -> None:
    """conv -> depthwise -> add(skip) -> concat -> pools -> reshape -> softmax, plus a logistic head.

    Every op is checked on Kiln's own inputs to it (<= 1 LSB, at ties only), and the whole
    net against the chained numpy reference (differences stay within a few LSB).
    """
    rng = np.random.default_rng(RNG_SEED)
    x = _u8(rng, (1, 8, 8, 3))
    px, p1, p2, p3, pc = (
        QParam(0.02, 128),
        QParam(0.025, 0),
        QParam(0.03, 5),
        QParam(0.04, 20),
        QParam(0.05, 10),
    )
    w1, b1 = _u8(rng, (3, 3, 3, 4)), rng.integers(-300, 300, 4).astype(np.int32)
    wd, bd = _u8(rng, (3, 3, 4)), rng.integers(-300, 300, 4).astype(np.int32)
    pw1, pwd = QParam(0.01, 128), QParam(0.02, 120)
    net = TfqNet()
    xi = net.input("x", x.shape)
    c1 = net.conv("c1", xi, w1, b1, px, pw1, p1, act="relu6")
    dw = net.conv("dw", c1, wd, bd, p1, pwd, p2, act="relu", depth_multiplier=1)
    ad = net.add("add", c1, dw, p1, p2, p3)
    cat = net.concat("cat", [ad, c1], 3, [p3, p1], pc)
    mp = net.pool("mp", cat, "max", (2, 2), (2, 2))
    ap = net.pool("ap", mp, "avg", (4, 4), (4, 4))
    rs = net.reshape("rs", ap, [1, 8])
    sm = net.softmax("sm", rs, pc.scale)
    lg = net.logistic("lg", mp, pc)
    net.outputs(sm, lg)
    g = _write_and_load(net, tmp_path)
    env = run_graph(g, {"x": x}, keep_all=True)
    out = {"sm": env["sm"], "lg": env["lg"]}
    _check_ort(g, {"x": x}, out)

    def real(v: np.ndarray, q: QParam) -> np.ndarray:
        return q.scale * (v.astype(np.float64) - q.zero_point)

    steps: dict[str, Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]]] = {
        "c1": lambda e: ref_conv(e["x"], w1, b1, px, pw1, p1, act="relu6"),
        "dw": lambda e: ref_conv(e["c1"], wd, bd, p1, pwd, p2, act="relu", mult=1),
        "add": lambda e: _requant(real(e["c1"], p1) + real(e["dw"], p2), p3),
        "cat": lambda e: _requant(np.concatenate([real(e["add"], p3), real(e["c1"], p1)], 3), pc),
        "mp": lambda e: ref_pool(e["cat"], "max", (2, 2), (2, 2), "VALID", (0, 255)),
        "ap": lambda e: ref_pool(e["mp"], "avg", (4, 4), (4, 4), "VALID", (0, 255)),
        "rs": lambda e: (e["ap"].reshape(1, 8), e["ap"].reshape(1, 8).astype(np.float64)),
        "sm": lambda e: _requant(_softmax(pc.scale * e["rs"].astype(np.float64)), QParam(1 / 256, 0)),
        "lg": lambda e: _requant(real(e["mp"], pc), QParam(1 / 256, 0), "sigmoid"),
    }
    chained: dict[str, np.ndarray] = {"x": x}
    for name, step in steps.items():
        ref, pre = step(env)  # this op on Kiln's own inputs
        _check_lsb(env[name], ref, pre)
        chained[name] = step(chained)[0]  # the pure reference chain
    for name in ("c1", "dw", "add", "cat", "sm", "lg"):
        d = np.abs(env[name].astype(np.int64) - chained[name].astype(np.int64))
        assert d.max(initial=0) <= 3, name
    assert len(np.unique(chained["cat"])) > 30
    PassManager(pipeline("default")).run(g)  # Kiln's optimizer keeps the result
    after = run_graph(g, {"x": x})
    for name in ("sm", "lg"):
        assert np.abs(after[name].astype(np.int64) - out[name].astype(np.int64)).max() <= 1


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ------------------------------------------------------------------------------ errors
def test_unsupported_activation_is_a_model_file_error(tmp_path: Path) -> None:
    net = TfqNet()
    a, b = net.input("a", (1, 2, 2, 1)), net.input("b", (1, 2, 2, 1))
    p = QParam(0.1, 0)
    y = net.add("y", a, b, p, p, p)
    net.outputs(y)
    net.net.ops[-1].param.fields["activationType"] = 5  # type: ignore[index, union-attr]  # kTfLiteActSignBit
    with pytest.raises(ModelFileError, match="fused activation 5"):
        _write_and_load(net, tmp_path)


def test_missing_quantized_param_is_a_model_file_error(tmp_path: Path) -> None:
    net = TfqNet()
    x = net.input("x", (1, 2, 2, 1))
    y = net.logistic("y", x, QParam(0.0, 0))
    net.outputs(y)
    with pytest.raises(ModelFileError, match="input quantisation parameter"):
        _write_and_load(net, tmp_path)


# --------------------------------------------------------------------- MNN's runtime
def _mnn_forward(path: Path, feeds: list[np.ndarray]) -> list[np.ndarray]:
    import MNN

    nn, F = MNN.nn, MNN.expr
    m = nn.load_module_from_file(str(path), [], [])
    args = [F.const(f, list(f.shape), F.NHWC, F.uint8) for f in feeds]
    outs = m.forward(args)
    return [np.array(o.read(), copy=True) for o in outs]


UNSUPPORTED_IN_MNN = {
    "TfQuantizedConv2D": lambda n, x, p: n.conv("y", x, np.ones((1, 1, 2, 2)), np.zeros(2), p, p, p),
    "QuantizedDepthwiseConv2D": lambda n, x, p: n.conv(
        "y", x, np.ones((1, 1, 2)), np.zeros(2), p, p, p, depth_multiplier=1
    ),
    "QuantizedAdd": lambda n, x, p: n.add("y", x, x, p, p, p),
    "QuantizedAvgPool": lambda n, x, p: n.pool("y", x, "avg", (2, 2), (2, 2)),
    "QuantizedMaxPool": lambda n, x, p: n.pool("y", x, "max", (2, 2), (2, 2)),
    "QuantizedLogistic": lambda n, x, p: n.logistic("y", x, p),
    "QuantizedSoftmax": lambda n, x, p: n.softmax("y", x, p.scale),
    "Dequantize": lambda n, x, p: n.dequantize("y", x, p),
}


@pytest.mark.parametrize("op", sorted(UNSUPPORTED_IN_MNN))
def test_mnn_runtime_does_not_execute(tmp_path: Path, capfd: pytest.CaptureFixture[str], op: str) -> None:
    """MNN 3.6.1 loads the file, then forward prints an error and returns no outputs."""
    net = TfqNet()
    x = net.input("x", (1, 2, 2, 2))
    net.outputs(UNSUPPORTED_IN_MNN[op](net, x, QParam(0.1, 10)))
    path = net.write(tmp_path / "m.mnn")
    assert _mnn_forward(path, [np.zeros((1, 2, 2, 2), np.uint8)]) == []
    printed = capfd.readouterr()
    text = printed.out + printed.err
    type_value = {"Dequantize": 19}.get(op)
    if type_value is None:
        assert f"Don't support type [{op}]" in text
    else:  # no "Don't support" line for Dequantize, only the execution error
        assert f"Create execution error : {type_value}" in text
    run_graph(load_mnn(path), {"x": np.zeros((1, 2, 2, 2), np.uint8)})  # Kiln reads and runs it


def test_mnn_runtime_concat_ignores_scales(tmp_path: Path) -> None:
    """QuantizedConcat runs in MNN 3.6.1 as a byte concat (the scales are ignored); Kiln requantizes."""
    rng = np.random.default_rng(RNG_SEED)
    a, b = _u8(rng, (1, 2, 2, 2)), _u8(rng, (1, 2, 2, 2))
    ps, py = [QParam(0.1, 100), QParam(0.05, 10)], QParam(0.2, 50)
    net = TfqNet()
    ai, bi = net.input("a", a.shape), net.input("b", b.shape)
    net.outputs(net.concat("y", [ai, bi], 3, ps, py))
    path = net.write(tmp_path / "m.mnn")
    (mnn_y,) = _mnn_forward(path, [a, b])
    np.testing.assert_array_equal(mnn_y, np.concatenate([a, b], 3))
    kiln_y = run_graph(load_mnn(path), {"a": a, "b": b})["y"]
    real = np.concatenate(
        [p.scale * (v.astype(np.float64) - p.zero_point) for p, v in zip(ps, (a, b), strict=True)], 3
    )
    ref, pre = _requant(real, py)
    _check_lsb(kiln_y, ref, pre)
    assert not np.array_equal(kiln_y, mnn_y)


def test_mnn_runtime_reshape_runs(tmp_path: Path) -> None:
    x = _u8(np.random.default_rng(RNG_SEED), (1, 2, 2, 2))
    net = TfqNet()
    net.outputs(net.reshape("y", net.input("x", x.shape), [1, 8]))
    path = net.write(tmp_path / "m.mnn")
    (mnn_y,) = _mnn_forward(path, [x])
    np.testing.assert_array_equal(mnn_y, run_graph(load_mnn(path), {"x": x})["y"])
