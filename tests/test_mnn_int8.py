"""Full int8 (``--quantize int8``) to MNN: QDQ regions lowered by backends/mnn/lower/quant.py.

What is checked:

* every shared model compiles with ``--quantize int8 --emit onnx,mnn``; the ``.mnn`` loads in
  MNN's runtime and, on the real input, each output's cosine against the fp32 ONNX model is no
  worse than that of Kiln's own QDQ ONNX model minus 0.002;
* with the default uint8 activations every shared model is written in MNN's 3.x integer form
  (per-tensor ``quantInfo`` only, no cast ops) and MNN really runs its int8 convs as int8
  kernels (its per-op callback reports DT_INT8); a Pooling on an asymmetric grid runs in float
  between identity depthwise convs (MNN's int8 Pooling gets zero points wrong);
* ``--activation-type int8`` (symmetric) gives the integer form too;
* on small generated nets the integer form equals the QDQ ONNX model, and the float-pool
  boundary convs appear only where a pool sits on an asymmetric grid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.mnn.runtime import run_mnn
from compiler.cli import main
from compiler.metrics import agreement
from compiler.runners import run_onnxruntime
from schemas.mnn.schema import fb
from tests.conftest import MODEL_STEMS, MODELS
from tests.helpers.cnn_models import CNN_MODELS, INPUT_SHAPE, save_cnn_models

DATA = MODELS / "data"
SHAPES = {"ppocr_mobile_v2_cls": ["--input-shape", "x=1x3x48x192"]}
SLACK = 0.002


def compile_int8(stem: str, out: Path) -> None:
    args = [
        "compile",
        str(MODELS / f"{stem}.onnx"),
        "-o",
        str(out),
        "--quantize",
        "int8",
        "--calib",
        str(DATA / f"{stem}.calib.npz"),
        "--emit",
        "onnx,mnn",
        "--inputs",
        str(DATA / f"{stem}.npz"),
        # the MNN lowering of the all-int8 model is under test: without this, the default 25 dB floor
        # sends most of yunet's and pan's convs back to float (yunet kept 5 int8 convs)
        "--min-sqnr",
        "off",
        *SHAPES.get(stem, []),
    ]
    assert main(args) == 0


@pytest.fixture(scope="module", params=MODEL_STEMS)
def compiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    stem = str(request.param)
    out = tmp_path_factory.mktemp(f"int8_{stem}") / "o"
    compile_int8(stem, out)
    return stem, out


def test_full_int8_cosine_vs_qdq_onnx(compiled: tuple[str, Path]) -> None:
    stem, out = compiled
    feeds = dict(np.load(DATA / f"{stem}.npz"))
    ref = run_onnxruntime(MODELS / f"{stem}.onnx", feeds)
    qdq = run_onnxruntime(out / "model.onnx", feeds)
    got = run_mnn(out / "model.mnn", feeds)
    assert set(got) >= set(ref)
    for name, expected in ref.items():
        c_onnx = agreement(qdq[name], expected).cosine
        c_mnn = agreement(got[name].reshape(expected.shape), expected).cosine
        assert c_mnn >= c_onnx - SLACK, (
            f"{stem}/{name}: MNN cosine {c_mnn:.6f} < QDQ ONNX {c_onnx:.6f} - {SLACK}"
        )


BOUNDARY = ("__dequant", "__requant")
"""Name suffixes of the identity convs around a float Pooling on an asymmetric grid."""


def _int8_conv_count(net: fb.Net) -> int:
    """Convs written as MNN int8 convs (IDST int8 weights with scaleIn/scaleOut, no float weight)."""
    count = 0
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.Type() in (fb.OpType.Convolution, fb.OpType.ConvolutionDepthwise):
            conv = fb.Convolution2D()
            conv.Init(op.Main().Bytes, op.Main().Pos)
            quan = conv.QuanParameter()
            if quan is not None and quan.ScaleIn() > 0.0 and quan.ScaleOut() > 0.0:
                assert conv.WeightLength() == 0 and quan.QuantScale() == 1.0
                count += 1
    return count


def _boundary_convs(net: fb.Net) -> list[str]:
    """Names of the identity depthwise convs around float pools; each is checked to be w = 1, b = 0."""
    names = []
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        name = op.Name().decode()
        if name.endswith(BOUNDARY):
            assert op.Type() == fb.OpType.ConvolutionDepthwise
            conv = fb.Convolution2D()
            conv.Init(op.Main().Bytes, op.Main().Pos)
            assert conv.QuanParameter() is None
            assert np.all(conv.WeightAsNumpy() == 1.0) and np.all(conv.BiasAsNumpy() == 0.0)
            names.append(name)
    return names


def test_full_int8_mnn_structure(compiled: tuple[str, Path]) -> None:
    """Default (uint8) activations: the integer form on every shared model, int8 convs run as int8."""
    stem, out = compiled
    net = fb.Net.GetRootAs((out / "model.mnn").read_bytes(), 0)
    types = [net.Oplists(i).Type() for i in range(net.OplistsLength())]
    assert fb.OpType.FloatToInt8 not in types and fb.OpType.Int8ToFloat not in types
    assert net.ExtraTensorDescribeLength() > 0
    zeros = set()
    for i in range(net.ExtraTensorDescribeLength()):
        q = net.ExtraTensorDescribe(i).QuantInfo()
        assert q is not None and q.Type() == fb.DataType.DT_INT8 and q.Scale() > 0.0
        assert -128 <= q.Zero() <= 127
        zeros.add(q.Zero())
    assert any(z != 0.0 for z in zeros)
    _boundary_convs(net)
    count = _int8_conv_count(net)
    assert count >= 10
    ran = _int8_op_types(out / "model.mnn", dict(np.load(DATA / f"{stem}.npz")))
    assert ran.count("Convolution") + ran.count("ConvolutionDepthwise") == count
    if any(net.Oplists(i).Name().decode().endswith(BOUNDARY) for i in range(net.OplistsLength())):
        assert "Pooling" not in ran  # no int8 Pooling on an asymmetric grid


def _int8_op_types(path: Path, feeds: dict[str, np.ndarray]) -> list[str]:
    """MNN's own per-op callback: the op types it reports as running with DT_INT8."""
    import MNN

    interp = MNN.Interpreter(str(path))
    sess = interp.createSession({"backend": "CPU", "numThread": 1, "precision": "high"})
    for name, t in interp.getSessionInputAll(sess).items():
        a = np.ascontiguousarray(feeds[name], np.float32)
        t.copyFrom(MNN.Tensor(tuple(a.shape), MNN.Halide_Type_Float, a, MNN.Tensor_DimensionType_Caffe))
    seen: list[str] = []

    def before(tensors: object, info: object) -> bool:
        return True

    def after(tensors: object, info: object) -> bool:
        kind = str(info.getType())  # type: ignore[attr-defined]
        if "DT_INT8" in kind:
            seen.append(kind.split("[")[0].strip())
        return True

    interp.runSessionWithCallBackInfo(sess, before, after)
    return seen


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_integer_form(stem: str, tmp_path: Path) -> None:
    """The 3.x integer form (symmetric int8 activations): no casts, quantInfo only, convs with
    scaleIn/scaleOut that MNN really runs as int8 kernels, and the QDQ ONNX model's accuracy.

    yunet_n_320's obj_32 was 0.9812 against a bar of 0.9834 while depthwise convs ran in MNN's
    int8 depthwise kernel (now they keep float weights: 0.9865).

    ppocr_mobile_v2_cls (SE blocks: GlobalAveragePool, MaxPool between int8 tensors) once
    gave cosine 0.02 here because MNN's int8 Pooling ignores differing scales.
    """
    out = tmp_path / "o"
    args = ["compile", str(MODELS / f"{stem}.onnx"), "-o", str(out), "--quantize", "int8"]
    args += ["--activation-type", "int8", "--calib", str(DATA / f"{stem}.calib.npz"), "--emit", "onnx,mnn"]
    # --no-verify: symmetric int8 pan is 0.84 cosine even as QDQ ONNX, below the driver's 0.9 check;
    # this test compares MNN with that QDQ model itself. --min-sqnr off: the same goes for the default
    # 25 dB floor, which would send most of pan's convs back to float; the integer form is under test
    extra = ["--no-verify", "--min-sqnr", "off", *SHAPES.get(stem, [])]
    assert main([*args, "--inputs", str(DATA / f"{stem}.npz"), *extra]) == 0
    net = fb.Net.GetRootAs((out / "model.mnn").read_bytes(), 0)
    types = [net.Oplists(i).Type() for i in range(net.OplistsLength())]
    assert fb.OpType.FloatToInt8 not in types and fb.OpType.Int8ToFloat not in types
    assert net.ExtraTensorDescribeLength() > 0
    int8_convs = _int8_conv_count(net)
    assert int8_convs > 0
    feeds = dict(np.load(DATA / f"{stem}.npz"))
    ran = _int8_op_types(out / "model.mnn", feeds)
    assert ran.count("Convolution") + ran.count("ConvolutionDepthwise") >= int8_convs // 2
    ref = run_onnxruntime(MODELS / f"{stem}.onnx", feeds)
    qdq = run_onnxruntime(out / "model.onnx", feeds)
    got = run_mnn(out / "model.mnn", feeds)
    for name, expected in ref.items():
        c_onnx = agreement(qdq[name], expected).cosine
        assert agreement(got[name].reshape(expected.shape), expected).cosine >= c_onnx - SLACK


