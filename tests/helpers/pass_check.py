"""Run a pass pipeline on an ONNX model and judge it with onnxruntime."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from compiler.ir import Graph
from compiler.onnx_export import export_onnx
from compiler.pass_infra import PassContext
from compiler.pass_manager import PassManager, PipelineItem
from compiler.rewriter import PassResult
from compiler.runners import run_onnxruntime
from frontends.onnx.loader import load_onnx
from tests.helpers.numerics import assert_close

__all__ = ["run_passes", "ort", "ort_graph", "op_counts", "assert_pass_matches_ort"]


def ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an ONNX model in onnxruntime (optimizations off)."""
    return run_onnxruntime(model.SerializeToString(), feeds)


def ort_graph(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Export a graph to ONNX and run it in onnxruntime."""
    return ort(export_onnx(graph), feeds)


def run_passes(graph: Graph, pipeline: Sequence[PipelineItem], ctx: PassContext | None = None) -> PassResult:
    """Run passes with the verifier after each."""
    return PassManager(list(pipeline), ctx or PassContext(verify_each=True)).run(graph)


def op_counts(graph: Graph) -> Counter[str]:
    """Op histogram of a graph (constants and inputs excluded)."""
    return Counter(n.qualified_op for n in graph.ops())


def assert_pass_matches_ort(
    model: onnx.ModelProto,
    pipeline: Sequence[PipelineItem],
    feeds: Mapping[str, np.ndarray],
    *,
    max_rel: float = 1e-5,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> Graph:
    """Import, run passes, export; onnxruntime on the result must match onnxruntime on the original.

    Tolerance: max|a - e| <= max_rel * max(1, max|e|) per output. Returns the rewritten graph.
    """
    graph = load_onnx(model, input_shapes=input_shapes)
    run_passes(graph, pipeline)
    ref = ort(model, feeds)
    got = ort_graph(graph, feeds)
    assert sorted(got) == sorted(ref)
    for k, e in ref.items():
        scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
        assert_close(got[k], e, rtol=0.0, atol=max_rel * scale, what=k)
    return graph
