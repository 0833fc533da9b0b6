"""Data-dependent dims on the TVM backend: NonZero / NonMaxSuppression and the ops after them on
symbolic shapes, compiled, exported and run in the VM, each against onnxruntime.

One graph holds every case (tests/helpers/dynamic_models.py: a NonZero makes ``d [n, 5]``) and is
compiled once. Data movement (gather, slice, concat, reshape, expand, scatter, select) is bit-exact;
arithmetic within 1e-6 (Gemm/Softmax/reductions: 2e-6 relative to max(1, |ORT|)). NMS rows are
compared exactly (same order: batch, class, descending score, ties by lower index).
"""

from __future__ import annotations

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
from backends.tvm.dynamic_shapes import graph_is_dynamic
from backends.tvm.lower import lower_graph
from backends.tvm.lowering.table import capabilities
from backends.tvm.target import resolve_target
from frontends.onnx import load_onnx
from tests.helpers.dynamic_models import DynCase, dynamic_model, nms_model

I64 = TensorProto.INT64


def _c(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


N = [h.make_node("Shape", ["d"], ["sh"]), h.make_node("Gather", ["sh", "z"], ["n"], axis=0)]
CASES = [
    DynCase("reduce_sum", [h.make_node("ReduceSum", ["d", "ax"], ["y"], keepdims=0)], {"ax": _c(1)}),
    DynCase(
        "gemm_softmax",
        [h.make_node("Gemm", ["d", "w", "b"], ["g"], transB=1), h.make_node("Softmax", ["g"], ["y"], axis=1)],
        {
            "w": np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5),
            "b": np.array([0.1, -0.2, 0.3], np.float32),
        },
    ),
    DynCase(
        "scatter",
        [
            *N,
            h.make_node("Range", ["r0", "n", "r1"], ["r"]),
            h.make_node("Reshape", ["r", "m1"], ["r2"]),
            h.make_node("Expand", ["r2", "sh"], ["e"]),
            h.make_node(
                "ConstantOfShape", ["sh"], ["zz"], value=h.make_tensor("v", TensorProto.FLOAT, [1], [0.0])
            ),
            h.make_node("Mul", ["d", "two"], ["d2"]),
            h.make_node("ScatterElements", ["zz", "e", "d2"], ["y"], axis=0),
        ],
        {
            "z": np.array(0, np.int64),
            "r0": np.array(0, np.int64),
            "r1": np.array(1, np.int64),
            "m1": _c(-1, 1),
            "two": np.array(2.0, np.float32),
        },
    ),
    DynCase(
        "reshape_tracked",
        [
            *N,
            h.make_node("Unsqueeze", ["n", "a0"], ["nu"]),
            h.make_node("Concat", ["nu", "tail"], ["s"], axis=0),
            h.make_node("Concat", ["d", "d"], ["dd"], axis=1),
            h.make_node("Reshape", ["dd", "s"], ["y"]),
        ],
        {"z": np.array(0, np.int64), "a0": _c(0), "tail": _c(-1, 2)},
    ),
    DynCase(
        "reshape_runtime",
        [
            *N,
            h.make_node("Unsqueeze", ["n", "a0"], ["nu"]),
            h.make_node("Concat", ["nu", "tail"], ["s0"], axis=0),
            h.make_node("Cast", ["s0"], ["sf"], to=TensorProto.FLOAT),
            h.make_node("Cast", ["sf"], ["s"], to=I64),
            h.make_node("Reshape", ["d", "s"], ["y"]),
        ],
        {"z": np.array(0, np.int64), "a0": _c(0), "tail": _c(0, -1)},
    ),
    DynCase(
        "slice_runtime_end",
        [
            *N,
            h.make_node("Sub", ["n", "one"], ["e0"]),
            h.make_node("Unsqueeze", ["e0", "a0"], ["e"]),
            h.make_node("Cast", ["e"], ["ef"], to=TensorProto.FLOAT),
            h.make_node("Cast", ["ef"], ["e2"], to=I64),
            h.make_node("Slice", ["d", "st", "e2", "a0"], ["y"]),
        ],
        {"z": np.array(0, np.int64), "one": np.array(1, np.int64), "a0": _c(0), "st": _c(1)},
    ),
    DynCase(
        "slice_to_end_steps",
        [h.make_node("Slice", ["d", "st", "en", "ax", "sp"], ["y"])],
        {"st": _c(1, 1), "en": _c(2**63 - 1, -1), "ax": _c(1, 0), "sp": _c(1, 2)},
    ),
    DynCase(
        "concat_split",
        [
            h.make_node("Concat", ["d", "d"], ["cc"], axis=0),
            h.make_node("Split", ["cc", "parts"], ["p0", "y"], axis=1),
        ],
        {"parts": _c(2, 3)},
    ),
    DynCase(
        "transpose_flatten",
        [
            h.make_node("Unsqueeze", ["d", "a2"], ["u"]),
            h.make_node("Transpose", ["u"], ["t"], perm=[1, 2, 0]),
            h.make_node("Flatten", ["t"], ["y"], axis=1),
        ],
        {"a2": _c(2)},
    ),
    DynCase(
        "gather_negative",
        [h.make_node("Gather", ["d", "neg"], ["y"], axis=0)],
        {"neg": _c(-1, 0)},
    ),
    DynCase("gather_indices", [h.make_node("Gather", ["idx", "d_i"], ["y"], axis=0)], {"d_i": _c(0)}, I64),
    DynCase(
        "if_empty",
        [
            *N,
            h.make_node("Equal", ["n", "z0"], ["cond"]),
            h.make_node(
                "If",
                ["cond"],
                ["y"],
                then_branch=h.make_graph(
                    [
                        h.make_node(
                            "Constant", [], ["e"], value=h.make_tensor("e", TensorProto.FLOAT, [0, 5], [])
                        )
                    ],
                    "then",
                    [],
                    [h.make_tensor_value_info("e", TensorProto.FLOAT, [0, 5])],
                ),
                else_branch=h.make_graph(
                    [h.make_node("Mul", ["d", "d"], ["m"])],
                    "else",
                    [],
                    [h.make_tensor_value_info("m", TensorProto.FLOAT, ["k", 5])],
                ),
            ),
        ],
        {"z": np.array(0, np.int64), "z0": np.array(0, np.int64)},
        shape=["k", 5],
    ),
]
CASES.append(
    DynCase(
        "gemm_wide",  # Kiln's symbolic-rows dense kernel: 2 vectors of 16 columns, row tiles of 4
        [h.make_node("Gemm", ["d", "w"], ["y"], transB=1)],
        {"w": np.linspace(-2, 2, 160, dtype=np.float32).reshape(32, 5)},
    )
)
_IF = next(c for c in CASES if c.name == "if_empty")
CASES.append(
    DynCase(  # rows from an If's select (c·0 + (1 - c)·n): the dense kernel binds its own row var
        "if_then_gemm",
        [
            *_IF.nodes[:-1],
            h.make_node("If", ["cond"], ["t"], **{a.name: a.g for a in _IF.nodes[-1].attribute}),
            h.make_node("Gemm", ["t", "w"], ["y"], transB=1),
        ],
        {**_IF.consts, "w": np.linspace(-1, 1, 80, dtype=np.float32).reshape(16, 5)},
    )
)
ROI = DynCase(
    "roi_align",
    [
        h.make_node("Slice", ["d", "s1", "s5", "s_ax"], ["r4"]),
        h.make_node("Abs", ["r4"], ["ra"]),
        h.make_node("Mul", ["ra", "k3"], ["rois"]),
        h.make_node("Mul", ["idx", "i0"], ["bi"]),
        h.make_node(
            "RoiAlign",
            ["feat", "rois", "bi"],
            ["y"],
            output_height=2,
            output_width=3,
            sampling_ratio=2,
            spatial_scale=0.5,
        ),
    ],
    {
        "s1": _c(1),
        "s5": _c(5),
        "s_ax": _c(1),
        "k3": np.array(3.0, np.float32),
        "i0": np.array(0, np.int64),
        "feat": np.random.default_rng(3).standard_normal((1, 2, 6, 6)).astype(np.float32),
    },
)
CASES.append(ROI)
EXACT = {
    "scatter",
    "reshape_tracked",
    "reshape_runtime",
    "slice_runtime_end",
    "slice_to_end_steps",
    "concat_split",
    "transpose_flatten",
    "gather_negative",
    "gather_indices",
    "if_empty",
}


