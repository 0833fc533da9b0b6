"""The default pipeline on every shared model: structure, numerics against onnxruntime, idempotence."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from compiler.api import PassManager, load_model
from compiler.ir import Graph
from compiler.ops.fused import KILN, activation_of
from compiler.pipelines import pipeline
from tests.conftest import MODEL_STEMS, MODELS
from tests.helpers.pass_check import op_counts, ort, ort_graph

# kiln::FusedConv nodes that carry an activation after the default pipeline.
FUSED_WITH_ACTIVATION = {
    "pan_mnv3s_skin_clothes_hair": 55,
    "ppocr_mobile_v2_cls": 42,
    "ultraface_rfb320": 36,
    "yunet_n_320": 18,
}
INPUT_SHAPES = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}


def unfused_conv_activations(graph: Graph) -> list[str]:
    """Activations that directly follow a single-use conv without a fused activation."""
    bad = []
    for node in graph.ops():
        if activation_of(node, graph) is None:
            continue
        src = graph.inputs_of(node)[0]
        assert src is not None
        prod = src.producer
        conv = (prod.op == "Conv" and not prod.domain) or (
            prod.domain == KILN and prod.op == "FusedConv" and prod.attrs.activation == "none"
        )
        if conv and len(graph.users(src)) == 1 and not graph.is_output(src):
            bad.append(node.name or node.output_names[0])
    return bad


@pytest.mark.parametrize("stem", MODEL_STEMS)
def test_default_pipeline_on_shared_model(stem: str) -> None:
    graph = load_model(MODELS / f"{stem}.onnx", input_shapes=INPUT_SHAPES.get(stem))
    PassManager(pipeline("default")).run(graph)
    counts = op_counts(graph)
    assert counts["BatchNormalization"] == 0
    fused = [
        n for n in graph.ops() if n.domain == KILN and n.op == "FusedConv" and n.attrs.activation != "none"
    ]
    assert len(fused) == FUSED_WITH_ACTIVATION[stem]
    assert unfused_conv_activations(graph) == []
    feeds = dict(np.load(MODELS / "data" / f"{stem}.npz"))
    ref = ort(onnx.load(MODELS / f"{stem}.onnx"), feeds)
    got = ort_graph(graph, feeds)
    for name, expected in ref.items():
        err = float(np.max(np.abs(got[name] - expected))) / max(1.0, float(np.max(np.abs(expected))))
        assert err <= 1e-4, f"{stem}:{name} max rel {err:.3g}"
    assert not PassManager(pipeline("default")).run(graph).changed
