"""Quantization parameters are onnxruntime's, bit for bit; int32 bias fitting; calibration passes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnxruntime.quantization.quant_utils import compute_scale_zp, quantize_data

from compiler.calibration.methods import parse_calib_method
from compiler.ir import DType, Graph
from compiler.pass_manager import PassManager
from compiler.pipelines import pipeline
from compiler.quant.calibrate import calibrate
from compiler.quant.params import (
    bias_params,
    fit_weight_to_bias,
    quantize,
    range_params,
    weight_params,
)
from compiler.quant.plan import make_plan
from frontends.onnx.loader import load_onnx
from tests.helpers.onnx_text import rand, text_model

RANGES = [(-1.0, 3.0), (0.0, 6.0), (-0.375, 18.0), (-2.5e-3, 7.1e-4), (0.0, 0.0), (-90.8, 132.4), (1.5, 2.0)]


@pytest.mark.parametrize(("lo", "hi"), RANGES)
def test_activation_params_equal_onnxruntime(lo: float, hi: float) -> None:
    rmin, rmax = np.array(lo, np.float32), np.array(hi, np.float32)
    z, s = compute_scale_zp(rmin, rmax, np.array(0, np.uint8), np.array(255, np.uint8))
    p = range_params(lo, hi, DType.UINT8, symmetric=False)
    assert p.scale.dtype == np.float32 and p.scale.tobytes() == np.asarray(s, np.float32).tobytes()
    assert p.zero_point.dtype == np.uint8 and int(p.zero_point) == int(z)
    z, s = compute_scale_zp(rmin, rmax, np.array(-127, np.int8), np.array(127, np.int8), symmetric=True)
    p = range_params(lo, hi, DType.INT8, symmetric=True)
    assert p.scale.tobytes() == np.asarray(s, np.float32).tobytes() and int(p.zero_point) == int(z) == 0


@pytest.mark.parametrize("axis", [0, 1, None])
def test_weight_params_and_values_equal_onnxruntime(axis: int | None) -> None:
    w = rand(6, 4, 3, 3, seed=3, scale=0.7)
    w[2] = 0.0  # an all-zero channel: scale 1, as in onnxruntime
    p = weight_params(w, axis)
    q = quantize(w, p)
    channels = range(w.shape[axis]) if axis is not None else [None]
    for c in channels:
        data = w if c is None else w.take(c, axis)
        zp, scale, qdata = quantize_data(data.flatten(), TensorProto.INT8, True)
        ps = p.scale if c is None else p.scale[c]
        assert np.float32(ps).tobytes() == np.asarray(scale, np.float32).tobytes() and int(zp) == 0
        got = q if c is None else q.take(c, axis)
        assert np.array_equal(got.flatten(), qdata)
    assert np.abs(q).max() <= 127  # the level -128 is never used


def test_bias_that_would_overflow_int32_raises_the_weight_scale() -> None:
    w = rand(4, 3, 1, 1, seed=1, scale=1e-3)
    b = np.array([1e4, -3e3, 0.5, 0.0], np.float32)
    wp = weight_params(w, 0)
    x_scale = np.array(1e-6, np.float32)
    fit = fit_weight_to_bias(wp, x_scale, b)
    assert np.all(fit.scale >= wp.scale) and fit.scale[0] > wp.scale[0] and fit.scale[3] == wp.scale[3]
    bq = quantize(b, bias_params(x_scale, fit)).astype(np.int64)
    assert np.all(np.abs(bq) < 2**31 - 1)
    err = np.abs(bq * bias_params(x_scale, fit).scale.astype(np.float64) - b)
    assert np.all(err <= bias_params(x_scale, fit).scale * 0.5 + 1e-9)
    small = np.array([1.0, -1.0, 0.5, 0.0], np.float32)
    assert fit_weight_to_bias(wp, np.array(0.02, np.float32), small) is wp  # nothing to fix: unchanged


def _two_conv_graph() -> Graph:
    m = text_model(
        """g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
             c = Conv<pads=[1,1,1,1]>(x, w1, b1)
             y = Conv<pads=[1,1,1,1]>(c, w2, b2)
           }""",
        w1=rand(4, 3, 3, 3, seed=1),
        b1=rand(4, seed=2),
        w2=rand(4, 4, 3, 3, seed=3),
        b2=rand(4, seed=4),
    )
    g = load_onnx(m)
    PassManager(pipeline("default")).run(g)
    return g


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_two_pass_calibration_replays_or_reruns_alike(method: str) -> None:
    g = _two_conv_graph()
    names = make_plan(g).observe
    samples = [{"x": rand(1, 3, 8, 8, seed=s)} for s in range(5)]
    m = parse_calib_method(method)
    cached = calibrate(g, names, samples, m, symmetric=False, progress=False)
    rerun = calibrate(g, names, samples, m, symmetric=False, progress=False, cache_bytes=0)
    partial = calibrate(g, names, samples, m, symmetric=False, progress=False, cache_bytes=3 * 8 * 8 * 4 * 7)
    assert cached == rerun == partial
    assert all(lo <= 0.0 <= hi and hi > lo for lo, hi in cached.values())
