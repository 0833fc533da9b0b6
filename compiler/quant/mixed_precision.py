"""Automatic mixed precision (``--min-sqnr DB``): send layers back to float until the outputs meet DB.

The target is on the worst output, min_o SQNR_o, measured on the evaluation samples
against the float graph (see :mod:`compiler.quant.sensitivity`). Quantization noise adds up
over the layers: with o* the worst output of the all-int8 model and SQNR_L the SQNR of o* with
layer L alone in int8, the noise-to-signal of o* is close to N = sum_L n_L, n_L = 10^(-SQNR_L/10)
(convit_tiny: sum_L n_L = 1.24e-3 against N = 1.27e-3 measured; maxvit_pico, whose neighbouring
layers share grids so that a shared rounding counts twice, 4.8e-2 against 2.5e-2). Sending a set
F back to float removes about sum_F n_L at the int8 work sum_F c_L it gives up (c_L: its int8 ops,
:func:`compiler.quant.sensitivity.layer_cost`), so the layers L_1, L_2, ... are ranked by noise
removed per int8 op, n_L / c_L, highest first (the greedy order of that knapsack; ties by
single-layer SQNR, then overall SQNR, then plan order): a bias Add or a squeeze-excite Mul
that holds as much noise as a MatMul but does 1/K of its work goes first. Two groups come
apart from that order, with B = 10^(-aim/10) the noise the target leaves: a layer with
n_L > B misses the target on its own, so it goes back in every solution and leads; a layer
with n_L < NEGLIGIBLE * B removes too little to matter and trails. That order reaches the target
in many small steps, each measured on the evaluation samples, and so fits them more tightly than
the single-layer order, whose big steps overshoot (ppocr cls, 16 samples of a 2-class softmax:
33.9 dB on them, 26.3 on hold-out data, against >= 30 for the single-layer order); it is used
only with hold-out samples (``--inputs``), which every m(k) is also measured on. Without them
the layers go most sensitive first (lowest worst-output SQNR alone; ties by overall SQNR, then
plan order). m(k) is the worst-output SQNR of the model with L_1..L_k in float and every other
planned layer in int8.

1. **Search.** Measuring m(k) for k = 1, 2, 3, ... costs one full-model evaluation per
   layer; m is close to monotone (each fallback removes noise sources), so the search
   gallops (k = 1, 2, 4, 8, ...) to the first k_hi with m(k_hi) >= DB and bisects
   (k_lo, k_hi] for the smallest k that meets DB: O(log k) evaluations instead of O(k).
   Every accepted k is one that was measured to meet DB, so non-monotonicity can only
   cost extra fallbacks, never a missed target.
   A final pass that re-quantizes fallbacks one by one while the target still holds was
   tried and dropped: with a handful of evaluation samples it fits them too tightly (on
   yunet it kept a layer whose int8 output cost a hold-out output 20 dB).

With ``holdout`` samples (``--inputs``), m(k) is the lower of the worst-output SQNRs measured on
the evaluation samples and on the hold-out samples, each set scored on its own.

The search aims at DB + MARGIN_DB on the evaluation (calibration) samples: with 4 to 16
samples the measured SQNR is optimistic on unseen data (ppocr: 31.2 dB on the calibration
samples was 26.9 dB on the hold-out set), and the margin buys that gap back.

m(k) for k = all planned layers is the float graph itself (noise 0, +999 dB), so a finite
target is always reached; :class:`KilnError` is raised only if even that measurement
misses it (which would mean the float graph is not deterministic).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.errors import KilnError
from compiler.ir.graph import Graph
from compiler.quant.params import QParams
from compiler.quant.plan import QuantPlan
from compiler.quant.sensitivity import (
    FloatReference,
    LayerSensitivity,
    Score,
    SensitivityReport,
    model_scores,
    quantized_graph,
    scores_of,
)

__all__ = ["FallbackResult", "choose_fallback", "fallback_order", "sensitivity_order", "MARGIN_DB"]

MARGIN_DB = 2.0
NEGLIGIBLE = 1e-3
ORDER_SENSITIVE = "most sensitive first"
ORDER_PER_OP = "most noise removed per int8 op first"

log = logging.getLogger(__name__)


@dataclass
class FallbackResult:
    """Which planned layers went back to float, and the scores before and after."""

    target_db: float
    float_nodes: list[int] = field(default_factory=list)
    float_layers: list[str] = field(default_factory=list)
    before: dict[str, Score] = field(default_factory=dict)
    after: dict[str, Score] = field(default_factory=dict)
    evaluations: int = 0
    holdout_before: dict[str, Score] = field(default_factory=dict)
    holdout_after: dict[str, Score] = field(default_factory=dict)
    order: str = ORDER_SENSITIVE

    @property
    def worst_db(self) -> float:
        """min_o SQNR_o of the final model (the lower of the evaluation and hold-out sets)."""
        return min(_worst(self.after), _worst(self.holdout_after))

    @property
    def worst_before_db(self) -> float:
        """min_o SQNR_o of the all-int8 model (both sets)."""
        return min(_worst(self.before), _worst(self.holdout_before))

    def as_json(self) -> dict[str, object]:
        """Manifest form."""
        doc: dict[str, object] = {
            "min_sqnr_db": self.target_db,
            "float_layers": list(self.float_layers),
            "worst_output_sqnr_db": round(self.worst_db, 4),
            "outputs": {k: s.as_json() for k, s in self.after.items()},
            "evaluations": self.evaluations,
            "order": self.order,
        }
        if self.holdout_after:
            doc["inputs_outputs"] = {k: s.as_json() for k, s in self.holdout_after.items()}
        return doc


def sensitivity_order(report: SensitivityReport) -> list[int]:
    """Planned node ids, most sensitive first (worst-output SQNR, then overall SQNR, then plan order)."""
    pos = {lay.node: i for i, lay in enumerate(report.layers)}
    ranked = sorted(report.layers, key=lambda lay: (lay.worst_sqnr, lay.overall.sqnr_db, pos[lay.node]))
    return [lay.node for lay in ranked]


def fallback_order(report: SensitivityReport, output: str | None = None, budget: float = 0.0) -> list[int]:
    """Planned node ids in the cost-aware order of the module doc: the layers that alone exceed the
    noise budget B (n_L > B), then those with n_L >= NEGLIGIBLE * B, then the rest, each group by
    noise removed per int8 op, n_L / c_L, highest first.

    ``output``: o*, the output whose noise n_L measures (default: each layer's worst output);
    ``budget``: B = 10^(-aim/10), the noise the target leaves (0: one group).
    """
    pos = {lay.node: i for i, lay in enumerate(report.layers)}

    def key(lay: LayerSensitivity) -> tuple[int, float, float, float, int]:
        db = lay.outputs[output].sqnr_db if output in lay.outputs else lay.worst_sqnr
        n = 10.0 ** (-db / 10.0)
        group = 0 if n > budget else (1 if n >= NEGLIGIBLE * budget else 2)
        return (group, -n / lay.cost, lay.worst_sqnr, lay.overall.sqnr_db, pos[lay.node])

    return [lay.node for lay in sorted(report.layers, key=key)]


def _worst(scores: Mapping[str, Score]) -> float:
    return min((s.sqnr_db for s in scores.values()), default=float("inf"))


def choose_fallback(
    float_graph: Graph,
    plan: QuantPlan,
    params: Mapping[str, QParams],
    samples: Sequence[Mapping[str, np.ndarray]],
    report: SensitivityReport,
    target_db: float,
    *,
    per_channel: bool = True,
    biases: Mapping[int, np.ndarray] | None = None,
    holdout: Sequence[Mapping[str, np.ndarray]] = (),
    search: bool = True,
) -> FallbackResult:
    """Pick the layers to keep in float so that every output reaches ``target_db`` (see module doc).

    ``search=False`` only measures the all-int8 model (``--strict`` fails rather than falls back).
    """
    ref = report.reference if report.reference is not None else FloatReference.run(float_graph, samples)
    hold_ref = FloatReference.run(float_graph, holdout) if holdout else None
    result = FallbackResult(target_db)
    cache: dict[frozenset[int], tuple[dict[str, Score], dict[str, Score]]] = {}

    def measure(floated: frozenset[int]) -> tuple[dict[str, Score], dict[str, Score]]:
        if floated not in cache:
            known = dict(report.full_model) if not floated else {}  # the all-int8 model: measured
            if known and hold_ref is None:
                cache[floated] = known, {}
                return cache[floated]
            keep = [n for n in plan.nodes if n not in floated]
            q = quantized_graph(float_graph, plan, keep, params, per_channel, biases)
            scores = known or scores_of(model_scores(q, samples, ref))[1]
            held = scores_of(model_scores(q, holdout, hold_ref))[1] if hold_ref is not None else {}
            cache[floated] = scores, held
            result.evaluations += 1
        return cache[floated]

    def worst(floated: frozenset[int]) -> float:
        scores, held = measure(floated)
        return min(_worst(scores), _worst(held))

    result.before, result.holdout_before = measure(frozenset())
    aim = target_db + MARGIN_DB
    if worst(frozenset()) >= aim or not search:
        result.after, result.holdout_after = result.before, result.holdout_before
        return result
    if hold_ref is not None:  # many small steps: checked on samples the ranking did not see
        both = {**result.before}
        for name, score in result.holdout_before.items():
            both[name] = min(both.get(name, score), score, key=lambda s: s.sqnr_db)
        o_star = min(both, key=lambda n: both[n].sqnr_db) if both else None
        order = fallback_order(report, o_star, 10.0 ** (-aim / 10.0))
        result.order = ORDER_PER_OP
    else:
        order = sensitivity_order(report)
    k = _search(lambda n: worst(frozenset(order[:n])) >= aim, len(order))
    if k is None:
        raise KilnError(
            f"--min-sqnr {target_db:g}: the model misses it even with every quantized layer in float "
            f"(worst output {worst(frozenset(order)):.2f} dB)"
        )
    ranked = order[:k]
    names = {lay.node: lay.name for lay in report.layers}
    result.float_nodes = ranked
    result.float_layers = [names[n] for n in ranked]
    result.after, result.holdout_after = measure(frozenset(ranked))
    log.info(
        "--min-sqnr %g: %d layer(s) back to float, worst output %.2f dB (%d evaluations)",
        target_db,
        len(ranked),
        result.worst_db,
        result.evaluations,
    )
    return result


def _search(meets: Callable[[int], bool], n: int) -> int | None:
    """Smallest k in 1..n with meets(k) under a monotone model: gallop, then bisect; None if n fails."""
    if n < 1:
        return None
    lo, hi = 0, 1
    while not meets(hi):
        if hi == n:
            return None
        lo, hi = hi, min(2 * hi, n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi
