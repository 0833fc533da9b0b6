"""NCHW44 / NCHW44_DOT / NCHW88 convolutions: group, channel-wise, dense and hybrid filters.

Each model is written with :class:`tests.helpers.mge_writer.MgeWriter` in the
layouts MegEngine's ``enable_nchw44``/``enable_nchw44_dot``/``enable_nchw88``
dump options produce, then imported by Kiln and run both in Kiln's interpreter
and, exported to ONNX, in onnxruntime. The expected outputs come from the
shared reference tools (``mgeparse`` reads the file, np_run's kernels compute,
see :mod:`tests.helpers.mge_reference`). Float tolerance: rtol 1e-5, atol 1e-5;
int8: one step of the output scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compiler.errors import ConversionError
from compiler.ir import Graph
from compiler.ir.interpreter import run_graph
from frontends.megengine.loader import load_mge
from schemas.megengine.generated import params_generated as P
from tests.conftest import SHARED
from tests.helpers.mge_reference import ReferenceTools, filter_oihw, load_tools, run_reference
from tests.helpers.mge_writer import MgeWriter
from tests.helpers.numerics import assert_close
from tests.helpers.pass_check import op_counts, ort_graph

RTOL, ATOL = 1e-5, 1e-5
F = P.ConvolutionFormat
rng = np.random.default_rng(18)
MGE = SHARED / "reference" / "megengine" / "models"


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> ReferenceTools:
    return load_tools(tmp_path_factory.mktemp("mge_pygen"))


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@dataclass(frozen=True)
class Case:
    """One conv: format, filter kind (dense/group/chanwise/hybrid), channels and geometry."""

    fmt: str
    kind: str
    ic: int
    oc: int
    groups: int = 1
    k: tuple[int, int] = (3, 3)
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (1, 1)
    dil: tuple[int, int] = (1, 1)
    bias: str = "channel"  # channel / full / none
    act: str = "IDENTITY"
    z: bool = False
    op: str = "ConvBiasForward"
    flip: bool = False
    hw: tuple[int, int] = (9, 10)
    n: int = 1

    @property
    def block(self) -> int:
        return 8 if self.fmt == "NCHW88" else 4

    def filter_shape(self) -> tuple[int, ...]:
        b, (fh, fw), g = self.block, self.k, self.groups
        return {
            "dense": (self.oc // b, self.ic // b, fh, fw, b, b),
            "group": (g, self.oc // g // b, self.ic // g // b, fh, fw, b, b),
            "chanwise": (g // b, 1, 1, fh, fw, b),
            "hybrid": (self.oc // b, fh, fw, self.ic, b),
        }[self.kind]

    def out_hw(self) -> tuple[int, int]:
        oh, ow = (
            (n + 2 * p - (k - 1) * d - 1) // s + 1
            for n, p, k, d, s in zip(self.hw, self.pad, self.k, self.dil, self.stride, strict=True)
        )
        return oh, ow


CASES = {
    "nchw44_group2_relu": Case("NCHW44", "group", 16, 16, 2, act="RELU"),
    "nchw44_group4_s2_hswish": Case("NCHW44", "group", 16, 32, 4, stride=(2, 2), act="H_SWISH"),
    "nchw44_group4_rect": Case(
        "NCHW44", "group", 16, 16, 4, k=(3, 1), stride=(2, 1), pad=(1, 0), act="SIGMOID", n=2
    ),
    "nchw44_chanwise_sigmoid": Case("NCHW44", "chanwise", 8, 8, 8, act="SIGMOID"),
    "nchw44_chanwise_k5s2_nobias": Case(
        "NCHW44", "chanwise", 12, 12, 12, k=(5, 5), stride=(2, 2), pad=(2, 2), bias="none"
    ),
    "nchw44_group_full_bias": Case("NCHW44", "group", 8, 8, 2, bias="full", act="RELU"),
    "nchw44_group_z_hswish": Case("NCHW44", "group", 8, 16, 2, z=True, act="H_SWISH"),
    "nchw44_group_dilated": Case("NCHW44", "group", 8, 8, 2, dil=(2, 2), pad=(2, 2), act="RELU"),
    "nchw44_dense": Case("NCHW44", "dense", 8, 12, act="RELU"),
    "nchw44_convolution_flip": Case("NCHW44", "group", 8, 8, 2, op="Convolution", flip=True, bias="none"),
    "nchw44_dot_group2": Case("NCHW44_DOT", "group", 8, 16, 2),
    "nchw44_dot_dense_k1": Case("NCHW44_DOT", "dense", 8, 8, k=(1, 1), pad=(0, 0), act="RELU"),
    "nchw44_dot_hybrid": Case("NCHW44_DOT", "hybrid", 3, 8, stride=(2, 2), act="RELU"),
    "nchw88_group2_relu": Case("NCHW88", "group", 16, 16, 2, pad=(0, 0), act="RELU"),
    "nchw88_group8_s2_hswish": Case("NCHW88", "group", 64, 64, 8, stride=(2, 2), act="H_SWISH"),
    "nchw88_chanwise_s2": Case("NCHW88", "chanwise", 16, 16, 16, stride=(2, 2), act="RELU"),
    "nchw88_hybrid_sigmoid": Case("NCHW88", "hybrid", 3, 16, act="SIGMOID"),
    "nchw88_convolution_group": Case(
        "NCHW88", "group", 16, 32, 2, op="Convolution", bias="none", stride=(1, 2)
    ),
}


def write_case(c: Case) -> tuple[MgeWriter, int, dict[str, np.ndarray]]:
    b, (oh, ow) = c.block, c.out_hw()
    x_shape = (c.n, c.ic, *c.hw) if c.kind == "hybrid" else (c.n, c.ic // b, *c.hw, b)
    feeds = {"data": randn(*x_shape)}
    wr = MgeWriter()
    ins = [wr.input("data", x_shape), wr.const(randn(*c.filter_shape()))]
    if c.bias != "none":
        ins.append(
            wr.const(
                randn(*((1, c.oc // b, 1, 1, b) if c.bias == "channel" else (c.n, c.oc // b, oh, ow, b)))
            )
        )
    if c.z:
        feeds["z"] = randn(c.n, c.oc // b, oh, ow, b)
        ins.append(wr.input("z", feeds["z"].shape))
    fields: dict[str, Any] = {
        "Format": getattr(F, c.fmt),
        "Sparse": P.ConvolutionV0Sparse.DENSE
        if c.kind in ("dense", "hybrid")
        else P.ConvolutionV0Sparse.GROUP,
        "PadH": c.pad[0],
        "PadW": c.pad[1],
        "StrideH": c.stride[0],
        "StrideW": c.stride[1],
        "DilateH": c.dil[0],
        "DilateW": c.dil[1],
    }
    if c.flip:
        fields["Mode"] = P.ConvolutionV0Mode.CONVOLUTION
    if c.op == "ConvBiasForward":
        fields["NonlineMode"] = getattr(P.ConvBiasV0NonlineMode, c.act)
    y = wr.op(
        c.op, ins, wr.param("ConvBias" if c.op == "ConvBiasForward" else "Convolution", **fields), name="conv"
    )
    return wr, y, feeds


def check_both_paths(graph: Graph, feeds: dict[str, np.ndarray], expected: list[np.ndarray]) -> float:
    """Kiln's interpreter and onnxruntime against the reference; returns the max abs error."""
    worst = 0.0
    for path, got in (("interpreter", run_graph(graph, feeds)), ("onnxruntime", ort_graph(graph, feeds))):
        for name, e in zip(graph.output_names, expected, strict=True):
            m = assert_close(got[name], e, rtol=RTOL, atol=ATOL, what=f"{path} {name}")
            worst = max(worst, m.max_abs)
    return worst


