"""RNN, GRU and LSTM through TVM: every attribute against onnxruntime, on cpu, cuda and arm.

All cases compile into one graph (tests/helpers/tvm_cases.py) and run on the host against
onnxruntime's own kernels: measured max |d| 2.4e-7 on values up to 1.2 (Softplus: 1.9e-6 at 11.4;
fp32, the gates in the CPU kernels' vectorizable exp/tanh/sigmoid), asserted |d| <= 1e-6 + 2e-6 |ORT|. onnxruntime refuses
``layout=1`` and float64 LSTMs: those cases are checked against the registry's reference (which
computes in the input's float type, like onnxruntime), float64 to 1e-12.
The same cases build for CUDA (nvcc; every kernel thread-bound, one step kernel per direction); one
small LSTM runs for real on the emulated aarch64 board. The zoo's crnn (convs into two bidirectional
LSTMs) compiles for ``--target cpu`` and passes the verification rule (lstm_text in the zoo sweep).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.tvm.cuda_build import cuda_source
from backends.tvm.rpc import RpcAddress
from compiler.cli import main
from compiler.ir import run_graph
from tests.helpers.numerics import assert_close
from tests.helpers.tvm_cases import OpCase, case_graph, compile_cases, ort_outputs, run_cases
from tests.helpers.zoo import ZooCache, zoo  # noqa: F401 - the session fixture

RTOL, ATOL = 2e-6, 1e-6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
WEIGHTS = frozenset({1, 2, 3, 7})  # W, R, B, P
R = np.random.default_rng(7)


def _f(*shape: int, scale: float = 0.5, dtype: type = np.float32) -> np.ndarray:
    return (R.standard_normal(shape) * scale).astype(dtype)


def rnn_case(
    name: str,
    op: str,
    direction: str = "forward",
    *,
    lens: np.ndarray | None = None,
    init: bool = False,
    peep: bool = False,
    seq: int = 5,
    batch: int = 3,
    size: int = 4,
    hidden: int = 6,
    layout: int = 0,
    lens_const: bool = False,
    outputs: int | None = None,
    dtype: type = np.float32,
    **attrs: object,
) -> OpCase:
    """One recurrent node: X, W, R, B (constants), sequence_lens, initial states, P."""
    nd, g = 2 if direction == "bidirectional" else 1, GATES[op]
    state = (batch, nd, hidden) if layout else (nd, batch, hidden)
    x = _f(batch, seq, size, dtype=dtype) if layout else _f(seq, batch, size, dtype=dtype)
    ins: list[np.ndarray | None] = [
        x,
        _f(nd, g * hidden, size, dtype=dtype),
        _f(nd, g * hidden, hidden, dtype=dtype),
        _f(nd, 2 * g * hidden, dtype=dtype),
        lens,
        _f(*state, dtype=dtype) if init else None,
    ]
    if op == "LSTM":
        ins += [_f(*state, dtype=dtype) if init else None, _f(nd, 3 * hidden, dtype=dtype) if peep else None]
    while ins[-1] is None:
        ins.pop()
    consts = WEIGHTS | ({4} if lens_const else set())
    n_out = outputs if outputs is not None else (3 if op == "LSTM" else 2)
    a = {"hidden_size": hidden, "direction": direction, "layout": layout, **attrs}
    return OpCase(name, op, tuple(ins), a, frozenset(consts), n_out)


LENS = np.array([5, 0, 3], np.int32)  # full, empty, shorter
CASES = [
    rnn_case("lstm_fwd", "LSTM"),
    rnn_case("lstm_rev_init", "LSTM", "reverse", init=True),
    rnn_case("lstm_bidir_lens_peep", "LSTM", "bidirectional", lens=LENS, init=True, peep=True),
    rnn_case("lstm_rev_lens_const", "LSTM", "reverse", lens=LENS, lens_const=True),
    rnn_case("lstm_full_lens", "LSTM", lens=np.full(3, 5, np.int32), lens_const=True, outputs=1),
    rnn_case(
        "lstm_coupled_clip_acts",
        "LSTM",
        input_forget=1,
        clip=0.5,
        activations=["Sigmoid", "ScaledTanh", "Affine"],
        activation_alpha=[1.5, 0.5],
        activation_beta=[0.7, 0.1],
    ),
    rnn_case("gru_fwd", "GRU", seq=7, batch=1, hidden=16),
    rnn_case("gru_rev", "GRU", "reverse", init=True),
    rnn_case("gru_bidir_lbr_lens", "GRU", "bidirectional", lens=LENS, init=True, linear_before_reset=1),
    rnn_case(
        "gru_clip_acts",
        "GRU",
        clip=0.7,
        activations=["HardSigmoid", "Softsign"],
        activation_alpha=[0.3],
        activation_beta=[0.4],
    ),
    rnn_case("rnn_fwd", "RNN"),
    rnn_case("rnn_rev_lens", "RNN", "reverse", lens=LENS, init=True),
    rnn_case(
        "rnn_bidir_acts",
        "RNN",
        "bidirectional",
        activations=["Relu", "Elu"],
        activation_alpha=[0.5],
        clip=1.5,
    ),
    rnn_case("rnn_softplus", "RNN", activations=["Softplus"]),
    rnn_case("rnn_leaky", "RNN", activations=["LeakyRelu"], activation_alpha=[0.2]),
    rnn_case("rnn_thresholded", "RNN", activations=["ThresholdedRelu"], activation_alpha=[0.1]),
]
BY_REFERENCE = [  # onnxruntime has no layout=1 and no float64 LSTM
    rnn_case("lstm_layout1", "LSTM", "bidirectional", layout=1, init=True, lens=LENS),
    rnn_case("gru_layout1", "GRU", "reverse", layout=1, init=True),
    rnn_case("lstm_f64", "LSTM", "bidirectional", init=True, dtype=np.float64, batch=2),
]


@pytest.fixture(scope="module")
def results() -> dict[str, list[np.ndarray]]:
    """Every case's TVM cpu outputs (one compile)."""
    return run_cases(CASES + BY_REFERENCE)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_onnxruntime(case: OpCase, results: dict[str, list[np.ndarray]]) -> None:
    got, want = results[case.name], ort_outputs(case)
    assert len(got) == len(want) == case.outputs
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == e.dtype
        assert_close(a, e, rtol=RTOL, atol=ATOL, what=f"{case.name} output {i}")


