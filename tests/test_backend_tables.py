"""The CANN and TVM capability tables and Backend objects.

Each table gives its verdict on a node from the graph alone (``reason``: None or why not),
before any lowering runs; the lowerings then refuse the same nodes with the same reason.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from backends.cann.backend import BACKEND as CANN
from backends.cann.emit import MODEL_FILE, om_bytes
from backends.cann.options import CannOptions
from backends.tvm.backend import BACKEND as TVM
from compiler.backend import Backend, get_backend
from compiler.errors import ConversionError, OptionError, UnsupportedOpsError
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType, TensorType
from compiler.options import CompileOptions
from compiler.pass_infra import PassContext
from compiler.pipelines import pipeline
from frontends.cann.loader import load_om

R = np.random.default_rng(0)


def _f(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def _one(op: str, inputs: list[np.ndarray], attrs: dict[str, object] | None = None, **kw: object) -> Graph:
    """A one-node graph: input 0 is a graph input, the others constants."""
    g = Graph("t")
    vals = [g.add_input("x", TensorType.of(inputs[0]))]
    vals += [g.add_constant(a, f"c{i}") for i, a in enumerate(inputs[1:], 1)]
    node = g.add_node(op, vals, attrs or {}, name="n", **kw)  # type: ignore[arg-type]
    g.set_outputs(g.outputs_of(node)[:1])
    return g


def _node(g: Graph) -> Node:
    (node,) = g.ops()
    return node


def _reason(backend: Backend, target: str, g: Graph) -> str | None:
    return backend.capabilities(target).reason(g, _node(g))


# ---------------------------------------------------------------------------------------- CANN
def test_cann_table_verdicts() -> None:
    assert _reason(CANN, "cann", _one("Relu", [_f(1, 3, 4, 4)])) is None
    assert _reason(CANN, "cann", _one("Conv", [_f(1, 3, 8, 8), _f(4, 3, 3, 3)])) is None
    hardmax = _one("Hardmax", [_f(4, 3)])
    assert _reason(CANN, "cann", hardmax) == "no cann lowering"
    pool = _one("MaxPool", [_f(1, 1, 4, 4)], {"kernel_shape": [2, 2]}, num_outputs=2)
    assert _reason(CANN, "cann", pool) == "2 outputs (the CANN backend maps single-output ops)"
    # a one-to-one op: an attribute its GE mapping lacks (saturate) must keep its default
    cast = _one("Cast", [_f(2, 3)], {"to": int(DType.FLOAT16), "saturate": 0})
    assert _reason(CANN, "cann", cast) == "attribute saturate=0 has no CANN equivalent"
    assert _reason(CANN, "cann", _one("Cast", [_f(2, 3)], {"to": int(DType.FLOAT16)})) is None
    # a coded lowering's check
    pad = _one("Pad", [_f(1, 3, 4, 4), np.zeros(8, np.int64)], {"mode": "wrap"})
    assert _reason(CANN, "cann", pad) == "mode 'wrap' has no PadV3 form (constant, reflect, edge)"
    crop = _one("Pad", [_f(1, 3, 4, 4), np.array([0, 0, -1, 0, 0, 0, 0, 0], np.int64)])
    assert _reason(CANN, "cann", crop) == "negative pads [0, 0, -1, 0, 0, 0, 0, 0] (crops) have no PadV3 form"
    avg = _one("AveragePool", [_f(1, 1, 4, 4)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
    assert _reason(CANN, "cann", avg) is None  # AvgPoolV2 (exclusive)


def test_cann_lowering_refuses_by_the_table_before_writing() -> None:
    cast = _one("Cast", [_f(2, 3)], {"to": int(DType.FLOAT16), "saturate": 0})
    with pytest.raises(ConversionError, match="Cast 'n'.*attribute saturate=0 has no CANN equivalent"):
        om_bytes(cast)
    pool = _one("MaxPool", [_f(1, 1, 4, 4)], {"kernel_shape": [2, 2]}, num_outputs=2)
    with pytest.raises(ConversionError, match="2 outputs"):
        om_bytes(pool)


def test_cann_backend_methods(tmp_path: Path) -> None:
    assert get_backend("cann") is CANN
    assert (CANN.name, CANN.flag, CANN.options_type) == ("cann", "--emit", CannOptions)
    assert CANN.runtime == (".om", "backends.cann.runtime:run_om")
    assert CANN.targets() == ["cann"] and CANN.resolve("cann") == "cann"
    with pytest.raises(OptionError):
        CANN.resolve("mnn")
    assert CANN.legalization("cann", None) == pipeline("legalize-cann")
    ops = CANN.capabilities("cann").ops()
    assert {"Relu", "Conv", "kiln::FusedConv", "QuantizeLinear", "kiln::Relu6"} <= set(ops)

    parser = argparse.ArgumentParser()
    CANN.add_arguments(parser)
    assert CANN.options_from_args(parser.parse_args(["--cann-schema", "domi"]), True) == CannOptions("domi")
    assert CANN.options_from_args(parser.parse_args([]), True) == CannOptions("ge")
    assert CANN.options_from_args(parser.parse_args([]), False) is None
    with pytest.raises(OptionError, match="--cann-schema needs --emit cann"):
        CANN.options_from_args(parser.parse_args(["--cann-schema", "ge"]), False)

    options = CompileOptions(Path("m.onnx"), tmp_path, backend_options={"cann": CannOptions("domi")})
    (art,) = CANN.emit(_one("Relu", [_f(1, 3, 4, 4)]), tmp_path, PassContext(options=options), "cann")
    assert (art.kind, art.target, art.path) == ("cann", "ascend (domi)", MODEL_FILE)
    assert [n.op for n in load_om(tmp_path / MODEL_FILE).ops()] == ["Relu"]


# ----------------------------------------------------------------------------------------- TVM
def test_tvm_table_verdicts() -> None:
    assert _reason(TVM, "cpu", _one("Relu", [_f(1, 3, 4, 4)])) is None
    assert _reason(TVM, "cpu", _one("Conv", [_f(1, 3, 8, 8), _f(4, 3, 3, 3)])) is None
    from frontends.onnx.loader import load_onnx
    from tests.helpers.control_flow_models import loop_cumsum_model

    g = load_onnx(loop_cumsum_model(m_input=True))  # a Loop whose trip count is an input
    (node,) = [n for n in g.ops() if n.op == "Loop"]
    why = TVM.capabilities("cpu").reason(g, node)
    assert why is not None and why.startswith("no tvm lowering: Loop needs run-time control flow")
    conv1d = _one("Conv", [_f(1, 3, 8), _f(4, 3, 3)])
    assert _reason(TVM, "cpu", conv1d) == "only 2-D convolutions lower to TVM"
    g = Graph("w")
    x, w = g.add_input("x", TensorType.of(_f(1, 3, 8, 8))), g.add_input("w", TensorType.of(_f(4, 3, 3, 3)))
    node = g.add_node("Conv", [x, w], {})
    g.set_outputs(g.outputs_of(node))
    assert TVM.capabilities("cpu").reason(g, node) == "weight (input 1) must be a constant for --target"
    pad = _one("Pad", [_f(1, 3, 4, 4), np.zeros(8, np.int64)], {"mode": "reflect"})
    assert _reason(TVM, "cpu", pad) == "Pad mode 'reflect' has no TVM lowering"


def test_tvm_lowering_reports_refusals_with_their_reason() -> None:
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target

    with pytest.raises(
        UnsupportedOpsError, match=r"Conv \(only 2-D convolutions lower to TVM\) \(nodes 'n'\)"
    ):
        lower_graph(_one("Conv", [_f(1, 3, 8), _f(4, 3, 3)]), resolve_target("x86-avx2"), "m.onnx")


def test_tvm_backend_methods() -> None:
    assert get_backend("tvm") is TVM
    assert (TVM.name, TVM.flag, TVM.options_type) == ("tvm", "--target", None)
    assert TVM.runtime == (".so", "backends.tvm.runtime:run_tvm")
    assert TVM.targets() == ["cpu", "x86-avx2", "x86-avx512", "arm", "arm-dotprod", "cuda", "cuda:sm_XX"]
    assert [TVM.resolve(t) for t in ("x86-avx2", "arm", "cuda", "cuda:sm_80")] == [
        "x86-avx2",
        "arm",
        "cuda",
        "cuda:sm_80",
    ]
    for bad in ("riscv", "cuda:sm_XX", "cuda:sm_50"):
        with pytest.raises(OptionError):
            TVM.resolve(bad)
    assert {"Conv", "kiln::QConv", "kiln::LayoutTransform"} <= set(TVM.capabilities("arm").ops())
    arm = TVM.legalization("arm", None)
    assert arm[:2] == ["fuse-conv-bias-act", "fuse-quantized-ops{conv1d=1}"]
    assert arm[-2:] == ["choose-layout{lanes=4}", "eliminate-dead-nodes"]
    assert "choose-layout{lanes=16}" in TVM.legalization("x86-avx512", None)
    assert not any("choose-layout" in str(i) for i in TVM.legalization("cuda:sm_80", None))
