"""ScatterND, ScatterElements, GatherND, GatherElements, TopK and RoiAlign through TVM, and If with
a run-time condition; each against onnxruntime, and built for CUDA.

All op cases compile as one graph (tests/helpers/tvm_cases.py). Scatter, gather and TopK move values
unchanged: bit-exact (TopK's indices too, ties included: the lower index first, as onnxruntime);
RoiAlign's bilinear averages are within 1e-7 (asserted 1e-6 + 1e-6 |ORT|). Duplicate indices with
``reduction="none"`` keep the last update (onnxruntime's order). Refused ops name their reason.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from backends.tvm.cuda_build import cuda_source
from backends.tvm.lower import lower_graph
from backends.tvm.lowering.table import REFUSED, capabilities
from backends.tvm.target import resolve_target
from compiler.errors import UnsupportedOpsError
from compiler.ir.graph import Graph
from compiler.ir.types import TensorType
from frontends.onnx import load_onnx
from tests.helpers.control_flow_models import if_model
from tests.helpers.numerics import assert_close
from tests.helpers.tvm_cases import OpCase, compile_cases, ort_outputs, run_cases

R = np.random.default_rng(11)


def _f(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def _i(*rows: object) -> np.ndarray:
    return np.array(rows, np.int64)


IDX = frozenset({1})
ROIS = np.array([[2, 2, 16, 12], [0, 0, 24, 20], [-4, 6, 10, 28], [6.6, 4.4, 7.8, 5.0]], np.float32)
BATCH = np.array([0, 1, 1, 0], np.int64)
CASES = [
    OpCase(
        "snd_add_dup_neg",
        "ScatterND",
        (_f(4, 5, 3), _i([1, 2], [-1, 0], [1, 2]), _f(3, 3)),
        {"reduction": "add"},
    ),
    OpCase("snd_none_const", "ScatterND", (_f(4, 5, 3), _i([1, 2], [-1, 0], [2, 2]), _f(3, 3)), {}, IDX),
    OpCase("snd_none_dup", "ScatterND", (_f(6), _i([1], [4], [1]), _f(3)), {}),
    OpCase("snd_mul_rows", "ScatterND", (_f(4, 5), _i([3], [0], [3]), _f(3, 5)), {"reduction": "mul"}),
    OpCase("snd_max", "ScatterND", (_f(4, 5), _i([3], [0], [3]), _f(3, 5)), {"reduction": "max"}),
    OpCase("snd_min_const", "ScatterND", (_f(4, 5), _i([3], [0], [3]), _f(3, 5)), {"reduction": "min"}, IDX),
    OpCase("snd_full_index", "ScatterND", (_f(2, 3, 4), _i([[0, 1, 2], [1, -1, -1]]), _f(1, 2)), {}),
    OpCase(
        "sel_add_axis0",
        "ScatterElements",
        (_f(3, 4), _i([0, 2, -1, 1], [2, 2, 0, 0]), _f(2, 4)),
        {"axis": 0, "reduction": "add"},
    ),
    OpCase(
        "sel_none_axis1", "ScatterElements", (_f(3, 4), _i([0, 3], [1, -1], [2, 0]), _f(3, 2)), {"axis": 1}
    ),
    OpCase(
        "sel_max_neg_axis",
        "ScatterElements",
        (_f(3, 4), _i([0, 3], [1, -1], [2, 0]), _f(3, 2)),
        {"axis": -1, "reduction": "max"},
    ),
    OpCase(
        "sel_mul_const",
        "ScatterElements",
        (_f(2, 3, 2), _i([[1, 0], [2, 2]], [[0, 0], [1, 2]]), _f(2, 2, 2)),
        {"axis": 1, "reduction": "mul"},
        IDX,
    ),
    OpCase("gnd_batch", "GatherND", (_f(2, 3, 4), _i([[1, -1]], [[0, 2]])), {"batch_dims": 1}),
    OpCase("gnd_slices_const", "GatherND", (_f(3, 4, 2), _i([2], [0], [-1])), {}, IDX),
    OpCase("gel_neg", "GatherElements", (_f(3, 4), _i([0, -1], [2, 1], [1, 1])), {"axis": 1}),
    OpCase("gel_axis0_const", "GatherElements", (_f(3, 4), _i([2, 0, 1, -3])), {"axis": 0}, IDX),
    OpCase("topk_ties", "TopK", (R.integers(0, 4, (3, 9)).astype(np.float32), _i(4)), {}, IDX, 2),
    OpCase(
        "topk_smallest_ties",
        "TopK",
        (R.integers(0, 3, (2, 8)).astype(np.float32), _i(3)),
        {"largest": 0},
        IDX,
        2,
    ),
    OpCase("topk_axis1", "TopK", (_f(2, 7, 4), _i(3)), {"axis": 1}, IDX, 2),
    OpCase(
        "topk_all",
        "TopK",
        (
            _f(
                5,
            ),
            _i(5),
        ),
        {},
        IDX,
        2,
    ),
    OpCase("roi_half_pixel", "RoiAlign", (_f(2, 3, 10, 12), ROIS, BATCH), {"spatial_scale": 0.5}),
    OpCase(
        "roi_sampling2",
        "RoiAlign",
        (_f(2, 3, 10, 12), ROIS, BATCH),
        {"spatial_scale": 0.5, "sampling_ratio": 2, "output_height": 3, "output_width": 2},
        frozenset({1, 2}),
    ),
    OpCase(
        "roi_output_half_pixel",
        "RoiAlign",
        (_f(2, 3, 10, 12), ROIS / 2, BATCH),
        {"coordinate_transformation_mode": "output_half_pixel", "output_height": 2, "output_width": 4},
    ),
]
EXACT = {"ScatterND", "ScatterElements", "GatherND", "GatherElements", "TopK"}


@pytest.fixture(scope="module")
def results() -> dict[str, list[np.ndarray]]:
    """Every case's TVM cpu outputs (one compile)."""
    return run_cases(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_onnxruntime(case: OpCase, results: dict[str, list[np.ndarray]]) -> None:
    want = ort_outputs(case)
    for i, (a, e) in enumerate(zip(results[case.name], want, strict=True)):
        assert a.dtype == e.dtype, f"{case.name} output {i}"
        if case.op in EXACT:
            np.testing.assert_array_equal(a, e, err_msg=f"{case.name} output {i}")
        else:
            assert_close(a, e, rtol=1e-6, atol=1e-6, what=f"{case.name} output {i}")


def test_cuda_builds_thread_bound_kernels() -> None:
    """Scatter (ScatterND: TOPI's GPU form; ScatterElements: Kiln's kernel), TopK (GPU sort), RoiAlign (bound by Kiln: dlight cannot) build."""
    picked = ("snd_add_dup_neg", "sel_add_axis0", "gnd_batch", "gel_neg", "topk_ties", "roi_sampling2")
    ex, _, _ = compile_cases([c for c in CASES if c.name in picked], "cuda")
    assert cuda_source(ex).count("__global__") >= len(picked)


def _if_graph() -> Graph:
    return load_onnx(if_model(cond_from_shape=False))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_if_with_a_runtime_condition_selects_between_both_branches(target: str) -> None:
    import tvm
    from tvm import relax

    from backends.tvm.build import compile_module

    g = _if_graph()
    spec = resolve_target(target)
    assert capabilities().reason(g, next(n for n in g.ops() if n.op == "If")) is None
    ex = compile_module(lower_graph(g, spec).mod, spec)
    if target == "cuda":
        assert "__global__" in cuda_source(ex)
        return
    vm = relax.VirtualMachine(ex, tvm.cpu())
    sess = ort.InferenceSession(
        if_model(cond_from_shape=False).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    x = _f(2, 4)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        got = vm["main"](*[tvm.runtime.tensor(feeds[v.name], tvm.cpu()) for v in g.inputs]).numpy()
        np.testing.assert_array_equal(got, sess.run(None, feeds)[0])


def test_if_refuses_a_branch_it_cannot_lower_naming_the_node() -> None:
    g = _if_graph()
    node = next(n for n in g.ops() if n.op == "If")
    branch = node.attrs.else_branch
    neg = next(n for n in branch.ops() if n.op == "Neg")
    x = branch.inputs_of(neg)[0]
    assert x is not None
    branch.add_node("RandomNormalLike", [x], name="rand_in_branch")
    why = capabilities().reason(g, node)
    assert why is not None and "else_branch node" in why and "rand_in_branch" in why


def test_refused_ops_give_their_reason() -> None:
    g = Graph("m")
    x = g.add_input("x", TensorType.of(_f(2, 5)))
    cond = g.add_input("c", TensorType.of(np.array([True, False])))
    cp = g.add_node("Compress", [x, cond], name="my_compress", attrs={"axis": 0})
    g.set_outputs(g.outputs_of(cp))
    assert "Compress" in REFUSED and "Compress" not in capabilities()
    with pytest.raises(UnsupportedOpsError, match="Compress.*output length depends on the data.*my_compress"):
        lower_graph(g, resolve_target("cpu"), "m.onnx")


def test_roi_align_max_mode_is_refused_with_the_reason() -> None:
    g = Graph("m")
    vals = [
        g.add_input("x", TensorType.of(_f(1, 2, 4, 4))),
        g.add_constant(ROIS[:1], "r"),
        g.add_constant(BATCH[:1], "b"),
    ]
    node = g.add_node("RoiAlign", vals, {"mode": "max"})
    why = capabilities().reason(g, node)
    assert why is not None and "onnxruntime's max over the weighted bilinear taps" in why
