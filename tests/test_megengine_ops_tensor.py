"""MegEngine pooling, linear algebra, reductions, shape/indexing ops, resize and quantized ops.

Written models (tests/helpers/mge_writer.py) against numpy references written
from MegEngine's semantics; see tests/test_megengine_ops.py for conv and Elemwise.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from frontends.megengine.loader import load_mge
from schemas.megengine.generated import params_generated as P
from tests.conftest import SHARED
from tests.helpers.mge_writer import MgeWriter
from tests.helpers.numerics import assert_close
from tests.helpers.pass_check import ort_graph
from tests.test_megengine_ops import ATOL, RTOL, randn, run

MGE = SHARED / "reference" / "megengine" / "models"


def windows(x: np.ndarray, k: int, s: int, pad: int, fill: float) -> np.ndarray:
    """[..., OH, OW, k*k] sliding windows of an NCHW tensor padded with ``fill``."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    oh, ow = (xp.shape[2] - k) // s + 1, (xp.shape[3] - k) // s + 1
    return np.stack(
        [xp[:, :, i : i + s * oh : s, j : j + s * ow : s] for i in range(k) for j in range(k)], -1
    )


@pytest.mark.parametrize("mode", ["MAX_", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"])
def test_pooling_modes(tmp_path: Path, mode: str) -> None:
    x = randn(1, 2, 7, 7)
    wr = MgeWriter()
    p = wr.param("Pooling", Mode=getattr(P.PoolingV0Mode, mode), PadH=1, PadW=1, WindowH=3, WindowW=3)
    y = wr.op("PoolingV1", [wr.input("data", x.shape)], p)
    (got,) = run(tmp_path, wr, [y], {"data": x})
    if mode == "MAX_":
        ref = windows(x, 3, 2, 1, -np.inf).max(-1)
    elif mode == "AVERAGE":
        ref = windows(x, 3, 2, 1, 0.0).sum(-1) / 9
    else:
        ref = windows(x, 3, 2, 1, 0.0).sum(-1) / windows(np.ones_like(x), 3, 2, 1, 0.0).sum(-1)
    assert_close(got, ref, rtol=RTOL, atol=ATOL)


def test_matrix_mul_transposes(tmp_path: Path) -> None:
    a, b = randn(5, 3), randn(4, 5)
    a3, b3 = randn(2, 3, 5), randn(2, 4, 5)
    wr = MgeWriter()
    y = wr.op(
        "MatrixMulV2",
        [wr.input("a", a.shape), wr.const(b)],
        wr.param("MatrixMul", TransposeA=True, TransposeB=True),
    )
    z = wr.op(
        "BatchedMatrixMulV2",
        [wr.input("a3", a3.shape), wr.input("b3", b3.shape)],
        wr.param("MatrixMul", TransposeB=True),
    )
    got = run(tmp_path, wr, [y, z], {"a": a, "a3": a3, "b3": b3})
    assert_close(got[0], a.T.astype(np.float64) @ b.T, rtol=RTOL, atol=ATOL)
    assert_close(got[1], a3.astype(np.float64) @ b3.transpose(0, 2, 1), rtol=RTOL, atol=ATOL)


REDUCE: dict[str, Callable[..., np.ndarray]] = {
    "SUM": np.sum,
    "SUM_SQR": lambda v, axis, keepdims: np.sum(v * v, axis=axis, keepdims=keepdims),
    "PRODUCT": np.prod,
    "MIN_": np.min,
    "MAX_": np.max,
    "MEAN": np.mean,
}


@pytest.mark.parametrize("mode", list(REDUCE))
def test_reduce_modes(tmp_path: Path, mode: str) -> None:
    x = randn(2, 3, 4)
    wr = MgeWriter()
    xin = wr.input("data", x.shape)
    y = wr.op("ReduceV2", [xin], wr.param("Reduce", Mode=getattr(P.ReduceMode, mode), Axis=1))
    z = wr.op(
        "ReduceV2",
        [xin, wr.const(np.array([2, 1, 1], np.int32))],
        wr.param("Reduce", Mode=getattr(P.ReduceMode, mode)),
    )
    got = run(tmp_path, wr, [y, z], {"data": x})
    x64 = x.astype(np.float64)
    assert_close(got[0], REDUCE[mode](x64, axis=1, keepdims=True), rtol=RTOL, atol=ATOL)
    assert_close(got[1], REDUCE[mode](x64, axis=(1, 2), keepdims=True), rtol=RTOL, atol=ATOL)


def test_shape_ops(tmp_path: Path) -> None:
    x = randn(2, 1, 3)
    wr = MgeWriter()
    xin = wr.input("data", x.shape)
    d = wr.op("Dimshuffle", [xin], wr.param("Dimshuffle", Pattern=[2, -1, 0], Ndim=3))
    a = wr.op(
        "AxisAddRemove", [xin], wr.struct_param("AxisAddRemove", "Desc", "CreateAxisDesc", [(0, 0), (1, 2)])
    )
    b = wr.op(
        "Broadcast",
        [
            wr.op("Dimshuffle", [xin], wr.param("Dimshuffle", Pattern=[1, 2, 0], Ndim=3)),
            wr.const(np.array([4, 3, 2], np.int32)),
        ],
        wr.param("Empty"),
    )
    c = wr.op("Concat", [xin, xin], wr.param("Axis", Axis=-1))
    shape = wr.op("GetVarShapeV1", [c], wr.param("OptionalAxisV1", Axis=2))
    r = wr.op(
        "ReshapeV1",
        [c, wr.op("Concat", [shape, wr.const(np.array([9, 2], np.int32))], wr.param("Axis"))],
        wr.param("OptionalAxisV1", Axis=1),
    )
    got = run(tmp_path, wr, [d, a, b, c, r], {"data": x})
    np.testing.assert_array_equal(got[0], x.reshape(2, 3).T[:, None, :])
    np.testing.assert_array_equal(got[1], x.reshape(1, 2, 3))
    np.testing.assert_array_equal(got[2], np.broadcast_to(x.transpose(1, 2, 0), (4, 3, 2)))
    np.testing.assert_array_equal(got[3], np.concatenate([x, x], -1))
    np.testing.assert_array_equal(got[4], np.concatenate([x, x], -1).reshape(6, 1, 2))


def test_subtensor(tmp_path: Path) -> None:
    x = randn(4, 5, 6)
    item = "CreateIndexDescMaskItem"
    wr = MgeWriter()
    xin = wr.input("data", x.shape)
    i32 = lambda v: wr.const(np.array([v], np.int32))  # noqa: E731
    # x[1:4:2, -1, -2:]
    y = wr.op(
        "Subtensor",
        [xin, i32(1), i32(4), i32(2), i32(-1), i32(-2)],
        wr.struct_param(
            "IndexDescMaskDump",
            "Items",
            item,
            [(0, True, True, True, False), (1, False, False, False, True), (2, True, False, False, False)],
        ),
    )
    # x[:, :, ::-2] and x[3, 0, 5] (a MegEngine scalar is shape [1])
    z = wr.op(
        "Subtensor",
        [xin, i32(-2)],
        wr.struct_param("IndexDescMaskDump", "Items", item, [(2, False, False, True, False)]),
    )
    s = wr.op(
        "Subtensor",
        [xin, i32(3), i32(0), i32(5)],
        wr.struct_param(
            "IndexDescMaskDump", "Items", item, [(a, False, False, False, True) for a in range(3)]
        ),
    )
    got = run(tmp_path, wr, [y, z, s], {"data": x})
    np.testing.assert_array_equal(got[0], x[1:4:2, -1, -2:])
    np.testing.assert_array_equal(got[1], x[:, :, ::-2])
    np.testing.assert_array_equal(got[2], x[3, 0, 5].reshape(1))


@pytest.mark.parametrize("mode", ["CONSTANT", "REPLICATE", "REFLECT"])
def test_padding_softmax_powc(tmp_path: Path, mode: str) -> None:
    x = np.abs(randn(1, 2, 3, 4)) + 0.5
    wr = MgeWriter()
    xin = wr.input("data", x.shape)
    p = wr.op(
        "Padding",
        [xin],
        wr.param(
            "Padding",
            FrontOffsetDim2=1,
            BackOffsetDim3=2,
            PaddingVal=1.5,
            PaddingMode=getattr(P.PaddingPaddingMode, mode),
        ),
    )
    sm = wr.op("Softmax", [xin], wr.param("Softmax", Axis=1))
    pw = wr.op("PowC", [xin], wr.param("PowC", Exp=2.5))
    got = run(tmp_path, wr, [p, sm, pw], {"data": x})
    np_mode = {"CONSTANT": "constant", "REPLICATE": "edge", "REFLECT": "reflect"}[mode]
    kw = {"constant_values": 1.5} if mode == "CONSTANT" else {}
    np.testing.assert_array_equal(got[0], np.pad(x, ((0, 0), (0, 0), (1, 0), (0, 2)), mode=np_mode, **kw))  # type: ignore[call-overload]
    e = np.exp(x.astype(np.float64))
    assert_close(got[1], e / e.sum(1, keepdims=True), rtol=RTOL, atol=ATOL)
    assert_close(got[2], x.astype(np.float64) ** 2.5, rtol=RTOL, atol=ATOL)


def megengine_resize(x: np.ndarray, oh: int, ow: int, linear: bool) -> np.ndarray:
    """MegEngine's NCHW resize: scale = out/in; linear uses half-pixel centres clamped to the border,
    nearest takes min(floor(i / scale), in - 1)."""

    def coords(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scale = np.float32(n_out) / np.float32(n_in)
        i = np.arange(n_out, dtype=np.float32)
        if not linear:
            src = np.minimum(np.floor(i / scale).astype(int), n_in - 1)
            return src, src, np.zeros(n_out)
        a = (i + 0.5) / scale - 0.5
        i0 = np.floor(a).astype(int)
        alpha = a - i0
        alpha = np.where(i0 < 0, 0.0, np.where(i0 + 1 >= n_in, 1.0, alpha))
        i0 = np.where(i0 < 0, 0, np.where(i0 + 1 >= n_in, n_in - 2, i0))
        return i0, i0 + 1, alpha

    h0, h1, ah = coords(x.shape[2], oh)
    w0, w1, aw = coords(x.shape[3], ow)
    x64 = x.astype(np.float64)
    top = x64[:, :, h0][:, :, :, w0] * (1 - aw) + x64[:, :, h0][:, :, :, w1] * aw
    bot = x64[:, :, h1][:, :, :, w0] * (1 - aw) + x64[:, :, h1][:, :, :, w1] * aw
    return top * (1 - ah)[:, None] + bot * ah[:, None]


@pytest.mark.parametrize("imode", ["LINEAR", "NEAREST"])
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_resize(tmp_path: Path, imode: str, fmt: str) -> None:
    x = randn(1, 2, 5, 7)
    feed = x if fmt == "NCHW" else x.transpose(0, 2, 3, 1)
    wr = MgeWriter()
    mode = getattr(P.WarpPerspectiveV1InterpolationMode, imode)
    p = wr.param("Resize", Imode=mode, Format=getattr(P.ConvolutionFormat, fmt))
    sizes = [(8, 4), (3, 11)]  # up/down-sampling with non-integer ratios
    xin = wr.input("data", feed.shape)
    ys = [wr.op("ResizeV2", [xin, wr.const(np.array(size, np.int32))], p) for size in sizes]
    got = run(tmp_path, wr, ys, {"data": feed})
    for g, (oh, ow) in zip(got, sizes, strict=True):
        ref = megengine_resize(x, oh, ow, imode == "LINEAR")
        assert_close(g, ref if fmt == "NCHW" else ref.transpose(0, 2, 3, 1), rtol=RTOL, atol=ATOL)


def test_type_cvt_and_quantized_add(tmp_path: Path) -> None:
    """float -> QuantizedS8 rounds to the grid (saturating), QADD adds and rounds to its output scale."""
    x, y = randn(2, 8) * 4, randn(2, 8)
    qs8 = 13
    wr = MgeWriter()
    qx = wr.op("TypeCvtV2", [wr.input("x", x.shape)], wr.dtype_param(qs8, 0.05))
    qy = wr.op("TypeCvtV2", [wr.input("y", y.shape)], wr.dtype_param(qs8, 0.02))
    s = wr.op(
        "ElemwiseMultiType",
        [qx, qy],
        wr.param("ElemwiseMultiType", Mode=P.ElemwiseMultiTypeMode.QADD),
        output_dtype=(qs8, 0.1),
    )
    outs = [wr.op("TypeCvtV2", [v], wr.dtype_param(0)) for v in (qx, s)]
    got = run(tmp_path, wr, outs, {"x": x, "y": y})

    def q(v: np.ndarray, scale: float) -> np.ndarray:
        return np.clip(np.round(v / np.float32(scale)), -128, 127) * np.float32(scale)

    assert_close(got[0], q(x, 0.05), rtol=0.0, atol=1e-6)
    assert_close(got[1], q(q(x, 0.05) + q(y, 0.02), 0.1), rtol=0.0, atol=1e-6)


def test_batch_norm_with_full_parameters(tmp_path: Path) -> None:
    x, sc, bi, mu, var = (
        randn(1, 2, 3, 3),
        randn(1, 2, 3, 3),
        randn(1, 2, 3, 3),
        randn(1, 2, 3, 3),
        randn(1, 2, 3, 3),
    )
    var = np.abs(var) + 0.5
    wr = MgeWriter()
    p = wr.param("BN", ParamDim=P.BNParamDim.DIM_1CHW, FwdMode=P.BNFwdMode.INFERENCE, Epsilon=1e-3)
    y = wr.op(
        "BatchNormV1", [wr.input("data", x.shape), *(wr.const(a) for a in (sc, bi, mu, var))], p, outputs=4
    )
    (got,) = run(tmp_path, wr, [y], {"data": x})
    ref = (x.astype(np.float64) - mu) / np.sqrt(var.astype(np.float64) + 1e-3) * sc + bi
    assert_close(got, ref, rtol=RTOL, atol=ATOL)


def test_input_shape_override_follows_the_shape_subgraph() -> None:
    """GetVarShape -> Subtensor -> Concat -> Reshape (flatten) folds again for a batch of 2."""
    x = np.load(MGE / "tiny_convbnrelu_v2_nchw44.input.npy")
    graph = load_mge(MGE / "tiny_convbnrelu_v2_nchw44.mge", input_shapes={"data": (2, 3, 8, 8)})
    got = ort_graph(graph, {"data": np.concatenate([x, x])})["logits"]
    expected = np.load(MGE / "tiny_convbnrelu_v2_nchw44.expected.npy")
    assert_close(got, np.concatenate([expected, expected]), rtol=0.0, atol=1e-4)