@pytest.mark.parametrize("case", BY_REFERENCE, ids=[c.name for c in BY_REFERENCE])
def test_matches_the_registry_reference(case: OpCase, results: dict[str, list[np.ndarray]]) -> None:
    """layout=1 in float32, and float64 (the reference computes in the input's float type)."""
    g, feeds, names = case_graph([case])
    want = run_graph(g, feeds)
    f64 = case.inputs[0] is not None and case.inputs[0].dtype == np.float64
    rtol, atol = (1e-12, 1e-12) if f64 else (RTOL, ATOL)
    for i, name in enumerate(names[case.name]):
        got = results[case.name][i]
        assert got.dtype == want[name].dtype
        assert_close(got, want[name], rtol=rtol, atol=atol, what=f"{case.name} output {i}")


def test_cpu_runs_each_direction_as_one_sequence_kernel() -> None:
    """CPU: the step loop runs inside one kernel per direction, one call each, whatever the length;
    the input projection is Kiln's packed dense kernel."""
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target

    g, _, _ = case_graph([rnn_case("long", "LSTM", "bidirectional", seq=40, batch=1)])
    lowered = lower_graph(g, resolve_target("cpu"))
    names = [gv.name_hint for gv, _ in lowered.mod.functions_items()]
    seqs = [n for n in names if n.startswith("kiln_lstm_step_")]
    assert len(seqs) == 2 and all("_seq" in n for n in seqs) and sum(n.endswith("_rev") for n in seqs) == 1
    assert str(lowered.mod["main"]).count("kiln_lstm_step_") == 2
    assert sum(n.startswith("kiln_dense_") for n in names) == 1
    assert {e["op_class"] for e in lowered.kernels if e["kernel"] in seqs} == {"recurrent"}