@pytest.mark.parametrize("name", list(CASES))
def test_blocked_conv_matches_reference(tmp_path: Path, ref: ReferenceTools, name: str) -> None:
    c = CASES[name]
    wr, y, feeds = write_case(c)
    path = tmp_path / f"{name}.mge"
    path.write_bytes(wr.finish([y]))
    expected = run_reference(ref, path, feeds)
    graph = load_mge(path)
    check_both_paths(graph, feeds, expected)
    (conv,) = [n for n in graph.ops() if n.op in ("FusedConv", "Conv")]
    assert conv.attrs.group == (c.groups if c.kind in ("group", "chanwise") else 1)
    w = graph.inputs_of(conv)[1]
    assert w is not None and w.const is not None  # the filter stays one constant, now OIHW
    assert w.const.shape == (c.oc, c.ic // conv.attrs.group, *c.k)


def conv_filters(ref: ReferenceTools, path: Path) -> list[tuple[np.ndarray, dict[str, Any]]]:
    """(filter value, ConvBias param) of each ConvBiasForward, as the shared mgeparse reads them."""
    model = ref.mgeparse.load(str(path))
    consts = {
        op["outputs"][0]: op["tensors"][0]["value"] for op in model["oprs"] if op["type"] == "ImmutableTensor"
    }
    return [(consts[op["inputs"][1]], op["param"]) for op in model["oprs"] if op["type"] == "ConvBiasForward"]


@pytest.mark.parametrize(
    "stem", ["tiny_convbnrelu_v2_nchw44", "tiny_convbnrelu_v2_nchw88", "tiny_int8_v2_nchw44"]
)
def test_reference_addresses_undo_megengine_relayouts(ref: ReferenceTools, stem: str) -> None:
    """The reference's naive-kernel addresses turn the filters MegEngine itself relayouted (hybrid and
    dense, in its real dumps) back into the NCHW dump's OIHW filters."""
    plain_stem = "tiny_int8_v2" if "int8" in stem else "tiny_convbnrelu_v2_opt"
    plain = conv_filters(ref, MGE / f"{plain_stem}.mge")
    blocked = conv_filters(ref, MGE / f"{stem}.mge")
    assert len(blocked) == len(plain) > 0
    for (w, p), (w0, _) in zip(blocked, plain, strict=True):
        src_ndim = 4 if p["sparse"] == "DENSE" and w.ndim == 5 else 5
        oihw, groups = filter_oihw(w, p["format"], p["sparse"], src_ndim)
        assert groups == 1
        np.testing.assert_array_equal(oihw, w0)


def test_dot_and_plain_nchw44_filters_hold_the_same_weights(tmp_path: Path) -> None:
    """The same OIHW group filter written as NCHW44 ([.., 4ic, 4oc]) and NCHW44_DOT ([.., 4oc, 4ic])."""
    w = randn(2, 2, 1, 3, 3, 4, 4)  # [G, OCg/4, ICg/4, FH, FW, 4, 4]
    graphs = []
    for fmt, flt in (("NCHW44", w), ("NCHW44_DOT", w.swapaxes(5, 6))):
        wr = MgeWriter()
        p = wr.param("ConvBias", Format=getattr(F, fmt), Sparse=P.ConvolutionV0Sparse.GROUP, PadH=1, PadW=1)
        y = wr.op("ConvBiasForward", [wr.input("data", (1, 2, 5, 5, 4)), wr.const(flt)], p)
        (tmp_path / f"{fmt}.mge").write_bytes(wr.finish([y]))
        graphs.append(load_mge(tmp_path / f"{fmt}.mge"))
    consts = []
    for g in graphs:
        (conv,) = [n for n in g.ops() if n.op == "FusedConv"]
        v = g.inputs_of(conv)[1]
        assert v is not None and v.const is not None
        consts.append(v.const)
    np.testing.assert_array_equal(consts[0], consts[1])
    # element (g=1, o=5, i=2, h=0, w=2): block o//4=1, i//4=0, inner (i%4, o%4) = (2, 1)
    assert consts[0][1 * 8 + 5, 2, 0, 2] == w[1, 1, 0, 0, 2, 2, 1]


def test_int8_dot_group_conv(tmp_path: Path, ref: ReferenceTools) -> None:
    """NCHW44_DOT as MegEngine makes it (QuantizedS8 weights, QuantizedS32 bias): within one output step."""
    qs8, qs32 = 13, 12
    sx, sw, so = 0.05, 0.01, 0.04
    x = randn(1, 2, 6, 6, 4) * 2
    wq = rng.integers(-127, 128, (2, 1, 1, 3, 3, 4, 4)).astype(np.int8)
    bq = rng.integers(-500, 500, (1, 2, 1, 1, 4)).astype(np.int32)
    wr = MgeWriter()
    qx = wr.op("TypeCvtV2", [wr.input("data", x.shape)], wr.dtype_param(qs8, sx))
    p = wr.param(
        "ConvBias",
        Format=F.NCHW44_DOT,
        Sparse=P.ConvolutionV0Sparse.GROUP,
        NonlineMode=P.ConvBiasV0NonlineMode.RELU,
        PadH=1,
        PadW=1,
    )
    c = wr.op(
        "ConvBiasForward",
        [qx, wr.const(wq, scale=sw, code=qs8), wr.const(bq, scale=sx * sw, code=qs32)],
        p,
        output_dtype=(qs8, so),
    )
    y = wr.op("TypeCvtV2", [c], wr.dtype_param(0))
    path = tmp_path / "int8_dot.mge"
    path.write_bytes(wr.finish([y]))
    graph = load_mge(path)
    xq = np.clip(np.round(x / np.float32(sx)), -128, 127)
    (conv,) = run_reference(ref, _float_twin(tmp_path, wq, bq), {"data": xq})  # integer accumulators
    expected = np.clip(np.round(conv * (sx * sw) / so), -128, 127) * np.float32(so)
    for got in (run_graph(graph, {"data": x}), ort_graph(graph, {"data": x})):
        assert_close(got[graph.output_names[0]], expected, rtol=0.0, atol=so * 1.001)
    (node,) = [n for n in graph.ops() if n.op == "FusedConv"]
    w = graph.inputs_of(node)[1]
    assert w is not None and w.producer.op == "DequantizeLinear"
    stored = graph.inputs_of(w.producer)[0]
    assert stored is not None and stored.const is not None and stored.const.dtype == np.int8


def _float_twin(tmp_path: Path, wq: np.ndarray, bq: np.ndarray) -> Path:
    """The int8 conv as a float NCHW44_DOT model on integer values (RELU, bias in accumulator units)."""
    wr = MgeWriter()
    p = wr.param(
        "ConvBias",
        Format=F.NCHW44_DOT,
        Sparse=P.ConvolutionV0Sparse.GROUP,
        NonlineMode=P.ConvBiasV0NonlineMode.RELU,
        PadH=1,
        PadW=1,
    )
    ins = [
        wr.input("data", (1, 2, 6, 6, 4)),
        wr.const(wq.astype(np.float32)),
        wr.const(bq.astype(np.float32)),
    ]
    path = tmp_path / "int8_dot_twin.mge"
    path.write_bytes(wr.finish([wr.op("ConvBiasForward", ins, p)]))
    return path


def test_dump_like_chain(tmp_path: Path, ref: ReferenceTools) -> None:
    """What enable_nchw44 makes of conv(3->6)-dwconv-groupconv-add-mul-avgpool: output channels padded
    to 8 (zero weights and bias), NCHW44 ops, then Dimshuffle/Reshape back to NCHW and a Subtensor
    dropping the padding."""
    x = randn(1, 3, 12, 12)
    w1 = np.concatenate([randn(6, 3, 3, 3), np.zeros((2, 3, 3, 3), np.float32)])  # OIHW, padded
    hybrid = w1.reshape(2, 4, 3, 3, 3).transpose(0, 3, 4, 2, 1)  # [OC/4, FH, FW, IC, 4]
    b1 = np.concatenate([randn(6), np.zeros(2, np.float32)]).reshape(1, 2, 4, 1, 1).transpose(0, 1, 3, 4, 2)
    wr = MgeWriter()
    i32 = lambda v: wr.const(np.array(v, np.int32))  # noqa: E731

    def conv(src: int, flt: np.ndarray, bias: np.ndarray, sparse: int, act: str, pad: int) -> int:
        p = wr.param(
            "ConvBias",
            Format=F.NCHW44,
            Sparse=sparse,
            NonlineMode=getattr(P.ConvBiasV0NonlineMode, act),
            PadH=pad,
            PadW=pad,
        )
        return wr.op("ConvBiasForward", [src, wr.const(flt), wr.const(bias)], p)

    dense, group = P.ConvolutionV0Sparse.DENSE, P.ConvolutionV0Sparse.GROUP
    c1 = conv(wr.input("data", x.shape), hybrid, b1, dense, "RELU", 1)
    c2 = conv(c1, randn(2, 1, 1, 3, 3, 4), randn(1, 2, 1, 1, 4), group, "H_SWISH", 1)
    c3 = conv(c2, randn(2, 1, 1, 1, 1, 4, 4), randn(1, 2, 1, 1, 4), group, "IDENTITY", 0)
    s = wr.op("Elemwise", [c3, c2], wr.param("Elemwise", Mode=P.ElemwiseMode.FUSE_ADD_RELU))
    m = wr.op("Elemwise", [s, wr.const(randn(1, 2, 1, 1, 4))], wr.param("Elemwise", Mode=P.ElemwiseMode.MUL))
    pool = wr.op(
        "PoolingV1",
        [m],
        wr.param(
            "Pooling",
            Mode=P.PoolingV0Mode.AVERAGE,
            Format=F.NCHW44,
            WindowH=2,
            WindowW=2,
            StrideH=2,
            StrideW=2,
        ),
    )
    d = wr.op("Dimshuffle", [pool], wr.param("Dimshuffle", Pattern=[0, 1, 4, 2, 3], Ndim=5))
    r = wr.op("ReshapeV1", [d, i32([1, 8, 6, 6])], wr.param("OptionalAxisV1", Axis=7))
    out = wr.op(
        "Subtensor",
        [r, i32([6])],
        wr.struct_param(
            "IndexDescMaskDump", "Items", "CreateIndexDescMaskItem", [(1, False, True, False, False)]
        ),
    )
    path = tmp_path / "chain.mge"
    path.write_bytes(wr.finish([out]))
    expected = run_reference(ref, path, {"data": x})
    assert expected[0].shape == (1, 6, 6, 6)
    graph = load_mge(path)
    check_both_paths(graph, {"data": x}, expected)
    convs = [n for n in graph.ops() if n.op == "FusedConv"]
    assert [n.attrs.group for n in convs] == [1, 8, 2]
    assert op_counts(graph)["AveragePool"] == 1


@pytest.mark.parametrize("fmt", ["NCHW44", "NCHW88"])
def test_blocked_resize_is_nchw_resize_per_channel(tmp_path: Path, fmt: str) -> None:
    b = 4 if fmt == "NCHW44" else 8
    x = randn(1, 2 * b, 5, 6)
    blocked = x.reshape(1, 2, b, 5, 6).transpose(0, 1, 3, 4, 2)
    outs = []
    for f, feed in (("NCHW", x), (fmt, blocked)):
        wr = MgeWriter()
        p = wr.param("Resize", Imode=P.WarpPerspectiveV1InterpolationMode.LINEAR, Format=getattr(F, f))
        y = wr.op("ResizeV2", [wr.input("data", feed.shape), wr.const(np.array([7, 9], np.int32))], p)
        (tmp_path / f"{f}.mge").write_bytes(wr.finish([y]))
        graph = load_mge(tmp_path / f"{f}.mge")
        outs.append(ort_graph(graph, {"data": feed})[graph.output_names[0]])
    plain, got = outs
    np.testing.assert_array_equal(got, plain.reshape(1, 2, b, 7, 9).transpose(0, 1, 3, 4, 2))


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "sparse", "needle"),
    [
        # a group filter on an NCHW input (MegEngine's hybrid form is dense only)
        (
            (1, 8, 5, 5),
            (2, 1, 1, 3, 3, 4, 4),
            "GROUP",
            r"\[2, 1, 1, 3, 3, 4, 4\] does not fit a group \(NCHW input\)",
        ),
        # the 8x8 packing megdnn's int8 winograd preprocessing makes inside NCHW44
        (
            (1, 4, 5, 5, 4),
            (2, 2, 3, 3, 8, 8),
            "DENSE",
            r"\[2, 2, 3, 3, 8, 8\] does not fit a dense NCHW44 conv",
        ),
        # a channel-wise filter whose block is not the format's
        ((1, 2, 5, 5, 4), (1, 1, 1, 3, 3, 8), "GROUP", r"does not fit a group NCHW44 conv"),
    ],
)
def test_blocked_filters_that_fit_no_layout_are_refused(
    tmp_path: Path, x_shape: tuple[int, ...], w_shape: tuple[int, ...], sparse: str, needle: str
) -> None:
    wr = MgeWriter()
    p = wr.param("ConvBias", Format=F.NCHW44, Sparse=getattr(P.ConvolutionV0Sparse, sparse))
    y = wr.op("ConvBiasForward", [wr.input("data", x_shape), wr.const(randn(*w_shape))], p, name="dw")
    (tmp_path / "m.mge").write_bytes(wr.finish([y]))
    with pytest.raises(ConversionError, match=rf"'dw'.*{needle}"):
        load_mge(tmp_path / "m.mge")
