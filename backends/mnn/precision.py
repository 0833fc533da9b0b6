"""The weight plan of int8/int4 MNN files: which layers keep fp16 weights.

Weight-only quantization of every layer can cost more accuracy than the precision
allows: a depthwise 3x3 kernel whose nine weights span 0.01..58 loses its small weights
to an int8 grid, and early layers amplify the error (MNN's own converter loses the same
accuracy on such models). The plan measures it on the compile inputs and keeps the
most damaging layers in fp16:

1. run the model with every eligible layer's weights as MNN will decode them; if the
   worst output cosine against fp32 reaches the target, every layer is quantized;
2. else score each layer alone (that layer quantized, the others fp16) and keep fp16 in
   the k worst layers, with k the smallest count that reaches the target (binary search,
   then a linear check upward in case the effect is not monotonic).

With ``rounded`` (per-node int storage carrying precomputed levels, e.g. GPTQ's from
:mod:`backends.mnn.gptq_weights`) the trials decode those levels instead of rounding the
float weights to nearest, and the plan's storage keeps them for the layers left quantized.

The target is ``MnnOptions.target_cosine`` raised by 10% of its distance to 1, so MNN's
own float arithmetic cannot tip a borderline plan below it. The evaluation runs in
onnxruntime, single-threaded so the plan (and the file) is the same on every run, on one
exported model whose planned weights are graph inputs: one session serves every trial.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from backends.mnn.lower.registry import WeightView
from backends.mnn.lower.table import WEIGHT_VIEWS
from backends.mnn.options import MnnOptions
from backends.mnn.weights import WeightStorage, decoded_weights
from compiler.errors import KilnError
from compiler.ir.graph import Graph, Node
from compiler.ir.types import TensorType
from compiler.metrics import agreement

__all__ = ["WeightPlan", "plan_weights", "weight_layers", "MARGIN"]

log = logging.getLogger(__name__)

MARGIN = 0.1
FALLBACK = WeightStorage("fp16")


@dataclass
class WeightPlan:
    """Per-node storage overrides and what the plan measured."""

    storage: dict[int, WeightStorage] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    cosine_all_quantized: float = 1.0
    cosine: float = 1.0
    layers: int = 0


def weight_layers(graph: Graph) -> list[tuple[Node, WeightView]]:
    """Nodes whose weights MNN stores compressed, with their weight views (graph order)."""
    out = []
    for node in graph.ops():
        weight = WEIGHT_VIEWS.get(node.qualified_op)
        if weight is None:
            continue
        view = weight(graph, node)
        if view is not None:
            out.append((node, view))
    return out


class _Trials:
    """One onnxruntime session over a copy of the graph whose planned weights are inputs."""

    def __init__(self, graph: Graph, layers: list[tuple[Node, WeightView]], feeds: Mapping[str, np.ndarray]):
        try:
            import onnxruntime as ort
        except ImportError:
            raise KilnError(
                "planning int8/int4 MNN weights needs onnxruntime (or pass --mnn-min-cosine 0)"
            ) from None
        from compiler.onnx_export import export_onnx, model_bytes

        probe = graph.clone()
        self.names: list[str] = []
        for node, view in layers:
            n = probe.node(node.id)
            old = probe.inputs_of(n)[view.port]
            assert old is not None
            name = probe.unique_name(f"__kiln_weight_{node.id}")
            probe.set_input(n, view.port, probe.add_input(name, TensorType.of(view.restore(view.rows))))
            self.names.append(name)
            if not probe.has_users(old.producer):
                probe.remove(old.producer)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        self.session = ort.InferenceSession(
            model_bytes(export_onnx(probe)), so, providers=["CPUExecutionProvider"]
        )
        wanted = {i.name for i in self.session.get_inputs()}
        self.feeds = {k: np.asarray(v) for k, v in feeds.items() if k in wanted}
        self.reference: list[np.ndarray] = []

    def run(self, weights: list[np.ndarray]) -> list[np.ndarray]:
        """The outputs with these weights (in layer order)."""
        feeds = dict(self.feeds)
        feeds.update(zip(self.names, weights, strict=True))
        return [np.asarray(o) for o in self.session.run(None, feeds)]

    def cosine(self, weights: list[np.ndarray]) -> float:
        """The worst output cosine against the reference."""
        outs = self.run(weights)
        return min(agreement(o, r).cosine for o, r in zip(outs, self.reference, strict=True))


def plan_weights(
    graph: Graph,
    options: MnnOptions,
    feeds: Mapping[str, np.ndarray],
    rounded: Mapping[int, WeightStorage] | None = None,
) -> WeightPlan:
    """The weight plan for ``graph`` under ``options`` (empty unless int8/int4 with a target).

    ``rounded``: int storage per node id with precomputed levels; the plan measures and keeps
    them (``plan.storage`` then holds every layer's storage, fp16 for the fallback layers).
    """
    default = WeightStorage.of(options)
    target = options.target_cosine
    layers = weight_layers(graph)
    chosen = dict(rounded or {})
    plan = WeightPlan(storage=dict(chosen), layers=len(layers))
    if default.bits is None or target <= 0.0 or not layers:
        return plan
    goal = target + MARGIN * (1.0 - target)
    trials = _Trials(graph, layers, feeds)
    float_w = [view.restore(view.rows) for _, view in layers]
    quant_w = [
        view.restore(
            decoded_weights(view.rows, chosen.get(node.id, default), view.block_elems(options.block_size))
        )
        for node, view in layers
    ]
    half_w = [view.restore(decoded_weights(view.rows, FALLBACK)) for _, view in layers]
    trials.reference = trials.run(float_w)
    plan.cosine = plan.cosine_all_quantized = trials.cosine(quant_w)
    if plan.cosine >= goal:
        return plan
    scores = []
    for i in range(len(layers)):
        mixed = list(half_w)
        mixed[i] = quant_w[i]
        scores.append((trials.cosine(mixed), i))
    order = [i for _, i in sorted(scores)]

    def mix(k: int) -> list[np.ndarray]:
        keep = set(order[:k])
        return [half_w[i] if i in keep else quant_w[i] for i in range(len(layers))]

    lo, hi = 1, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        if trials.cosine(mix(mid)) >= goal:
            hi = mid
        else:
            lo = mid + 1
    k = lo
    cos = trials.cosine(mix(k))
    while cos < goal and k < len(order):
        k += 1
        cos = trials.cosine(mix(k))
    plan.cosine = cos
    for i in sorted(order[:k]):
        node = layers[i][0]
        plan.storage[node.id] = FALLBACK
        plan.kept.append(node.name or node.output_names[0])
    log.info(
        "MNN %s weights: %d of %d layers keep fp16 (cosine %.6f -> %.6f, target %.4f)",
        options.weights,
        k,
        len(layers),
        plan.cosine_all_quantized,
        cos,
        target,
    )
    return plan