def test_cuda_keeps_one_step_kernel_call_per_step() -> None:
    """Must not fire on CUDA (a serial loop in one kernel would run on one thread block): a 40-step
    LSTM adds two step PrimFuncs (the step index is a tensor argument) called 40 times each."""
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target

    g, _, _ = case_graph([rnn_case("long", "LSTM", "bidirectional", seq=40, batch=1)])
    mod = lower_graph(g, resolve_target("cuda")).mod
    steps = [gv.name_hint for gv, _ in mod.functions_items() if gv.name_hint.startswith("kiln_lstm_step_")]
    assert len(steps) == 2 and not any("_seq" in n for n in steps)
    assert str(mod["main"]).count("kiln_lstm_step_") >= 80


def test_cuda_build_binds_every_kernel() -> None:
    """nvcc builds the cases for sm_90 (the pipeline refuses any kernel without a thread binding)."""
    cases = [c for c in CASES if c.name in ("lstm_bidir_lens_peep", "gru_bidir_lbr_lens", "rnn_rev_lens")]
    ex, _, _ = compile_cases(cases, "cuda")
    src = cuda_source(ex)
    assert src.count("__global__") >= 10 and "threadIdx.x" in src


def _lstm_model(seq: int = 6, hidden: int = 8) -> onnx.ModelProto:
    """x [seq, 1, 4] -> bidirectional LSTM -> Y [seq, 2, 1, hidden] and Y_h."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), n)
        for n, s in (("W", (2, 4 * hidden, 4)), ("R", (2, 4 * hidden, hidden)), ("B", (2, 8 * hidden)))
    ]
    node = helper.make_node(
        "LSTM", ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=hidden, direction="bidirectional"
    )
    graph = helper.make_graph(
        [node],
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 1, 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, 2, 1, hidden]),
            helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [2, 1, hidden]),
        ],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def test_arm_lstm_runs_on_the_emulated_board(tmp_path: Path, arm_rpc: RpcAddress) -> None:
    """A small bidirectional LSTM compiled for ``--target arm`` runs under qemu within 1e-5 of ORT."""
    from backends.tvm.rpc import run_remote
    from compiler.driver import compile_model
    from compiler.options import CompileOptions
    from compiler.runners import run_onnxruntime

    model = tmp_path / "lstm.onnx"
    onnx.save(_lstm_model(), model)
    compile_model(
        CompileOptions(model=model, out_dir=tmp_path / "out", emit=(), targets=("arm",), verify=False)
    )
    feeds = {"x": np.random.default_rng(4).standard_normal((6, 1, 4)).astype(np.float32)}
    got = run_remote(tmp_path / "out" / "arm" / "model.so", feeds, arm_rpc)
    want = run_onnxruntime(model, feeds)
    for k, e in want.items():
        assert_close(got[k], e, rtol=RTOL, atol=ATOL * 10, what=k)


def test_zoo_crnn_verifies_for_tvm_cpu(zoo: ZooCache, tmp_path: Path) -> None:  # noqa: F811
    m = zoo.get("crnn")
    out = tmp_path / "out"
    argv = ["compile", str(m.model), "-o", str(out), "--target", "cpu", "--inputs", str(m.inputs)]
    assert main(argv) == 0
    ver = json.loads((out / "manifest.json").read_text())["verification"]
    assert ver["passed"]
    assert all(o["max_rel"] <= 1e-5 for a in ver["artifacts"] for o in a["outputs"])
