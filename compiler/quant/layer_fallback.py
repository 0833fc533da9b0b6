"""Which layers must keep a finer weight storage so that the model's outputs hold a cosine floor.

Shared by the weight plans that trade accuracy per layer: MNN's weight storage
(:mod:`backends.mnn.precision`: int8/int4 -> fp16 -> fp32) and weight-only quantization
(:mod:`passes.quantize_weights`: int4 -> int8 -> float). Both measure the same way: a copy of
the graph whose planned weights are graph inputs runs in onnxruntime (single-threaded, so the
plan is the same on every run) on the compile's samples, one session for every trial, and a
trial's score is the worst output cosine over the outputs and samples against the weights of the
last tier (the float reference).

With ``tiers`` = t_0 (coarsest), ..., t_m (the reference), each a weight per layer:

1. every layer at t_0; done when that reaches the goal;
2. else, with three tiers or more, when every layer at t_1 misses the goal, the same search runs
   on (t_1, ..., t_m) first: the fewest layers that must sit above t_1 are raised;
3. then, over the remaining layers, each is scored alone (it at t_0, the others at t_1) and the
   k worst are raised to t_1, k the smallest count that reaches the goal (binary search, then a
   linear check upward in case the effect is not monotonic).

The goal is the floor raised by :data:`MARGIN` of its distance to 1, so a runtime's own float
arithmetic cannot tip a borderline plan below the floor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.errors import KilnError
from compiler.ir.graph import Graph, Node
from compiler.ir.types import TensorType
from compiler.metrics import agreement

__all__ = ["MARGIN", "goal_of", "WeightTrials", "TieredFallback", "fewest_raised", "tiered_fallback"]

MARGIN = 0.1


def goal_of(floor: float) -> float:
    """floor + MARGIN · (1 - floor): the cosine a plan aims at to keep ``floor``."""
    return floor + MARGIN * (1.0 - floor)


class WeightTrials:
    """One onnxruntime session over a copy of ``graph`` whose weights at ``slots`` are graph inputs.

    ``slots``: (node, input port, the weight's type) per planned layer; ``samples``: the feeds
    the trials run on (each a full set of graph inputs); ``what``: the plan, named in the error
    raised when onnxruntime is missing.
    """

    def __init__(
        self,
        graph: Graph,
        slots: Sequence[tuple[Node, int, TensorType]],
        samples: Sequence[Mapping[str, np.ndarray]],
        what: str,
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise KilnError(f"{what} needs onnxruntime to measure its trials") from None
        from compiler.onnx_export import export_onnx, model_bytes

        probe = graph.clone()
        self.names: list[str] = []
        for node, port, ttype in slots:
            n = probe.node(node.id)
            old = probe.inputs_of(n)[port]
            assert old is not None
            name = probe.unique_name(f"__kiln_weight_{node.id}")
            probe.set_input(n, port, probe.add_input(name, ttype))
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
        self.samples = [{k: np.asarray(v) for k, v in s.items() if k in wanted} for s in samples]
        self.reference: list[list[np.ndarray]] = []
        self.runs = 0

    def run(self, weights: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
        """The outputs with these weights (in slot order), per sample."""
        out = []
        for sample in self.samples:
            feeds = dict(sample)
            feeds.update(zip(self.names, weights, strict=True))
            out.append([np.asarray(o) for o in self.session.run(None, feeds)])
        self.runs += 1
        return out

    def cosine(self, weights: Sequence[np.ndarray]) -> float:
        """The worst output cosine, over outputs and samples, against :attr:`reference`."""
        got = self.run(weights)
        return min(
            agreement(o, r).cosine
            for outs, refs in zip(got, self.reference, strict=True)
            for o, r in zip(outs, refs, strict=True)
        )


def fewest_raised(
    trials: WeightTrials,
    low: Sequence[np.ndarray],
    high: Sequence[np.ndarray],
    among: Sequence[int],
    goal: float,
) -> tuple[list[int], float, dict[int, float]]:
    """The fewest layers of ``among`` to take from ``high`` (the rest from ``low``) that reach ``goal``.

    Layers outside ``among`` take ``low``. Each layer of ``among`` is scored alone (it low, the
    others high); the k worst are raised, k found by binary search and then checked upward.
    Returns (raised layers, sorted; the cosine they reach; each scored layer's cosine alone).
    """
    scores = []
    members = set(among)
    for i in among:
        mixed = [high[j] if j in members else low[j] for j in range(len(low))]
        mixed[i] = low[i]
        scores.append((trials.cosine(mixed), i))
    order = [i for _, i in sorted(scores)]

    def mix(k: int) -> list[np.ndarray]:
        keep = set(order[:k])
        return [high[i] if i in keep else low[i] for i in range(len(low))]

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
    return sorted(order[:k]), cos, {i: c for c, i in scores}


@dataclass
class TieredFallback:
    """What :func:`tiered_fallback` found: ``raised[t]`` the layers raised to tier t + 1, the worst
    cosine with every layer at tier 0 and as planned, and each scored layer's cosine alone."""

    raised: list[list[int]]
    cosine_all_low: float
    cosine: float
    alone: dict[int, float] = field(default_factory=dict)

    def tier_of(self, layer: int) -> int:
        """The tier ``layer`` is planned at (0: the coarsest)."""
        return next((t + 1 for t, ids in enumerate(self.raised) if layer in ids), 0)


def tiered_fallback(
    trials: WeightTrials,
    tiers: Sequence[Sequence[np.ndarray]],
    goal: float,
    cosine_low: float | None = None,
) -> TieredFallback:
    """The plan of the module docstring over ``tiers`` (coarsest first, at least two).

    ``trials.reference`` must be set (usually the outputs at the last tier); ``cosine_low``: the
    cosine of every layer at tier 0 when already measured.
    """
    assert len(tiers) >= 2
    low = [list(t) for t in tiers]
    n = len(low[0])
    cos_all = trials.cosine(low[0]) if cosine_low is None else cosine_low
    plan = TieredFallback([[] for _ in tiers[1:]], cos_all, cos_all)
    if cos_all >= goal or n == 0:
        return plan
    if len(tiers) > 2:
        cos_mid = trials.cosine(low[1])
        if cos_mid < goal:
            upper = tiered_fallback(trials, tiers[1:], goal, cos_mid)
            plan.alone.update(upper.alone)
            for t, ids in enumerate(upper.raised):
                for i in ids:
                    for below in range(t + 2):
                        low[below][i] = tiers[t + 2][i]
                    plan.raised[t + 1].append(i)
    top = {i for ids in plan.raised for i in ids}
    rest = [i for i in range(n) if i not in top]
    cos = trials.cosine(low[0]) if top else cos_all
    if cos < goal and rest:
        plan.raised[0], cos, alone = fewest_raised(trials, low[0], low[1], rest, goal)
        plan.alone.update(alone)
    plan.cosine = cos
    return plan