def _compile_small(model: Any, tmp_path: Path, *extra: str) -> tuple[Path, dict[str, np.ndarray]]:
    """``--quantize int8 --emit onnx,mnn`` of a 1x8x8x8-input net, calibrated on 8 seeded samples."""
    import onnx

    onnx.save(model, tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((8, 1, 8, 8, 8)).astype(np.float32) + 0.5)
    feeds = {"x": rng.standard_normal((1, 8, 8, 8)).astype(np.float32) + 0.5}
    np.savez(tmp_path / "in.npz", x=feeds["x"])
    out = tmp_path / "o"
    args = ["compile", str(tmp_path / "m.onnx"), "-o", str(out), "--quantize", "int8", *extra]
    args += [
        "--calib",
        str(tmp_path / "calib.npz"),
        "--emit",
        "onnx,mnn",
        "--inputs",
        str(tmp_path / "in.npz"),
    ]
    assert main(args) == 0
    return out, feeds


_CHAIN = """g (float[1,8,8,8] x) => (float[1,8,8,8] y) {
    c = Conv<pads=[1,1,1,1]>(x, w, b)
    f = Conv<pads=[1,1,1,1],group=8>(c, wd, b)
    r = Relu(f)
    h = Conv<pads=[1,1,1,1]>(r, w, b)
    y = Conv<pads=[1,1,1,1]>(h, w, b)
}"""


