"""The MNN and ONNX Backend objects: one CapabilityTable shape, the same verdicts as before.

* MNN's table (``backends.mnn.lower.table.TABLE``) judges nodes by ``check(graph, node)``:
  a supported Conv passes, an op without a lowering is "no mnn lowering", a dynamic shape is
  refused by the table itself (``requires_static``), and op checks still give their reasons.
* ``unsupported_ops`` (the writer's check) lists the same keys as before.
* Each method of ``backends.mnn.backend.BACKEND`` and ``backends.onnx.backend.BACKEND`` is called.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from backends.mnn.backend import BACKEND as MNN
from backends.mnn.lower.graph import unsupported_ops
from backends.mnn.lower.table import TABLE, WEIGHT_VIEWS, supported_ops
from backends.mnn.options import MnnOptions
from backends.mnn.precision import weight_layers
from backends.onnx.backend import BACKEND as ONNX
from compiler.backend import Artifact, CapabilityTable, get_backend
from compiler.errors import OptionError
from compiler.ir.graph import Graph, Node
from compiler.ir.types import DType, TensorType
from compiler.ops.registry import all_ops
from compiler.options import CompileOptions
from compiler.pass_infra import PassContext
from compiler.pipelines import pipeline

DYNAMIC = "dynamic shape (fix it with --input-shape)"


def _conv_graph(shape: tuple[int | str, ...] = (1, 3, 8, 8), const_weight: bool = True) -> tuple[Graph, Node]:
    g = Graph("conv")
    x = g.add_input("x", TensorType(DType.FLOAT32, shape))
    rng = np.random.default_rng(0)
    if const_weight:
        w = g.add_constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    else:
        w = g.add_input("w", TensorType(DType.FLOAT32, (4, 3, 3, 3)))
    b = g.add_constant(rng.standard_normal(4).astype(np.float32), "b")
    conv = g.add_node("Conv", [x, w, b], {"pads": (1, 1, 1, 1)}, name="conv")
    relu = g.add_node("Relu", [g.value(conv)], name="relu")
    g.set_outputs([g.value(relu)])
    return g, conv


def _topk_graph() -> tuple[Graph, Node]:
    g = Graph("topk")
    x = g.add_input("x", TensorType(DType.FLOAT32, (1, 10)))
    k = g.add_constant(np.array([3], np.int64), "k")
    topk = g.add_node("TopK", [x, k], name="topk_7", num_outputs=2)
    g.set_outputs([g.value(topk, 0)])
    return g, topk


def test_supported_conv() -> None:
    g, conv = _conv_graph()
    assert TABLE.reason(g, conv) is None
    assert all(TABLE.reason(g, n) is None for n in g.nodes())  # Input/Constant included
    assert unsupported_ops(g) == {}
    assert [n.name for n, _ in weight_layers(g)] == ["conv"]


def test_check_reason_through_graph_signature() -> None:
    g, conv = _conv_graph(const_weight=False)
    assert TABLE.reason(g, conv) == "weight and bias must be constant"
    assert unsupported_ops(g) == {"Conv (weight and bias must be constant)": ["conv"]}


def test_op_without_lowering() -> None:
    g = Graph("hardmax")
    hardmax = g.add_node("Hardmax", [g.add_input("x", TensorType(DType.FLOAT32, (1, 10)))], name="hardmax_7")
    g.set_outputs([g.value(hardmax)])
    assert "Hardmax" not in TABLE and "Hardmax" not in supported_ops()
    assert TABLE.reason(g, hardmax) == "no mnn lowering"
    assert unsupported_ops(g) == {"Hardmax": ["hardmax_7"]}  # listed by the op name alone, as before


def test_dynamic_shape_refused_by_the_table() -> None:
    g, conv = _conv_graph(shape=("N", 3, 8, 8))
    assert TABLE.requires_static
    assert TABLE.reason(g, conv) == DYNAMIC
    bad = unsupported_ops(g)
    assert bad[f"Conv ({DYNAMIC})"] == ["conv"] and bad[f"Relu ({DYNAMIC})"] == ["relu"]
    assert any(k.startswith("graph input") for k in bad)


def test_dropout_mask_output_refused() -> None:
    g = Graph("drop")
    x = g.add_input("x", TensorType(DType.FLOAT32, (1, 4)))
    drop = g.add_node("Dropout", [x], name="drop", num_outputs=2)
    g.set_outputs([g.value(drop, 0), g.value(drop, 1)])
    assert TABLE.reason(g, drop) is None  # graph outputs are no users of the mask
    neg = g.add_node("Not", [g.value(drop, 1)], name="neg")
    g.set_outputs([g.value(drop, 0), g.value(neg)])
    assert TABLE.reason(g, drop) == "the mask output"


def test_weight_views_are_the_weighted_layers() -> None:
    assert set(WEIGHT_VIEWS) == {"Conv", "kiln::FusedConv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "RNN"}
    assert set(WEIGHT_VIEWS) <= set(TABLE.ops())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--emit")
    p.add_argument("--quantize")
    p.add_argument("--calib", type=Path)
    p.add_argument("--calib-count", type=int)
    p.add_argument("--preprocess")
    MNN.add_arguments(p)
    return p


def test_mnn_backend_flags_and_options() -> None:
    p = _parser()
    args = p.parse_args([])
    assert MNN.options_from_args(args, requested=False) is None
    assert MNN.options_from_args(args, requested=True) == MnnOptions()
    args = p.parse_args(["--mnn-weights", "int8", "--mnn-block-size", "32", "--external-weights"])
    with pytest.raises(OptionError, match="--mnn-weights needs --emit mnn"):
        MNN.options_from_args(args, requested=False)
    assert MNN.options_from_args(args, requested=True) == MnnOptions(
        weights="int8", block_size=32, external=True
    )
    gptq = p.parse_args(
        ["--emit", "onnx,mnn", "--mnn-weights", "int4", "--calib", "d.npz", "--calib-count", "4"]
    )
    assert MNN.consumes_calib(gptq)
    assert MNN.consumes_calib(
        argparse.Namespace(**{**vars(gptq), "emit": ["onnx", "mnn"]})
    )  # --emit repeated
    opts = MNN.options_from_args(gptq, requested=True)
    assert opts is not None and opts.calib == Path("d.npz") and opts.calib_count == 4
    assert not MNN.consumes_calib(p.parse_args(["--emit", "onnx", "--mnn-weights", "int4", "--calib", "d"]))
    assert not MNN.consumes_calib(p.parse_args(["--emit", "mnn", "--mnn-weights", "fp16", "--calib", "d"]))
    assert not MNN.consumes_calib(
        p.parse_args(["--emit", "mnn", "--mnn-weights", "int8", "--calib", "d", "--quantize", "int8"])
    )


def test_mnn_backend_protocol(tmp_path: Path) -> None:
    assert get_backend("mnn") is MNN
    assert (MNN.name, MNN.flag, MNN.options_type) == ("mnn", "--emit", MnnOptions)
    assert MNN.runtime == (".mnn", "backends.mnn.runtime:run_mnn")
    assert MNN.targets() == ["mnn"] and MNN.resolve("mnn") == "mnn"
    with pytest.raises(OptionError):
        MNN.resolve("onnx")
    table = MNN.capabilities("mnn")
    assert isinstance(table, CapabilityTable) and table is TABLE
    assert MNN.legalization("mnn", None) == pipeline("legalize-mnn")
    g, _ = _conv_graph()
    options = CompileOptions(
        model=Path("conv.onnx"), out_dir=tmp_path, emit=("mnn",), backend_options={"mnn": MnnOptions()}
    )
    (art,) = MNN.emit(g, tmp_path, PassContext(options=options), "mnn")
    assert isinstance(art, Artifact) and (art.kind, art.path, art.precision) == ("mnn", "model.mnn", "fp32")
    assert (tmp_path / "model.mnn").stat().st_size > 0


def test_onnx_backend_protocol(tmp_path: Path) -> None:
    assert get_backend("onnx") is ONNX
    assert (ONNX.name, ONNX.flag, ONNX.runtime) == ("onnx", "--emit", None)
    assert ONNX.legalization("onnx", None) == pipeline("legalize-onnx") == []
    table = ONNX.capabilities("onnx")
    assert table.ops() == sorted(d.qualified for d in all_ops())  # every Kiln op has an expansion
    assert "kiln::QConv" in table and "kiln::LayoutTransform" in table
    g, conv = _conv_graph(shape=("N", 3, 8, 8))
    assert table.reason(g, conv) is None  # ONNX keeps symbolic dims
    g, topk = _topk_graph()
    assert table.reason(g, topk) is None
    options = CompileOptions(model=Path("topk.onnx"), out_dir=tmp_path)
    (art,) = ONNX.emit(g, tmp_path, PassContext(options=options), "onnx")
    assert isinstance(art, Artifact) and art.path == "model.onnx" and (tmp_path / "model.onnx").exists()
