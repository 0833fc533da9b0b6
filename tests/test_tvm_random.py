"""RandomUniformLike / RandomNormalLike in TVM: Kiln's counter-based generator (compiler/ops/random.py).

onnxruntime's values cannot be matched, so on 10^5 samples per output the test checks shapes and
dtypes (the ``dtype`` attribute included), that the library equals Kiln's interpreter (uniform bit
for bit; normal within 1e-5 · max|e|: libm's log/cos against numpy's), determinism (two builds, two
runs: identical bytes; an absent seed is the documented default), that other seeds give other
values, and the moments: |mean - μ| <= 5 σ / sqrt(n) and |std / σ - 1| <= 0.01 (5 standard errors
of the sample std is 0.011 / 0.016 for these sizes), uniform within [low, high).
CUDA (sm_90, built here, nothing run): the pipeline accepts the kernels (it refuses an unbound one).
"""

from __future__ import annotations

import math
import re

import numpy as np

from backends.tvm.build import compile_module
from backends.tvm.cuda_build import cuda_ptx
from backends.tvm.emit import prepare_graph
from backends.tvm.lower import lower_graph
from backends.tvm.target import resolve_target
from compiler.ir.graph import Graph
from compiler.ir.interpreter import run_graph
from compiler.ir.types import DType, TensorType
from compiler.ops.random import DEFAULT_SEED
from compiler.support_matrix import support_matrix
from tests.helpers.numerics import assert_close

SHAPE = (4, 250, 100)  # 10^5 samples
N = math.prod(SHAPE)
# name -> (op, attrs, distribution (mean, std, low, high))
OUTS: dict[str, tuple[str, dict[str, float | int], tuple[float, float]]] = {
    "normal": ("RandomNormalLike", {"mean": 1.5, "scale": 2.0, "seed": 3.0}, (1.5, 2.0)),
    "uniform": ("RandomUniformLike", {"low": -1.0, "high": 3.0}, (1.0, 4.0 / math.sqrt(12.0))),
    "uniform_seed0": (
        "RandomUniformLike",
        {"low": -1.0, "high": 3.0, "seed": DEFAULT_SEED},
        (1.0, 4.0 / math.sqrt(12.0)),
    ),
    "uniform_seed7": (
        "RandomUniformLike",
        {"low": -1.0, "high": 3.0, "seed": 7.0},
        (1.0, 4.0 / math.sqrt(12.0)),
    ),
    "normal_fp16": ("RandomNormalLike", {"dtype": int(DType.FLOAT16), "seed": 1.0}, (0.0, 1.0)),
}


def _graph() -> Graph:
    g = Graph("random")
    x = g.add_input("x", TensorType(DType.FLOAT32, SHAPE))
    outs = []
    for name, (op, attrs, _) in OUTS.items():
        outs.append(g.value(g.add_node(op, [x], attrs, name=name)))
    g.set_outputs(outs, list(OUTS))
    return g


def _build(target_name: str = "cpu") -> object:
    target = resolve_target(target_name)
    legal, _ = prepare_graph(_graph(), target)
    return compile_module(lower_graph(legal, target).mod, target)


def _run(ex: object) -> dict[str, np.ndarray]:
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(ex, tvm.cpu())
    res = vm["main"](tvm.runtime.tensor(np.zeros(SHAPE, np.float32), tvm.cpu()))
    return {name: res[i].numpy() for i, name in enumerate(OUTS)}


def test_cpu_library_matches_the_interpreter_and_the_distributions() -> None:
    ex1, ex2 = _build(), _build()
    got, again, other_build = _run(ex1), _run(ex1), _run(ex2)
    ref = run_graph(_graph(), {"x": np.zeros(SHAPE, np.float32)})
    for name, (op, attrs, (mu, sigma)) in OUTS.items():
        y = got[name]
        want_dt = np.float16 if attrs.get("dtype") == int(DType.FLOAT16) else np.float32
        assert y.shape == SHAPE and y.dtype == want_dt, (name, y.shape, y.dtype)
        assert again[name].tobytes() == y.tobytes() == other_build[name].tobytes(), name
        e = ref[name]
        if op == "RandomUniformLike":
            np.testing.assert_array_equal(y, e, err_msg=name)
            assert float(y.min()) >= attrs["low"] and float(y.max()) < attrs["high"], name
        else:
            tol = 1e-3 if want_dt == np.float16 else 1e-5  # fp16: one rounding of the float32 value
            assert_close(y, e, rtol=0.0, atol=tol * max(1.0, float(np.abs(e).max())), what=name)
        v = y.astype(np.float64)
        assert abs(v.mean() - mu) <= 5 * sigma / math.sqrt(N), (name, v.mean())
        assert abs(v.std() / sigma - 1) <= 0.01, (name, v.std())
    assert got["uniform"].tobytes() == got["uniform_seed0"].tobytes()  # absent seed = DEFAULT_SEED
    assert np.mean(got["uniform"] == got["uniform_seed7"]) < 0.01  # another seed, other values
    # neighbouring samples are not correlated (the counter hash decorrelates i and i + 1)
    u = got["uniform"].ravel().astype(np.float64)
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) <= 5 / math.sqrt(N)


def test_cuda_binds_the_kernels() -> None:
    ex = _build("cuda:sm_90")  # the CUDA pipeline refuses a kernel without a thread binding
    ptx = cuda_ptx(ex, "sm_90")
    bounds = re.findall(r"\.entry (kiln_random\w*)\([^{]*?\.maxntid (\d+)", ptx, flags=re.S)
    assert bounds and all(int(t) > 1 for _, t in bounds), bounds


def test_support_matrix_lists_tvm_native() -> None:
    rows = support_matrix(["tvm"]).rows
    assert rows["RandomUniformLike"]["tvm"].status == rows["RandomNormalLike"]["tvm"].status == "native"
