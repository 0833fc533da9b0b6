"""MegEngine operators the shared fixtures do not hold, on small written models.

Each model is written with :class:`tests.helpers.mge_writer.MgeWriter`, imported,
exported to ONNX and run in onnxruntime; the reference is numpy code written here
from MegEngine's documented semantics (never Kiln's interpreter). Float tolerance:
rtol 1e-5, atol 1e-5 (float32 kernels against float64 references).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compiler.errors import UnsupportedOpsError
from compiler.ir import Graph
from frontends.megengine.loader import load_mge
from schemas.megengine.generated import params_generated as P
from tests.helpers.mge_writer import MgeWriter
from tests.helpers.numerics import assert_close
from tests.helpers.pass_check import ort_graph

RTOL, ATOL = 1e-5, 1e-5
E = P.ElemwiseMode
rng = np.random.default_rng(7)


def build(tmp_path: Path, w: MgeWriter, outputs: list[int], **kw: Any) -> Graph:
    path = tmp_path / "m.mge"
    path.write_bytes(w.finish(outputs))
    return load_mge(path, **kw)


def run(tmp_path: Path, w: MgeWriter, outputs: list[int], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    graph = build(tmp_path, w, outputs)
    got = ort_graph(graph, feeds)
    return [got[name] for name in graph.output_names]


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def conv_ref(
    x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 0, dil: int = 1, groups: int = 1
) -> np.ndarray:
    """Grouped, dilated cross-correlation in float64 (w is OIHW)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ekh, ekw = (kh - 1) * dil + 1, (kw - 1) * dil + 1
    oh, ow = (h + 2 * pad - ekh) // stride + 1, (wd + 2 * pad - ekw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        wg = w[g * og : (g + 1) * og].astype(np.float64)
        for i in range(oh):
            for j in range(ow):
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    i * stride : i * stride + ekh : dil,
                    j * stride : j * stride + ekw : dil,
                ]
                out[:, g * og : (g + 1) * og, i, j] = np.tensordot(patch, wg, axes=([1, 2, 3], [1, 2, 3]))
    return out


ACT = {
    "IDENTITY": lambda v: v,
    "RELU": lambda v: np.maximum(v, 0),
    "SIGMOID": lambda v: 1 / (1 + np.exp(-v)),
    "H_SWISH": lambda v: v * np.clip(v + 3, 0, 6) / 6,
}