def test_default_uint8_integer_form_is_exact(tmp_path: Path) -> None:
    """Default (uint8, zero point != 0) activations in MNN's integer form: int8 convs with zero
    points z - 128, a depthwise conv in float between runtime casts; the result equals the QDQ
    ONNX model's (same grids, same integer maths)."""

    from tests.helpers.onnx_text import rand, text_model

    model = text_model(
        _CHAIN,
        w=rand(8, 8, 3, 3, seed=1, scale=0.3),
        wd=rand(8, 1, 3, 3, seed=4, scale=0.5),
        b=rand(8, seed=2),
    )
    out, feeds = _compile_small(model, tmp_path)
    net = fb.Net.GetRootAs((out / "model.mnn").read_bytes(), 0)
    types = [net.Oplists(i).Type() for i in range(net.OplistsLength())]
    assert fb.OpType.FloatToInt8 not in types and fb.OpType.Int8ToFloat not in types
    zeros = {net.ExtraTensorDescribe(i).QuantInfo().Zero() for i in range(net.ExtraTensorDescribeLength())}
    assert any(z != 0.0 for z in zeros)
    ran = _int8_op_types(out / "model.mnn", feeds)
    assert ran.count("Convolution") == _int8_conv_count(net) >= 2
    assert "ConvolutionDepthwise" not in ran
    assert _boundary_convs(net) == []  # no pool: the float-pool boundary must not fire
    qdq = run_onnxruntime(out / "model.onnx", feeds)["y"]
    got = run_mnn(out / "model.mnn", feeds)["y"].reshape(qdq.shape)
    assert np.abs(got - qdq).max() <= 1e-3 * np.abs(qdq).max()


