"""MNN weight encodings and the serializer, checked on the bytes themselves and in MNN's runtime.

* IDST table coding round-trips for 2..8 bits (and u32 dims past 65535);
* symmetric / asymmetric / block-wise int weights decode by MNN's rule to within half a step;
* fp16 scales are stored as IEEE half and the integers are chosen against the rounded scales;
* a one-conv model written with each encoding (also external, fp16 scales) holds exactly the
  expected fields, and MNN's output equals a numpy conv with the decoded weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.mnn.model import MnnNet, MnnOp, Table, TensorQuant
from backends.mnn.options import MnnOptions
from backends.mnn.runtime import run_mnn
from backends.mnn.serializer import serialize
from backends.mnn.weights import WeightStorage, decoded_weights, quantize_weights
from backends.mnn.writer import write_mnn
from compiler.ir.graph import Graph
from compiler.ir.types import DType, TensorType
from compiler.ops.conv import conv_nd
from schemas.mnn import idst
from schemas.mnn.external import side_file
from schemas.mnn.quantized_weights import dequantize_weights
from schemas.mnn.schema import fb


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_idst_round_trip(bits: int) -> None:
    rng = np.random.default_rng(bits)
    q = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(7, 45))
    buf, wide = idst.encode(q, bits)
    assert buf.dtype == np.int8 and not wide
    header = 1 + 2 * 2 + 1 + (1 << bits)
    assert len(buf) == header + -(-bits * q.size // 8)
    np.testing.assert_array_equal(idst.decode(buf, wide), q)


def test_idst_wide_dims() -> None:
    q = np.zeros((2, 70000), np.int64)
    q[1, -1] = 3
    buf, wide = idst.encode(q, 4)
    assert wide
    np.testing.assert_array_equal(idst.decode(buf, True), q)


def test_idst_8_bit_byte_is_q_plus_128() -> None:
    q = np.array([[-128, -1, 0, 127]])
    buf, _ = idst.encode(q, 8)
    assert list(buf.view(np.uint8)[-4:]) == [0, 127, 128, 255]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("asym", [False, True])
@pytest.mark.parametrize("fp16", [False, True])
def test_quantize_within_half_step(bits: int, asym: bool, fp16: bool) -> None:
    w = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32) * 0.3 + 0.05
    qw = quantize_weights(w, bits, asym, block_elems=None, fp16_scales=fp16)
    half = 1 << (bits - 1)
    lo = -half if asym else -(half - 1)
    assert qw.q.min() >= lo and qw.q.max() <= half - 1
    assert qw.alpha.size == (12 if asym else 6)
    if fp16:
        np.testing.assert_array_equal(qw.alpha, qw.alpha.astype(np.float16).astype(np.float32))
    step = qw.alpha[1::2] if asym else qw.alpha
    err = np.abs(dequantize_weights(qw) - w).max(axis=1)
    assert np.all(err <= step * 0.5 + 1e-3 * step + (np.abs(w).max() * 2e-3 if fp16 else 1e-7))


def test_block_scales() -> None:
    w = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    w[:, :8] *= 100.0  # one block with an outlier range
    per_row = quantize_weights(w, 4, False)
    blocks = quantize_weights(w, 4, False, block_elems=8)
    assert blocks.groups == 16 and blocks.alpha.size == 16
    err_row = np.abs(dequantize_weights(per_row) - w)[:, 8:].max()
    err_blk = np.abs(dequantize_weights(blocks) - w)[:, 8:].max()
    assert err_blk < err_row / 10
    asym = quantize_weights(w, 4, True, block_elems=8)
    assert asym.alpha.size == 32 and asym.groups == 16


def test_serializer_checks_vector_types() -> None:
    bad = Table("Blob", {"dims": np.asarray([2], np.int64)})
    net = MnnNet([MnnOp("Const", "c", [], [0], bad)], ["c"], ["c"])
    with pytest.raises(TypeError, match="Blob.dims"):
        serialize(net)


# ------------------------------------------------------------------ one-conv model
def _conv_graph(w: np.ndarray, b: np.ndarray, shape: tuple[int, ...]) -> Graph:
    g = Graph("one_conv")
    x = g.add_input("x", TensorType(DType.FLOAT32, shape))
    node = g.add_node(
        "Conv",
        [x, g.add_constant(w, "w"), g.add_constant(b, "b")],
        {"pads": (1, 1, 1, 1)},
        name="conv",
        output_names=["y"],
    )
    g.set_outputs([g.value(node)])
    return g


def _conv_table(data: bytes) -> fb.Convolution2D:
    net = fb.Net.GetRootAs(data, 0)
    for i in range(net.OplistsLength()):
        op = net.Oplists(i)
        if op.MainType() == fb.OpParameter.Convolution2D:
            conv = fb.Convolution2D()
            conv.Init(op.Main().Bytes, op.Main().Pos)
            return conv
    raise AssertionError("no convolution in the file")


ENCODINGS = {
    "fp32": MnnOptions(),
    "fp16": MnnOptions(weights="fp16"),
    "int8_sym": MnnOptions(weights="int8", min_cosine=0.0),
    "int4_asym_block": MnnOptions(weights="int4", asymmetric=True, block_size=4, min_cosine=0.0),
    "int8_fp16_scale_external": MnnOptions(weights="int8", scale="fp16", external=True, min_cosine=0.0),
    "int4_asym_fp16_scale_external": MnnOptions(
        weights="int4", asymmetric=True, scale="fp16", external=True, min_cosine=0.0
    ),
    "fp16_external": MnnOptions(weights="fp16", external=True),
    "fp32_external": MnnOptions(external=True),
}


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_one_conv_file_and_runtime(name: str, tmp_path: Path) -> None:
    opts = ENCODINGS[name]
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((6, 8, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    x = rng.standard_normal((1, 8, 9, 7)).astype(np.float32)
    path = tmp_path / "m.mnn"
    written = write_mnn(_conv_graph(w, b, x.shape), path, opts)
    assert written == ([side_file(path)] if opts.external else []) + [path]
    data = path.read_bytes()
    conv = _conv_table(data)
    storage = WeightStorage.of(opts)
    rows = w.reshape(6, -1)
    block = 4 * 9 if opts.block_size else None
    expect = decoded_weights(rows, storage, block)
    quan = conv.QuanParameter()
    side = side_file(path).read_bytes() if opts.external else b""
    ext = conv.ExternalAsNumpy() if opts.external else None
    if opts.weights == "fp32":
        assert quan is None
        if opts.external:
            assert ext is not None and list(ext) == [0, w.nbytes, b.nbytes]
            assert side == rows.tobytes() + b.tobytes()
            assert conv.WeightLength() == 0 and conv.BiasLength() == 0
        else:
            np.testing.assert_array_equal(conv.WeightAsNumpy(), w.reshape(-1))
    else:
        assert quan is not None and quan.QuantScale() == 1.0 and conv.WeightLength() == 0
        fp16_alpha = opts.scale == "fp16"
        assert quan.ScaleStorage() == (fb.ScaleStorageType.FP16 if fp16_alpha else fb.ScaleStorageType.FP32)
        if opts.external:
            assert ext is not None and len(ext) == 5 and ext[0] == 0 and ext[4] == 0
            nbuf, nalpha, nbias = int(ext[1]), int(ext[2]), int(ext[3])
            assert len(side) == nbuf + nalpha + nbias
            buf = np.frombuffer(side[:nbuf], np.int8)
            alpha_raw = side[nbuf : nbuf + nalpha]
            np.testing.assert_array_equal(np.frombuffer(side[nbuf + nalpha :], np.float32), b)
            assert quan.BufferLength() == 0 and quan.AlphaLength() == 0 and quan.AlphaFp16Length() == 0
        else:
            buf = quan.BufferAsNumpy()
            alpha_raw = b""
            if opts.bits is not None:
                alpha_raw = (quan.AlphaFp16AsNumpy() if fp16_alpha else quan.AlphaAsNumpy()).tobytes()
            else:
                assert quan.AlphaLength() == 0
        if opts.weights == "fp16":
            assert quan.Type() == 3
            got = np.frombuffer(buf.tobytes(), np.float16).astype(np.float32).reshape(rows.shape)
        else:
            assert quan.Type() == 1 and quan.AMaxOrBits() == opts.bits
            alpha = (
                np.frombuffer(alpha_raw, np.float16).astype(np.float32)
                if fp16_alpha
                else np.frombuffer(alpha_raw, np.float32)
            )
            q = idst.decode(buf, quan.ShapeInt32()).reshape(-1)
            groups = alpha.size // 2 if quan.ReadType() else alpha.size
            assert (quan.ReadType() != 0) == opts.asymmetric
            g = q.reshape(groups, -1).astype(np.float32)
            if opts.asymmetric:
                assert opts.bits is not None
                assert quan.AMin() == -(1 << (opts.bits - 1)) and quan.ReadType() == groups
                got = (g - quan.AMin()) * alpha[1::2, None] + alpha[0::2, None]
            else:
                got = g * alpha[:, None]
            got = got.reshape(rows.shape)
        np.testing.assert_allclose(got, expect, rtol=0, atol=1e-6)
    out = run_mnn(path, {"x": x})["y"]
    ref = conv_nd(x, expect.reshape(w.shape), b, 1, (1, 1), (1, 1), (1, 1, 1, 1))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_input_dformat_is_written(tmp_path: Path) -> None:
    path = tmp_path / "m.mnn"
    write_mnn(
        _conv_graph(np.ones((2, 2, 3, 3), np.float32), np.zeros(2, np.float32), (1, 2, 4, 4)),
        path,
        MnnOptions(),
    )
    net = fb.Net.GetRootAs(path.read_bytes(), 0)
    op = net.Oplists(0)
    assert op.Type() == fb.OpType.Input
    inp = fb.Input()
    inp.Init(op.Main().Bytes, op.Main().Pos)
    assert inp._tab.Offset(8) != 0, "Input.dformat must be present (its default is NC4HW4)"
    assert inp.Dformat() == fb.MNN_DATA_FORMAT.NCHW and inp.Dtype() == fb.DataType.DT_FLOAT
    assert net.SourceType() == fb.NetSource.ONNX and net.BizCode() == b"kiln"


def test_tensor_quant_info_is_serialized() -> None:
    """``MnnNet.tensor_quant`` (for full int8) becomes ``Net.extraTensorDescribe[].quantInfo``."""
    net = MnnNet(
        [MnnOp("Input", "x", [], [0], Table("Input", {"dims": np.asarray([1, 4], np.int32)}))],
        ["x"],
        ["x"],
        tensor_quant={0: TensorQuant(0.05, 0.0, -127.0, 127.0)},
    )
    root = fb.Net.GetRootAs(serialize(net), 0)
    assert root.ExtraTensorDescribeLength() == 1
    desc = root.ExtraTensorDescribe(0)
    info = desc.QuantInfo()
    assert desc.Index() == 0 and info.Type() == fb.DataType.DT_INT8
    assert (info.Scale(), info.Zero(), info.Min(), info.Max()) == (np.float32(0.05), 0.0, -127.0, 127.0)
