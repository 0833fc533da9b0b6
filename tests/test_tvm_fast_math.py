"""Kiln's vectorizable exp/erf/tanh/sigmoid (backends.tvm.kernels.fast_math) and the generic
schedule's matmul, row-reduction and concat rules: accuracy against float64 and onnxruntime.

Tolerances (fp32): the fast forms within 2-3e-7 of float64 (a few ulp); ops within 1e-6 of
onnxruntime (whose own exp/erf/tanh are approximations too), products and reductions within 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from backends.tvm.kernels import fast_math
from backends.tvm.kernels.conv_geometry import trim_dead_taps
from backends.tvm.target import resolve_target
from tests.helpers.numerics import assert_close
from tests.helpers.tvm_cases import OpCase, ort_outputs, run_cases

R = np.random.default_rng(11)
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 88.5, -88.5, 100.0, -100.0])


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (R.standard_normal(shape) * scale).astype(np.float32)


def _run_expr(fn: Callable[[object], object], x: np.ndarray) -> np.ndarray:
    """``fn`` applied elementwise by a PrimFunc vectorized by 16 (n a multiple of 16)."""
    import tvm
    from tvm import s_tir, te

    n = x.shape[0]
    xp = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: fn(xp[i]), name="y")
    sch = s_tir.Schedule(te.create_prim_func([xp, y]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(sch.split(loop, [None, 16])[1])
    lib = tvm.compile(sch.mod, target=resolve_target("cpu").tvm_target())
    out = tvm.runtime.tensor(np.zeros(n, np.float32))
    lib(tvm.runtime.tensor(x), out)
    return out.numpy()


def _grid() -> np.ndarray:
    xs = np.concatenate([np.linspace(-12, 12, 9600), R.uniform(-95, 95, 4800), np.geomspace(1e-8, 3, 1600)])
    xs = np.concatenate([xs, -xs[-1600:], SPECIALS])
    pad = -len(xs) % 16
    return np.concatenate([xs, np.zeros(pad)]).astype(np.float32)


_ERF = np.vectorize(math.erf, otypes=[np.float64])
FORMS = [
    ("exp", fast_math.fast_exp, np.exp, "rel", 2e-7),
    ("erf", fast_math.fast_erf, _ERF, "abs", 2e-7),
    ("tanh", fast_math.fast_tanh, np.tanh, "rel", 3e-7),
    ("sigmoid", fast_math.fast_sigmoid, lambda v: 1 / (1 + np.exp(-v)), "abs", 2e-7),
]


@pytest.mark.parametrize(("name", "fast", "ref", "kind", "tol"), FORMS, ids=[f[0] for f in FORMS])
def test_fast_forms_match_float64(
    name: str,
    fast: Callable[[object], object],
    ref: Callable[[np.ndarray], np.ndarray],
    kind: str,
    tol: float,
) -> None:
    x = _grid()
    got = _run_expr(fast, x).astype(np.float64)
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64))
    nan = np.isnan(x)
    assert np.isnan(got[nan]).all(), f"{name}: NaN must stay NaN"
    ok = ~nan & (np.abs(want) < 3.4e38) & ((np.abs(want) > 1.2e-38) | (kind == "abs"))
    err = np.abs(got[ok] - want[ok])
    if kind == "rel":
        err = err / np.abs(want[ok])
    assert err.max() <= tol, f"{name}: max {kind} error {err.max():.3g} > {tol}"
    if name == "exp":
        assert got[x == 100.0][0] == np.inf and got[x == -100.0][0] == 0.0 and got[x == -np.inf][0] == 0.0


def _cases() -> list[OpCase]:
    wide = np.concatenate([_f(2, 3, 40, scale=20.0), np.full((2, 3, 1), 90.0, np.float32)], axis=2)
    return [
        OpCase("exp", "Exp", (wide,)),
        OpCase("erf", "Erf", (_f(4, 257, scale=3.0),)),
        OpCase("tanh", "Tanh", (_f(4, 257, scale=4.0),)),
        OpCase("sigmoid", "Sigmoid", (_f(4, 257, scale=8.0),)),
        OpCase("softmax_odd", "Softmax", (_f(2, 3, 197, scale=4.0),), {"axis": -1}),
        OpCase("softmax_axis1", "Softmax", (_f(2, 19, 5, scale=4.0),), {"axis": 1}),
        OpCase("softmax_short", "Softmax", (_f(3, 7, scale=4.0),), {"axis": -1}),
        OpCase("log_softmax", "LogSoftmax", (_f(4, 50, scale=4.0),), {"axis": -1}),
        OpCase("pow3", "Pow", (_f(4, 64), np.array(3.0, np.float32)), consts=frozenset({1})),
        OpCase("pow2", "Pow", (_f(4, 64), np.array([2.0], np.float32)), consts=frozenset({1})),
    ]


def test_fast_math_ops_match_onnxruntime() -> None:
    cases = _cases()
    got = run_cases(cases)
    for c in cases:
        tol = 1e-5 if c.op == "LogSoftmax" else 1e-6
        assert_close(got[c.name][0], ort_outputs(c)[0], rtol=tol, atol=tol, what=c.name)


def _schedule_cases() -> list[OpCase]:
    const = frozenset({1})
    return [
        # matmul rule: predicated row tiles (197 is prime), padded columns (100, 197), batches
        OpCase("mm_rows", "MatMul", (_f(1, 197, 64), _f(64, 96)), consts=const),
        OpCase("mm_cols", "MatMul", (_f(50, 128), _f(128, 100)), consts=const),
        OpCase("mm_qk", "MatMul", (_f(1, 3, 197, 32), _f(1, 3, 32, 197))),
        OpCase("mm_pv", "MatMul", (_f(2, 4, 49, 49), _f(2, 4, 49, 32))),
        OpCase("mm_bcast", "MatMul", (_f(2, 3, 16, 24), _f(24, 48))),
        # row reduction (rfactor) and the decomposed LayerNorm
        OpCase("mean_rows", "ReduceMean", (_f(3, 5, 192), np.array([-1], np.int64)), consts=const),
        OpCase(
            "layernorm",
            "LayerNormalization",
            (_f(2, 17, 96), _f(96), _f(96)),
            {"axis": -1},
            frozenset({1, 2}),
        ),
        # concat selecting on an outer axis
        OpCase("concat", "Concat", tuple(_f(1, c, 6, 20) for c in (3, 5, 2, 8, 1)), {"axis": 1}),
    ]


def test_schedule_rules_match_onnxruntime() -> None:
    cases = _schedule_cases()
    got = run_cases(cases)
    for c in cases:
        assert_close(got[c.name][0], ort_outputs(c)[0], rtol=1e-5, atol=1e-5, what=c.name)


def test_dead_taps_are_trimmed_exactly() -> None:
    w = _f(4, 3, 3, 3)
    # ASPP: dilation 24 on a 20x20 map, only the centre tap reads the input
    w2, pads, dil = trim_dead_taps(w, (20, 20), (1, 1), (24, 24, 24, 24), (24, 24))
    assert w2.shape == (4, 3, 1, 1) and pads == (0, 0, 0, 0) and dil == (1, 1)
    np.testing.assert_array_equal(w2[:, :, 0, 0], w[:, :, 1, 1])
    # dilation 12: every tap reads some output's input, nothing to trim
    assert trim_dead_taps(w, (20, 20), (1, 1), (12, 12, 12, 12), (12, 12))[0] is w
    # one axis only (the map is 7 high, 40 wide)
    w3, pads3, dil3 = trim_dead_taps(w, (7, 40), (1, 1), (8, 8, 8, 8), (8, 8))
    assert w3.shape == (4, 3, 1, 3) and pads3 == (0, 8, 0, 8) and dil3 == (1, 8)


def test_trimmed_dilated_conv_matches_onnxruntime() -> None:
    attrs = {"dilations": [24, 24], "pads": [24, 24, 24, 24], "kernel_shape": [3, 3]}
    attrs12 = {"dilations": [12, 12], "pads": [12, 12, 12, 12], "kernel_shape": [3, 3]}
    x = _f(1, 16, 20, 20)
    cases = [
        OpCase("aspp24", "Conv", (x, _f(32, 16, 3, 3), _f(32)), attrs, frozenset({1, 2})),
        OpCase("aspp12", "Conv", (x, _f(32, 16, 3, 3), _f(32)), attrs12, frozenset({1, 2})),
    ]
    got = run_cases(cases)
    for c in cases:
        assert_close(got[c.name][0], ort_outputs(c)[0], rtol=1e-5, atol=1e-5, what=c.name)


def test_schedule_rules_are_the_ones_applied() -> None:
    """Which generic rule scheduled each case (the records the kernel report is built from)."""
    from backends.tvm.build import compile_module
    from backends.tvm.emit import prepare_graph
    from backends.tvm.lower import lower_graph
    from tests.helpers.tvm_cases import case_graph

    g, _, _ = case_graph(_schedule_cases())
    spec = resolve_target("cpu")
    legal, _ = prepare_graph(g, spec)
    log: list[dict[str, str]] = []
    compile_module(lower_graph(legal, spec).mod, spec, log)
    rules = [e["rule"] for e in log]
    classes = {e["op_class"] for e in log}
    assert rules.count("generic:matmul") == 5, rules
    assert rules.count("generic:row-reduction") >= 1, rules  # the mean (LayerNorm: Kiln's row kernel)
    assert {"matmul", "batched_matmul", "reduction", "elementwise"} <= classes, classes
    assert all(e["isa"] == "generic" for e in log)