_POOL = """g (float[1,8,8,8] x) => (float[1,8,4,4] y, float[1,8,4,4] z) {
    c = Conv<pads=[1,1,1,1]>(x, w, b)
    d = Conv<pads=[1,1,1,1]>(c, w2, b)
    p = MaxPool<{pool}>(d)
    e = Conv<pads=[1,1,1,1]>(p, w, b)
    g = Conv<pads=[1,1,1,1],strides=[2,2]>(d, w, b)
    y = Conv<pads=[1,1,1,1]>(e, w, b)
    z = Conv<pads=[1,1,1,1]>(g, w, b)
}"""


_PADDED = "kernel_shape=[3,3],strides=[2,2],pads=[1,1,1,1]"


@pytest.mark.parametrize(
    ("activation", "pool"), [("uint8", _PADDED), ("int8", "kernel_shape=[2,2],strides=[2,2]")]
)
def test_float_pool_boundary(activation: str, pool: str, tmp_path: Path) -> None:
    """A MaxPool between int8 tensors whose input a float conv writes (the QDQ model quantises
    only the pool's output). MNN's int8 Pooling is wrong there (asymmetric grid: ~128 LSB off;
    symmetric: fed through a runtime cast, also wrong), so the pool runs in float between
    identity depthwise convs (int8 in, int8 out) while the int8 convs around it stay int8; the
    result equals the QDQ ONNX model's. (Must-not-fire: see the pool-free nets above.)"""

    from tests.helpers.onnx_text import rand, text_model

    model = text_model(
        _POOL.replace("{pool}", pool),
        w=rand(8, 8, 3, 3, seed=1, scale=0.3),
        w2=rand(8, 8, 3, 3, seed=3, scale=0.3),
        b=rand(8, seed=2),
    )
    out, feeds = _compile_small(model, tmp_path, "--activation-type", activation)
    net = fb.Net.GetRootAs((out / "model.mnn").read_bytes(), 0)
    types = [net.Oplists(i).Type() for i in range(net.OplistsLength())]
    assert fb.OpType.FloatToInt8 not in types and fb.OpType.Int8ToFloat not in types
    ran = _int8_op_types(out / "model.mnn", feeds)
    assert ran.count("Convolution") == _int8_conv_count(net) == 3  # c, e, g
    assert sorted(_boundary_convs(net)) == ["p__dequant", "p__requant"] and "Pooling" not in ran
    qdq = run_onnxruntime(out / "model.onnx", feeds)
    got = run_mnn(out / "model.mnn", feeds)
    for name, expected in qdq.items():
        diff = np.abs(got[name].reshape(expected.shape) - expected).max()
        assert diff <= 1e-3 * np.abs(expected).max(), f"{name}: max |MNN - QDQ| {diff}"


@pytest.mark.parametrize("name", sorted(CNN_MODELS))
def test_generated_cnn_full_int8(name: str, tmp_path: Path) -> None:
    """The generated ResNet-18 / MobileNetV2 (tests/helpers/cnn_models.py), default uint8 activations:
    the integer form runs int8 convs in MNN and every output meets the QDQ ONNX model's cosine - 0.002."""
    src = save_cnn_models(tmp_path)[name]
    rng = np.random.default_rng(7)
    np.savez(tmp_path / "calib.npz", input=rng.standard_normal((4, *INPUT_SHAPE)).astype(np.float32))
    feeds = {"input": rng.standard_normal(INPUT_SHAPE).astype(np.float32)}
    np.savez(tmp_path / "in.npz", **feeds)  # type: ignore[arg-type]
    out = tmp_path / "o"
    args = ["compile", str(src), "-o", str(out), "--quantize", "int8", "--calib", str(tmp_path / "calib.npz")]
    assert main([*args, "--emit", "onnx,mnn", "--inputs", str(tmp_path / "in.npz"), "--no-sensitivity"]) == 0
    net = fb.Net.GetRootAs((out / "model.mnn").read_bytes(), 0)
    types = [net.Oplists(i).Type() for i in range(net.OplistsLength())]
    assert fb.OpType.FloatToInt8 not in types and fb.OpType.Int8ToFloat not in types
    assert _int8_op_types(out / "model.mnn", feeds).count("Convolution") >= 10
    ref = run_onnxruntime(src, feeds)
    qdq = run_onnxruntime(out / "model.onnx", feeds)
    got = run_mnn(out / "model.mnn", feeds)
    for n, expected in ref.items():
        c_onnx = agreement(qdq[n], expected).cosine
        assert agreement(got[n].reshape(expected.shape), expected).cosine >= c_onnx - SLACK, n
