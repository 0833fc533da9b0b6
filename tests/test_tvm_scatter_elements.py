"""Kiln's ScatterElements kernel (backends/tvm/lowering/scatter_elements.py) against onnxruntime.

Static cases (one compile, tests/helpers/tvm_cases.py): every reduction, axes 0, 1 and -1 of a
rank-3 tensor, negative and duplicate indices (``none``: the last update wins, as onnxruntime).
Run-time-shaped cases (tests/helpers/dynamic_models.py: ``d [n, 5]`` after a NonZero): data,
indices and updates of shape [n, 5], and a zero tensor ConstantOfShape(Shape(d)) written through
constant indices. Every value is bit-exact (the updates are combined in onnxruntime's order).
The lowered module calls Kiln's kernel (its name and ``kiln.scheduled``), never TOPI's, one
function per spec; for CUDA it is thread-bound (the build refuses unbound kernels).
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h

from backends.tvm.build import compile_module
from backends.tvm.cuda_build import cuda_source
from backends.tvm.emit import prepare_graph
from backends.tvm.kernel_report import OP_CLASSES
from backends.tvm.lower import lower_graph
from backends.tvm.target import resolve_target
from frontends.onnx import load_onnx
from tests.helpers.dynamic_models import DynCase, dynamic_model
from tests.helpers.tvm_cases import OpCase, case_graph, compile_cases, ort_outputs, run_cases

R = np.random.default_rng(17)
SHAPE = (3, 4, 5)
IDX_SHAPE = (2, 3, 4)
KERNEL = "kiln_scatter_elements_"


def _case(reduction: str, axis: int) -> OpCase:
    dim = SHAPE[axis]
    idx = R.integers(-dim, dim, IDX_SHAPE).astype(np.int64)  # negatives, and duplicates along axis
    data = R.standard_normal(SHAPE).astype(np.float32)
    upd = R.standard_normal(IDX_SHAPE).astype(np.float32)
    return OpCase(
        f"{reduction}_axis{axis}", "ScatterElements", (data, idx, upd), {"axis": axis, "reduction": reduction}
    )


CASES = [_case(r, a) for r in ("none", "add", "mul", "max", "min") for a in (0, 1, -1)]


def test_static_cases_match_onnxruntime_exactly() -> None:
    got = run_cases(CASES)
    for case in CASES:
        idx = case.inputs[1]
        assert idx is not None
        axis = int(case.attrs["axis"]) % 3
        n_dup = idx.size - len(
            {(*p[:axis], idx[p] % SHAPE[axis], *p[axis + 1 :]) for p in np.ndindex(idx.shape)}
        )
        assert n_dup > 0 and bool(np.any(idx < 0)), case.name  # the case exercises both
        for a, e in zip(got[case.name], ort_outputs(case), strict=True):
            assert a.dtype == e.dtype, case.name
            np.testing.assert_array_equal(a, e, err_msg=case.name)


def test_static_module_calls_kilns_kernel_once_per_spec() -> None:
    from tvm import tirx

    spec = resolve_target("cpu")
    twice = [*CASES[:2], dataclasses.replace(CASES[0], name="none_axis0_again")]
    legal, _ = prepare_graph(case_graph(twice)[0], spec)
    mod = lower_graph(legal, spec).mod
    funcs = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}
    ours = sorted(n for n in funcs if n.startswith(KERNEL))
    assert len(ours) == 2 and len(funcs) == 2, sorted(funcs)  # axes 0 and 1; the repeat shares axis 0's
    for n in ours:
        assert str(funcs[n].attrs["kiln.scheduled"]) == "scatter_elements"
        assert str(funcs[n].attrs["kiln.op_class"]) == "scatter" and "scatter" in OP_CLASSES
    assert mod["main"].script().count("R.call_tir(") == 3


def test_cuda_build_is_thread_bound() -> None:
    ex, _, _ = compile_cases(CASES[3:5], "cuda")  # add on axes 0 and 1: a copy and a scatter launch each
    src = cuda_source(ex)
    assert src.count("__global__ void") >= 4 and KERNEL in src


def _dyn_cases() -> list[DynCase]:
    shape = [h.make_node("Shape", ["d"], ["sh"])]
    neg = [  # indices 0 or -1 along axis 1 (where d > 0): many duplicates, data-shaped
        h.make_node("Greater", ["d", "fz"], ["pos"]),
        h.make_node("Cast", ["pos"], ["posi"], to=TensorProto.INT64),
        h.make_node("Neg", ["posi"], ["idx1"]),
        h.make_node("Mul", ["d", "three"], ["upd"]),
    ]
    consts = {"fz": np.array(0.0, np.float32), "three": np.array(3.0, np.float32)}
    cases = [
        DynCase(
            f"dyn_{r}_axis1",
            [*neg, h.make_node("ScatterElements", ["d", "idx1", "upd"], ["y"], axis=1, reduction=r)],
            consts,
        )
        for r in ("none", "add", "mul", "max", "min")
    ]
    cases.append(
        DynCase(
            "dyn_zeros_axis0",
            [
                *shape,
                h.make_node(
                    "ConstantOfShape", ["sh"], ["zz"], value=h.make_tensor("v", TensorProto.FLOAT, [1], [0.0])
                ),
                h.make_node("ScatterElements", ["zz", "i0", "u0"], ["y"], axis=0, reduction="add"),
            ],
            {
                "i0": np.array([[0, -1, 0, -1, 0], [0, 0, -1, -1, 0]], np.int64),
                "u0": np.arange(10, dtype=np.float32).reshape(2, 5) - 4.5,
            },
        )
    )
    return cases


@functools.cache
def _dynamic() -> tuple[onnx.ModelProto, Any, Any]:
    """(the model, a VM over its exported cpu library, the lowered module): built once."""
    import tvm
    from tvm import relax

    model = dynamic_model(_dyn_cases())
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.onnx"
        onnx.save(model, path)
        graph = load_onnx(path)
        spec = resolve_target("cpu")
        mod = lower_graph(graph, spec).mod
        ex = compile_module(mod, spec)
        lib = Path(d) / "model.so"
        ex.export_library(str(lib))
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    assert [v.name for v in graph.inputs] == ["x"]
    return model, vm, mod


@pytest.mark.parametrize("seed", [0, 1])
def test_runtime_shaped_cases_match_onnxruntime_exactly(seed: int) -> None:
    import tvm
    from tvm import tirx

    cases = _dyn_cases()
    model, vm, mod = _dynamic()
    names = [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert sum(n.startswith(KERNEL) for n in names) == 6, names  # 5 reductions + the zeros case
    x = np.random.default_rng(seed).standard_normal((8, 5)).astype(np.float32)
    x[:, 0] = np.abs(x[:, 0]) * np.array([1, -1, 1, 1, -1, 1, -1, 1])  # n = 5 rows pass the prefix
    out = vm["main"](tvm.runtime.tensor(x))
    got = [o.numpy() for o in out]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    for case, g, w in zip(cases, got, want, strict=True):
        assert g.shape == w.shape == (5, 5) and g.dtype == w.dtype, case.name
        np.testing.assert_array_equal(g, w, err_msg=case.name)
