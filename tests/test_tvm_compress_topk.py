"""Compress (the compress-* decompositions) and TopK with a run-time k on the TVM backend.

Compress(x, c) = Gather(x, Reshape(NonZero(c[:d]), [-1]), axis) for a run-time c, a Gather of
constant positions for a constant c; TopK with k = min(K, n) (n a data-decided dim) or k a graph
input sorts the axis and keeps k' = min(k, L). Every output is compared with onnxruntime exactly
(Gather and TopK copy values: bit-exact values, exact indices, ties by lower index first), empty
results included. Both graphs also build for CUDA (codegen only, no GPU here) and cross-build
for aarch64. MNN and CANN take the constant-condition rule and refuse a run-time one by name.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from backends.tvm.build import compile_module, export
from backends.tvm.cuda_build import cuda_source
from backends.tvm.emit import prepare_graph
from backends.tvm.lower import lower_graph
from backends.tvm.lowering.table import capabilities
from backends.tvm.target import resolve_target
from compiler.ir.graph import Graph
from compiler.preflight import CapabilityError
from frontends.onnx import load_onnx
from tests.helpers.decompose_check import decompose_matches_ort, fake_table, refusals
from tests.helpers.pass_check import op_counts

X = np.random.default_rng(5).standard_normal((3, 5, 4)).astype(np.float32)
# (name, axis, condition length, the constant condition or None: a graph input)
COMPRESS: list[tuple[str, int | None, int, np.ndarray | None]] = [
    ("axis1", 1, 5, None),
    ("flat", None, 60, None),
    ("short_last", -1, 3, None),  # c shorter than the axis: the rest is false
    ("long_axis0", 0, 7, None),  # c longer than the axis: cut to d = 3
    ("const_axis1", 1, 7, np.array([1, 0, 1, 1, 0, 1, 1], bool)),
    ("const_all_false", 2, 4, np.zeros(4, bool)),
]


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def _load(model: onnx.ModelProto) -> Graph:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.onnx"
        onnx.save(model, path)
        return load_onnx(path)


def _legal(model: onnx.ModelProto, target: str) -> Graph:
    return prepare_graph(_load(model), resolve_target(target))[0]


def _vm(legal: Graph) -> Any:
    import tvm
    from tvm import relax

    spec = resolve_target("cpu")
    return relax.VirtualMachine(compile_module(lower_graph(legal, spec).mod, spec), tvm.cpu())


def _run(vm: Any, legal: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import tvm

    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in legal.inputs])
    return [o.numpy() for o in ([out] if len(legal.outputs) == 1 else list(out))]


def _assert_same(got: list[np.ndarray], want: list[np.ndarray], names: list[str]) -> None:
    for name, g, w in zip(names, got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        np.testing.assert_array_equal(g, w, err_msg=name)


def compress_model() -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    ins = [h.make_tensor_value_info("x", T.FLOAT, list(X.shape))]
    inits: list[onnx.TensorProto] = []
    for name, axis, n, const in COMPRESS:
        kw: dict[str, Any] = {} if axis is None else {"axis": axis}
        nodes.append(h.make_node("Compress", ["x", f"c_{name}"], [name], name=name, **kw))
        if const is None:
            ins.append(h.make_tensor_value_info(f"c_{name}", T.BOOL, [n]))
        else:
            inits.append(nh.from_array(const, f"c_{name}"))
    outs = [h.make_tensor_value_info(name, T.FLOAT, None) for name, *_ in COMPRESS]
    graph = h.make_graph(nodes, "compress", ins, outs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def detector_model(k_top: int = 4, k_low: int = 3) -> onnx.ModelProto:
    """x [8, 5] -> d = x[x[:, 0] > 0] ([n, 5]); scores d[:, 1]; TopK(scores, min(K, n)) largest and
    smallest; Compress(d, d[:, 2] > 0) (a run-time axis length); TopK(z [2, 7], kin) on axis 1."""
    consts: dict[str, np.ndarray] = {
        "c0": np.array(0, np.int64),
        "c1": np.array(1, np.int64),
        "c2": np.array(2, np.int64),
        "fz": np.array(0, np.float32),
        "a0": np.array([0], np.int64),
        "ktop": np.array([k_top], np.int64),
        "klow": np.array([k_low], np.int64),
    }
    nodes = [
        h.make_node("Gather", ["x", "c0"], ["col"], axis=1),
        h.make_node("Greater", ["col", "fz"], ["mask"]),
        h.make_node("NonZero", ["mask"], ["nz"]),
        h.make_node("Squeeze", ["nz", "a0"], ["idx"]),
        h.make_node("Gather", ["x", "idx"], ["d"], axis=0),
        h.make_node("Gather", ["d", "c1"], ["scores"], axis=1),
        h.make_node("Shape", ["scores"], ["n"]),
        h.make_node("Min", ["n", "ktop"], ["k1"]),
        h.make_node("TopK", ["scores", "k1"], ["top_v", "top_i"], axis=0, largest=1),
        h.make_node("Min", ["klow", "n"], ["k2"]),
        h.make_node("TopK", ["scores", "k2"], ["low_v", "low_i"], axis=-1, largest=0),
        h.make_node("Gather", ["d", "c2"], ["third"], axis=1),
        h.make_node("Greater", ["third", "fz"], ["keep"]),
        h.make_node("Compress", ["d", "keep"], ["kept"], axis=0),
        h.make_node("TopK", ["z", "kin"], ["z_v", "z_i"], axis=1, largest=1),
    ]
    outs = [("top_v", T.FLOAT), ("top_i", T.INT64), ("low_v", T.FLOAT), ("low_i", T.INT64)]
    outs += [("kept", T.FLOAT), ("z_v", T.FLOAT), ("z_i", T.INT64)]
    graph = h.make_graph(
        nodes,
        "detector",
        [
            h.make_tensor_value_info("x", T.FLOAT, [8, 5]),
            h.make_tensor_value_info("z", T.FLOAT, [2, 7]),
            h.make_tensor_value_info("kin", T.INT64, [1]),
        ],
        [h.make_tensor_value_info(n, t, None) for n, t in outs],
        [nh.from_array(v, k) for k, v in consts.items()],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@functools.cache
def _compress_build() -> tuple[Graph, Any]:
    legal = _legal(compress_model(), "cpu")
    return legal, _vm(legal)


@functools.cache
def _detector_build() -> tuple[Graph, Any, str]:
    legal = _legal(detector_model(), "cpu")
    script = lower_graph(legal, resolve_target("cpu")).mod["main"].script()
    return legal, _vm(legal), script


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compress_matches_onnxruntime(seed: int) -> None:
    legal, vm = _compress_build()
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {"x": X}
    for name, _, n, const in COMPRESS:
        if const is None:  # seed 2: every run-time condition all false (empty outputs)
            feeds[f"c_{name}"] = (rng.random(n) < 0.5) & (seed != 2)
    got = _run(vm, legal, {k: feeds[k] for k in (v.name for v in legal.inputs)})
    _assert_same(got, _ort(compress_model(), feeds), [c[0] for c in COMPRESS])
    assert sum(g.size == 0 for g in got) == (5 if seed == 2 else 1)


def test_compress_decomposes_to_gather() -> None:
    """Structure: every Compress is gone; 4 run-time conditions -> NonZero (one cut by a constant
    Slice: c longer than d), the 2 constant ones -> a Gather of constant positions."""
    legal, _ = _compress_build()
    counts = op_counts(legal)
    assert counts["Compress"] == 0 and counts["NonZero"] == 4 and counts["Slice"] == 1
    assert counts["Gather"] == 6 and counts["Reshape"] == 5  # the flat x, and NonZero's [1, n] rows
    positions = [legal.inputs_of(n)[1] for n in legal.ops() if n.op == "Gather"]
    kept = sorted(tuple(v.const.tolist()) for v in positions if v is not None and v.const is not None)
    assert kept == [(), (0, 2, 3)]  # [1,0,1,1,0] within d = 5; the all-false one: no positions


@pytest.mark.parametrize(("seed", "kin"), [(0, 3), (1, 7), (2, 0), (3, 2)])
def test_runtime_k_topk_matches_onnxruntime(seed: int, kin: int) -> None:
    """n = 8, 5, 2 (< K) and 0 rows; scores with ties; kin a graph input (0: empty)."""
    legal, vm, _ = _detector_build()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    firsts = [np.abs(x[:, 0]), np.where(np.arange(8) % 3, 1.0, -1.0), np.where(np.arange(8) < 2, 1.0, -1.0)]
    x[:, 0] = firsts[seed] if seed < 3 else -1.0  # n = 8, 5, 2, 0
    x[:, 1] = np.round(x[:, 1])  # ties: the lower index first
    z = np.round(rng.standard_normal((2, 7)) * 2).astype(np.float32)
    feeds: dict[str, np.ndarray] = {"x": x, "z": z, "kin": np.array([kin], np.int64)}
    got = _run(vm, legal, feeds)
    names = [v.name for v in legal.outputs]
    _assert_same(got, _ort(detector_model(), feeds), names)
    assert got[0].shape == (min(4, [8, 5, 2, 0][seed]),) and got[5].shape == (2, kin)


def test_runtime_k_is_symbolic_when_tracked() -> None:
    """k = min(K, n) stays symbolic (the outputs are [min(n, 4)], planned by that bound); the
    graph-input k is bound at run time (tensor_to_shape + match_cast) and clamped to the axis."""
    legal, _, script = _detector_build()
    assert op_counts(legal)["TopK"] == 3
    calls = [line for line in script.splitlines() if re.search(r"call_tir\(kiln_topk\d*,", line)]
    assert len(calls) == 3
    assert sum("T.min(n" in c and ", 4)" in c for c in calls) == 1
    assert sum("T.min(3, n" in c for c in calls) == 1
    assert sum("T.min(T.max(k" in c and ", 0), 7)" in c for c in calls) == 1  # clamped to [0, 7]
    assert script.count("R.match_cast") == 3  # NonZero's two counts and the graph-input k


def test_static_topk_keeps_the_static_rule_and_bad_k_is_refused() -> None:
    """Must-not-fire: a constant k on a static x lowers through TOPI's topk, not the sort; a k
    tensor of two values is refused with the reason."""
    g = Graph("m")
    x = g.add_input("x", _ftype((2, 7)))
    k = g.add_constant(np.array([3], np.int64), "k")
    top = g.add_node("TopK", [x, k], {"axis": 1}, name="top", num_outputs=2)
    g.set_outputs(g.outputs_of(top))
    script = lower_graph(g, resolve_target("cpu")).mod["main"].script()
    assert "call_tir(topk," in script and "kiln_topk" not in script
    from compiler.ir.types import DType, TensorType

    g2 = Graph("m2")
    x2 = g2.add_input("x", _ftype((2, 7)))
    k2 = g2.add_input("k", TensorType(DType.INT64, (2,)))
    bad = g2.add_node("TopK", [x2, k2], {"axis": 1}, name="bad", num_outputs=2)
    g2.set_outputs(g2.outputs_of(bad))
    assert capabilities().reason(g2, bad) == "k must hold one value, got shape [2]"


def _ftype(shape: tuple[int, ...]) -> Any:
    from compiler.ir.types import TensorType

    return TensorType.of(np.zeros(shape, np.float32))


def _one_compress(axis: int | None, n: int, const: np.ndarray | None = None) -> onnx.ModelProto:
    ins = [h.make_tensor_value_info("x", T.FLOAT, list(X.shape))]
    inits = [] if const is None else [nh.from_array(const, "c")]
    if const is None:
        ins.append(h.make_tensor_value_info("c", T.BOOL, [n]))
    kw: dict[str, Any] = {} if axis is None else {"axis": axis}
    graph = h.make_graph(
        [h.make_node("Compress", ["x", "c"], ["y"], **kw)],
        "one",
        ins,
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_decompositions_gate_on_nonzero() -> None:
    """Pass level, against onnxruntime (exact; a second run changes nothing): with NonZero native
    the run-time rule fires; without it only a constant condition decomposes, and the run-time
    one is left with the reason (must-not-fire)."""
    has_nz = fake_table(("NonZero", "Reshape", "Gather", "Shape", "Slice"))
    feeds = {"x": X, "c": np.array([1, 0, 0, 1, 1, 0, 1], bool)}
    g = decompose_matches_ort(_one_compress(0, 7), feeds, max_rel=0.0, table=has_nz)
    assert dict(op_counts(g)) == {"Slice": 1, "NonZero": 1, "Reshape": 1, "Gather": 1}
    no_nz = fake_table(("Reshape", "Gather", "Shape", "Slice"))
    reasons, counts = refusals(_one_compress(1, 5), no_nz)
    assert counts == {"Compress": 1}
    assert any("produces NonZero, which fake has no native entry for" in r for r in reasons), reasons
    const = _one_compress(None, 9, np.array([0, 1, 1, 0, 0, 0, 0, 0, 1], bool))
    g = decompose_matches_ort(const, {"x": X}, max_rel=0.0, table=no_nz)
    assert dict(op_counts(g)) == {"Reshape": 1, "Gather": 1}


def test_mnn_and_cann_take_constant_conditions_and_refuse_runtime_ones(tmp_path: Path) -> None:
    """A constant condition: one Gather, run in MNN's runtime (exact vs onnxruntime), and a CANN
    .om; a run-time one: each refuses naming Compress and the missing NonZero."""
    from backends.mnn.runtime import run_mnn
    from compiler.driver import compile_model
    from compiler.options import CompileOptions

    const = _one_compress(1, 7, np.array([1, 0, 1, 1, 0, 1, 1], bool))
    onnx.save(const, tmp_path / "const.onnx")
    onnx.save(_one_compress(1, 5), tmp_path / "runtime.onnx")
    for be in ("mnn", "cann"):
        opts = CompileOptions(
            model=tmp_path / "const.onnx", out_dir=tmp_path / be, emit=(be,), verify=False, progress=False
        )
        compile_model(opts)
        with pytest.raises(CapabilityError, match=rf"Compress .*no {be} lowering.*produces NonZero"):
            compile_model(
                CompileOptions(
                    model=tmp_path / "runtime.onnx",
                    out_dir=tmp_path / f"{be}_rt",
                    emit=(be,),
                    verify=False,
                    progress=False,
                )
            )
    got = run_mnn(tmp_path / "mnn" / "model.mnn", {"x": X})["y"]
    want = _ort(const, {"x": X})[0]
    assert got.shape == want.shape == (3, 3, 4)
    np.testing.assert_array_equal(got, want)
    assert (tmp_path / "cann" / "model.om").stat().st_size > 0


def test_compress_and_runtime_k_build_for_cuda_and_arm(tmp_path: Path) -> None:
    """CUDA: every kernel (NonZero's serial loop, the GPU argsort, the prefix copies) is
    thread-bound (the pipeline refuses one that is not); arm: an aarch64 shared library."""
    model = detector_model()
    spec = resolve_target("cuda")
    src = cuda_source(compile_module(lower_graph(_legal(model, "cuda"), spec).mod, spec))
    assert "__global__" in src and "kiln_topk" in src and "kiln_nonzero" in src
    arm = resolve_target("arm")
    lib = tmp_path / "model.so"
    export(compile_module(lower_graph(_legal(compress_model(), "arm"), arm).mod, arm), lib, arm)
    head = lib.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64