@pytest.mark.parametrize("mode", list(ACT))
@pytest.mark.parametrize("variant", ["dense", "group", "convolution_mode", "residual"])
def test_conv_bias_every_nonline_mode(tmp_path: Path, mode: str, variant: str) -> None:
    x = randn(1, 4, 9, 9)
    groups = 2 if variant == "group" else 1
    w_oihw = randn(6, 4 // groups, 3, 3)
    b = randn(1, 6, 1, 1)
    stride, pad, dil = (2, 2, 2) if variant == "group" else (1, 1, 1)
    stored = w_oihw.reshape(2, 3, 2, 3, 3) if variant == "group" else w_oihw
    fields: dict[str, Any] = {"NonlineMode": getattr(P.ConvBiasV0NonlineMode, mode), "PadH": pad, "PadW": pad}
    fields.update(StrideH=stride, StrideW=stride, DilateH=dil, DilateW=dil)
    if variant == "group":
        fields["Sparse"] = P.ConvolutionV0Sparse.GROUP
    if variant == "convolution_mode":
        fields["Mode"] = P.ConvolutionV0Mode.CONVOLUTION
    wr = MgeWriter()
    ins = [wr.input("data", x.shape), wr.const(stored), wr.const(b)]
    feeds = {"data": x}
    ref = conv_ref(
        x, w_oihw[:, :, ::-1, ::-1] if variant == "convolution_mode" else w_oihw, stride, pad, dil, groups
    )
    ref = ref + b
    if variant == "residual":
        z = randn(*ref.shape)
        ins.append(wr.input("z", z.shape))
        feeds["z"] = z
        ref = ref + z
    y = wr.op("ConvBiasForward", ins, wr.param("ConvBias", **fields))
    (got,) = run(tmp_path, wr, [y], feeds)
    assert_close(got, ACT[mode](ref), rtol=RTOL, atol=ATOL)


def test_conv_bias_full_bias_is_added_unfused(tmp_path: Path) -> None:
    x, w, b = randn(1, 2, 5, 5), randn(3, 2, 3, 3), randn(1, 3, 3, 3)
    wr = MgeWriter()
    y = wr.op(
        "ConvBiasForward",
        [wr.input("data", x.shape), wr.const(w), wr.const(b)],
        wr.param("ConvBias", NonlineMode=P.ConvBiasV0NonlineMode.RELU),
    )
    (got,) = run(tmp_path, wr, [y], {"data": x})
    assert_close(got, np.maximum(conv_ref(x, w) + b, 0), rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- Elemwise
def _erf(v: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(v)


def _round_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


Ref = Callable[..., np.ndarray]
# mode: (numpy reference, input kind) with kinds: n normal, p positive, h halves, i int32, b bool
MODES: dict[str, tuple[Ref, str]] = {
    "RELU": (lambda a: np.maximum(a, 0), "n"),
    "ABS": (np.abs, "n"),
    "CEIL": (np.ceil, "n"),
    "FLOOR": (np.floor, "n"),
    "EXP": (np.exp, "n"),
    "EXPM1": (np.expm1, "n"),
    "LOG": (np.log, "p"),
    "LOG1P": (np.log1p, "p"),
    "NEGATE": (np.negative, "n"),
    "SIGMOID": (lambda a: 1 / (1 + np.exp(-a)), "n"),
    "TANH": (np.tanh, "n"),
    "FAST_TANH": (lambda a: a * (27 + a * a) / (27 + 9 * a * a), "n"),
    "ROUND": (_round_away, "h"),
    "ERF": (_erf, "n"),
    "ERFC": (lambda a: 1 - _erf(a), "n"),
    "H_SWISH": (lambda a: a * np.clip(a + 3, 0, 6) / 6, "n"),
    "SILU": (lambda a: a / (1 + np.exp(-a)), "n"),
    "GELU": (lambda a: a * 0.5 * (1 + _erf(a / math.sqrt(2))), "n"),
    "RELU6": (lambda a: np.clip(a, 0, 6), "n"),
    "HSIGMOID": (lambda a: np.clip(a + 3, 0, 6) / 6, "n"),
    "SOFTPLUS": (lambda a: np.log1p(np.exp(a)), "n"),
    "LOGSIGMOID": (lambda a: -np.log1p(np.exp(-a)), "n"),
    "SQRT": (np.sqrt, "p"),
    "SQUARE": (np.square, "n"),
    "SIGN": (np.sign, "h"),
    "NOT": (np.logical_not, "b"),
    "ADD": (np.add, "nn"),
    "SUB": (np.subtract, "nn"),
    "MUL": (np.multiply, "nn"),
    "TRUE_DIV": (np.divide, "np"),
    "FLOOR_DIV": (np.floor_divide, "ii"),
    "MOD": (np.fmod, "ii"),
    "MAX_": (np.maximum, "nn"),
    "MIN_": (np.minimum, "nn"),
    "POW": (np.power, "pn"),
    "PRELU": (lambda a, s: np.where(a >= 0, a, a * s), "nn"),
    "LOG_SUM_EXP": (np.logaddexp, "nn"),
    "LT": (np.less, "hh"),
    "LEQ": (np.less_equal, "hh"),
    "EQ": (np.equal, "hh"),
    "NEQ": (np.not_equal, "hh"),
    "AND": (np.logical_and, "bb"),
    "OR": (np.logical_or, "bb"),
    "XOR": (np.logical_xor, "bb"),
    "SWITCH_GT0": (lambda a, b: np.where(a > 0, b, 0), "nn"),
    "FUSE_ADD_RELU": (lambda a, b: np.maximum(a + b, 0), "nn"),
    "FUSE_ADD_SIGMOID": (lambda a, b: 1 / (1 + np.exp(-(a + b))), "nn"),
    "FUSE_ADD_TANH": (lambda a, b: np.tanh(a + b), "nn"),
    "FUSE_ADD_H_SWISH": (lambda a, b: (a + b) * np.clip(a + b + 3, 0, 6) / 6, "nn"),
    "CLIP": (lambda a, lo, hi: np.minimum(np.maximum(a, lo), hi), "nnn"),
    "FUSE_MUL_ADD3": (lambda a, b, c: a * b + c, "nnn"),
    "FUSE_MUL_ADD4": (lambda a, b, c, d: a * b + c * d, "nnnn"),
    "COND_LEQ_MOV": (lambda a, b, c: np.where(a <= b, c, 0), "hhn"),
    "COND_LT_MOV": (lambda a, b, c: np.where(a < b, c, 0), "hhn"),
}


def make_input(kind: str, shape: tuple[int, ...]) -> np.ndarray:
    if kind == "p":
        return (np.abs(randn(*shape)) + 0.1).astype(np.float32)
    if kind == "h":
        return (rng.integers(-6, 7, shape) / 2).astype(np.float32)
    if kind == "i":
        v = rng.integers(-20, 21, shape).astype(np.int32)
        return np.where(v == 0, 7, v).astype(np.int32)
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return randn(*shape)


@pytest.mark.parametrize("mode", list(MODES))
def test_elemwise_mode(tmp_path: Path, mode: str) -> None:
    ref, kinds = MODES[mode]
    shapes = [(2, 3, 4), (1, 3, 1), (2, 1, 4), (2, 3, 4)]  # numpy broadcasting between inputs
    xs = [make_input(k, shapes[i]) for i, k in enumerate(kinds)]
    wr = MgeWriter()
    dtypes = {np.dtype(np.float32): "float32", np.dtype(np.int32): "int32", np.dtype(bool): "bool"}
    ins = [wr.input(f"x{i}", x.shape, dtypes[x.dtype]) for i, x in enumerate(xs)]
    y = wr.op("Elemwise", ins, wr.param("Elemwise", Mode=getattr(E, mode)))
    (got,) = run(tmp_path, wr, [y], {f"x{i}": x for i, x in enumerate(xs)})
    expected = np.asarray(ref(*[x.astype(np.float64) if x.dtype == np.float32 else x for x in xs]))
    if expected.dtype == bool or expected.dtype.kind in "iu":
        np.testing.assert_array_equal(got, expected)
    else:
        assert_close(got, expected, rtol=RTOL, atol=ATOL, what=mode)


def test_unsupported_ops_are_all_listed(tmp_path: Path) -> None:
    wr = MgeWriter()
    x = wr.input("data", (1, 4))
    a = wr.op("Elemwise", [x], wr.param("Elemwise", Mode=E.SIN), name="sin1")
    b = wr.op("Elemwise", [a], wr.param("Elemwise", Mode=E.SIN), name="sin2")
    c = wr.op("Rotate", [b], name="rot")
    d = wr.op("FooBarOpr", [c], name="foo")
    with pytest.raises(UnsupportedOpsError) as info:
        build(tmp_path, wr, [d])
    msg = str(info.value)
    for needle in ("Elemwise SIN (nodes 'sin1', 'sin2')", "Rotate (nodes 'rot')", "FooBarOpr (nodes 'foo')"):
        assert needle in msg, msg
    assert info.value.ops.keys() == {"Elemwise SIN", "Rotate", "FooBarOpr"}