def _load(model: onnx.ModelProto) -> Any:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.onnx"
        onnx.save(model, path)
        return load_onnx(path)


def _build(model: onnx.ModelProto) -> tuple[Any, Any]:
    """(the Kiln graph, a VM over the exported library)."""
    import tvm
    from tvm import relax

    graph = _load(model)
    spec = resolve_target("cpu")
    ex = compile_module(lower_graph(graph, spec).mod, spec)
    with tempfile.TemporaryDirectory() as d:
        lib = Path(d) / "model.so"
        ex.export_library(str(lib))
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    return graph, vm


def _run(graph: Any, vm: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import tvm

    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in graph.inputs])
    outs = [out] if len(graph.outputs) == 1 else list(out)
    return [o.numpy() for o in outs]


@functools.cache
def _dynamic() -> tuple[Any, Any, onnx.ModelProto]:
    model = dynamic_model(CASES)
    graph, vm = _build(model)
    return graph, vm, model


def _x(rows_positive: list[int]) -> np.ndarray:
    x = np.random.default_rng(len(rows_positive)).standard_normal((8, 5)).astype(np.float32)
    x[:, 0] = -np.abs(x[:, 0]) - 0.1
    x[rows_positive, 0] *= -1
    return x


@pytest.mark.parametrize("rows", [[0, 2, 3, 6], [7], [1, 2, 3, 4, 5, 6]])
def test_dynamic_ops_match_onnxruntime(rows: list[int]) -> None:
    graph, vm, model = _dynamic()
    assert graph_is_dynamic(graph)
    feeds = {"x": _x(rows)}
    got = _run(graph, vm, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for case, g, w in zip(CASES, got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (case.name, g.shape, w.shape)
        if case.name in EXACT:
            np.testing.assert_array_equal(g, w, err_msg=case.name)
        else:
            assert np.max(np.abs(g - w), initial=0.0) <= 2e-6 * max(
                1.0, float(np.max(np.abs(w), initial=0.0))
            ), case.name


def _nms_feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 10, (1, 12, 2)).astype(np.float32)
    wh = rng.uniform(1, 5, (1, 12, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + wh], -1)
    boxes[0, 1] = boxes[0, 1, [2, 3, 0, 1]]  # flipped corners are the same box
    scores = rng.uniform(0, 1, (1, 2, 12)).astype(np.float32)
    scores[0, 0, 3] = scores[0, 0, 5]  # a tie: the lower index first
    return {"boxes": boxes, "scores": scores}


@pytest.mark.parametrize(
    ("max_out", "iou", "score", "center"),
    [(3, 0.3, None, 0), (2**63 - 1, 0.5, 0.4, 0), (100, 0.2, 0.1, 1), (0, 0.5, None, 0)],
)
def test_nms_head_matches_onnxruntime(max_out: int, iou: float, score: float | None, center: int) -> None:
    model = nms_model(max_out, iou, score, center)
    graph, vm = _build(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (0, 1):
        feeds = _nms_feeds(seed)
        got = _run(graph, vm, feeds)
        want = sess.run(None, feeds)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[2], want[2], rtol=1e-6, atol=1e-6)


def test_static_graph_keeps_its_dataflow_block_and_dynamic_nodes_pass_the_table() -> None:
    """Must-not-fire: a static graph is lowered as before (one dataflow block, no match_cast);
    a graph with NonZero has every node accepted by the table."""
    from tvm import relax

    x = h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    static = h.make_model(
        h.make_graph([h.make_node("Relu", ["x"], ["y"])], "s", [x], [y]),
        opset_imports=[h.make_opsetid("", 17)],
    )
    g = _load(static)
    assert not graph_is_dynamic(g)
    main = lower_graph(g, resolve_target("cpu")).mod["main"]
    assert [type(b) for b in main.body.blocks] == [relax.DataflowBlock]
    dyn = _load(dynamic_model(CASES))
    table = capabilities()
    assert {n.op: table.reason(dyn, n) for n in dyn.ops() if table.reason(dyn, n)} == {}


def test_computed_nms_threshold_is_refused() -> None:
    model = nms_model(3, 0.3, None)
    g = _load(model)
    nms = next(n for n in g.ops() if n.op == "NonMaxSuppression")
    assert capabilities().reason(g, nms) is None
    iou = g.inputs_of(nms)[3]
    assert iou is not None
    g2 = _load(model)
    node2 = next(n for n in g2.ops() if n.op == "NonMaxSuppression")
    x = g2.add_input("thr", iou.type)
    g2.set_input(node2, 3, x)
    why = capabilities().reason(g2, node2)
    assert why is not None and "iou_threshold (input 3) must be a constant" in why


def test_nms_and_nonzero_build_for_cuda() -> None:
    """Every kernel of the dynamic path is thread-bound on CUDA (the serial NonZero / NMS loops on
    one thread, the sort on the GPU's): the CUDA pipeline refuses any kernel that is not."""
    from backends.tvm.cuda_build import cuda_source

    spec = resolve_target("cuda")
    for model in (nms_model(3, 0.3, 0.1), dynamic_model([CASES[0], CASES[2], ROI])):
        src = cuda_source(compile_module(lower_graph(_load(model), spec).mod, spec))
        assert "__global__" in src
        assert ("kiln_nms" in src) or ("kiln_nonzero" in src)
