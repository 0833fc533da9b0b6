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

fp16 weights are not always enough: a model whose outputs amplify a relative weight error
of 2^-11 (efficientvit_m0 on random weights: cosine 0.98 with every layer in fp16) then
misses the target whatever step 2 keeps. The same search runs one tier up first: when
every layer in fp16 misses the target, the fewest layers that must stay fp32 (the others
fp16) are found the same way, and step 2 then runs over the remaining layers.

With ``rounded`` (per-node int storage carrying precomputed levels, e.g. GPTQ's from
:mod:`backends.mnn.gptq_weights`) the trials decode those levels instead of rounding the
float weights to nearest, and the plan's storage keeps them for the layers left quantized.

The target is ``MnnOptions.target_cosine`` raised by 10% of its distance to 1, so MNN's
own float arithmetic cannot tip a borderline plan below it. The trials and the search are
:mod:`compiler.quant.layer_fallback`'s (shared with weight-only quantization): onnxruntime,
single-threaded so the plan (and the file) is the same on every run, on one exported model
whose planned weights are graph inputs, one session for every trial.
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
from compiler.ir.graph import Graph, Node
from compiler.ir.types import TensorType
from compiler.quant.layer_fallback import MARGIN, WeightTrials, goal_of, tiered_fallback

__all__ = ["WeightPlan", "plan_weights", "weight_layers", "layer_count", "MARGIN"]

log = logging.getLogger(__name__)

FALLBACK = WeightStorage("fp16")
FLOAT = WeightStorage("fp32")


@dataclass
class WeightPlan:
    """Per-node storage overrides and what the plan measured."""

    storage: dict[int, WeightStorage] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)  # layers with fp16 weights
    kept_fp32: list[str] = field(default_factory=list)  # layers with fp32 weights
    cosine_all_quantized: float = 1.0
    cosine: float = 1.0
    layers: int = 0


def weight_layers(graph: Graph) -> list[tuple[Node, WeightView]]:
    """Nodes whose weights MNN stores compressed, with their weight views (graph order).

    A node with several weight inputs (an LSTM's W and R) appears once per view; its views share
    the node's storage, so the plan keeps the node in fp16 when any of them needs it.
    """
    out = []
    for node in graph.ops():
        weight = WEIGHT_VIEWS.get(node.qualified_op)
        if weight is None:
            continue
        views = weight(graph, node)
        for view in views if isinstance(views, tuple) else [views]:
            if view is not None:
                out.append((node, view))
    return out


def layer_count(layers: list[tuple[Node, WeightView]]) -> int:
    """The number of distinct nodes among weight layers."""
    return len({node.id for node, _ in layers})


def _name(node: Node) -> str:
    return node.name or node.output_names[0]


def plan_weights(
    graph: Graph,
    options: MnnOptions,
    feeds: Mapping[str, np.ndarray],
    rounded: Mapping[int, WeightStorage] | None = None,
) -> WeightPlan:
    """The weight plan for ``graph`` under ``options`` (empty unless int8/int4 with a target).

    ``rounded``: int storage per node id with precomputed levels; the plan measures and keeps
    them (``plan.storage`` then holds every layer's storage, fp16/fp32 for the fallback layers).
    """
    default = WeightStorage.of(options)
    target = options.target_cosine
    layers = weight_layers(graph)
    chosen = dict(rounded or {})
    plan = WeightPlan(storage=dict(chosen), layers=layer_count(layers))
    if default.bits is None or target <= 0.0 or not layers:
        return plan
    goal = goal_of(target)
    slots = [(node, view.port, TensorType.of(view.restore(view.rows))) for node, view in layers]
    trials = WeightTrials(graph, slots, [feeds], "planning int8/int4 MNN weights (or --mnn-min-cosine 0)")
    float_w = [view.restore(view.rows) for _, view in layers]
    quant_w = [
        view.restore(
            decoded_weights(view.rows, chosen.get(node.id, default), view.block_elems(options.block_size))
        )
        for node, view in layers
    ]
    half_w = [view.restore(decoded_weights(view.rows, FALLBACK)) for _, view in layers]
    trials.reference = trials.run(float_w)
    found = tiered_fallback(trials, [quant_w, half_w, float_w], goal)
    plan.cosine_all_quantized, plan.cosine = found.cosine_all_low, found.cosine
    if found.cosine_all_low >= goal:
        return plan
    fp16, fp32 = found.raised
    cos = found.cosine
    # per node, the most precise storage any of its views needs (fp32 over fp16), in graph order
    kept = {layers[i][0].id: FALLBACK for i in fp16} | {layers[i][0].id: FLOAT for i in fp32}
    for node in {node.id: node for node, _ in layers}.values():
        storage = kept.get(node.id)
        if storage is not None:
            plan.storage[node.id] = storage
            (plan.kept_fp32 if storage is FLOAT else plan.kept).append(_name(node))
    log.info(
        "MNN %s weights: %d of %d layers keep fp16, %d fp32 (cosine %.6f -> %.6f, target %.4f)",
        options.weights,
        len(plan.kept),
        plan.layers,
        len(plan.kept_fp32),
        plan.cosine_all_quantized,
        cos,
        target,
    )
    return plan
