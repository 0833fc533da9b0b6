"""Entropy's output check: a KL-clipped activation range is kept only where no output pays for it.

The KL search (:mod:`compiler.calibration.entropy`) judges each tensor by its own histogram. A
clipped tail can still carry an output's signal: a detector's objectness map is a few face
values among thousands of near-zero ones, and the backbone values behind those faces are in the
tails the search cuts. So ``entropy`` checks every clipped range against the tensor's full range
``[min x, max x]`` (minmax's) by the *measured* output error on the evaluation samples
``x_1..x_S`` (the first calibration samples, as many as the sensitivity analysis takes: 1 to 16
by input size; never other data). With ``y_o`` the
float model's output ``o`` and, for a QDQ model ``Q``, the per-sample noise

    N_o,s(Q) = sum_i (Q(x_s)_o,i - y_o,i)^2,     N_o^A(Q) = sum_{s in A} N_o,s(Q)

a model ``Q`` *does not lower* ``o`` against ``Q_0`` iff ``N_o^A(Q) <= (1 + EPS) N_o^A(Q_0)``
for ``A`` = all samples and for every ``A`` = all samples but one (no single calibration sample
decides). ``Q_0`` is the plan in QDQ form with every activation on its full range.

1. **Alone.** For each tensor ``t`` whose clipped range differs, ``Q_t`` is ``Q_0`` with ``t``
   clipped; ``t`` is a candidate iff ``Q_t`` lowers no output. Only the cone of ``t`` runs: the
   nodes reading or producing a value whose grid changes (after grid sharing), and everything
   downstream (:mod:`compiler.quant.cone`), put in QDQ form like the whole model and fed with
   ``Q_0``'s values (after their Q/DQ where ``Q_0``'s readers see them so); outputs outside the
   cone are ``Q_0``'s exactly. A clip that changes no grid (a consumer's grid is shared back
   onto the tensor) changes nothing and is kept.
2. **Together.** ``Q_A`` clips every candidate. While ``Q_A`` lowers some outputs ``W``, the
   candidate reaching ``W`` with the least gain ``sum_{o in W} 10 log10(N_o(Q_0) / N_o(Q_t))``
   (ties: the later in plan order) goes back to its full range.

So on the calibration samples no output of the entropy model is worse than with the full ranges,
and each clip that stays is one that the outputs it reaches gain from (or do not see). ``EPS``
absorbs float summation order only. The check holds one run's cone inputs per evaluation sample
(at most 16): its memory does not grow with the calibration set beyond them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.ir.graph import Graph, Value
from compiler.ir.types import DType
from compiler.quant.calibrate import graph_runner
from compiler.quant.cone import downstream, extract, float_outputs
from compiler.quant.params import QParams
from compiler.quant.plan import QuantPlan
from compiler.quant.qdq import activation_params, insert_qdq, share_grids
from compiler.quant.sensitivity import FloatReference, Sums, evaluation_samples, quantized_graph

__all__ = ["ClipCheck", "check_clipped_ranges", "EPS"]

EPS = 1e-6  # relative noise slack: summation order, not quantization
Range = tuple[float, float]
Sample = Mapping[str, np.ndarray]
Noise = dict[str, np.ndarray]  # output -> per-sample N_o,s


@dataclass
class ClipCheck:
    """The checked ranges and why each clipped range was kept or put back to full range.

    Attributes:
        ranges: Per value: the clipped range where it was kept, else the full range.
        kept: Values whose clipped range stays (plan order), ``no_effect`` among them.
        no_effect: Kept clipped values whose clip changes no grid of the model.
        full: Values put back to their full range, with the reason.
        samples: Evaluation samples measured.
    """

    ranges: dict[str, Range]
    kept: list[str] = field(default_factory=list)
    no_effect: list[str] = field(default_factory=list)
    full: dict[str, str] = field(default_factory=dict)
    samples: int = 0

    def as_json(self) -> dict[str, object]:
        """Manifest form: counts, the kept clips, and each full-range value with its reason."""
        return {
            "evaluation_samples": self.samples,
            "clipped_kept": len(self.kept),
            "clipped_without_effect": len(self.no_effect),
            "full_range": len(self.full),
            "kept": list(self.kept),
            "full_range_why": dict(self.full),
        }


def _same(a: QParams | None, b: QParams | None) -> bool:
    if a is None or b is None:
        return a is b
    return (
        a.dtype == b.dtype
        and a.axis == b.axis
        and np.array_equal(a.scale, b.scale)
        and np.array_equal(a.zero_point, b.zero_point)
    )


def _gain_db(base: np.ndarray, noise: np.ndarray) -> float:
    """``10 log10(sum base / sum noise)``: the SQNR gain (dB) of ``noise`` over ``base``."""
    b, n = float(base.sum()), float(noise.sum())
    if b == n:
        return 0.0
    return math.inf if n <= 0.0 else (-math.inf if b <= 0.0 else 10.0 * math.log10(b / n))


def _lowers(noise: np.ndarray, base: np.ndarray) -> bool:
    """Whether ``noise`` is above ``base`` on all samples, or on all samples but any one."""
    total, total0 = noise.sum(), base.sum()
    if total > total0 * (1.0 + EPS):
        return True
    return noise.size > 1 and bool(np.any(total - noise > (total0 - base) * (1.0 + EPS)))


def _lowered(noise: Noise, base: Noise) -> list[str]:
    return [o for o, n in noise.items() if n is not base[o] and _lowers(n, base[o])]


@dataclass
class _Cone:
    """One clip's cone in QDQ form: the graph, its fed inputs and its ``(value, output)`` pairs."""

    graph: Graph
    fed: list[str]
    outs: list[tuple[Value, str]]


class _Models:
    """``Q(clip)``: every activation on its full range except those in ``clip``; whole or as a cone."""

    def __init__(
        self,
        fg: Graph,
        plan: QuantPlan,
        full: Mapping[str, Range],
        dtype: DType,
        symmetric: bool,
        per_channel: bool,
    ) -> None:
        self.fg, self.plan, self.full = fg, plan, dict(full)
        self.dtype, self.symmetric, self.per_channel = dtype, symmetric, per_channel
        self.order = fg.nodes()
        self.values = {v.name: v for n in self.order for v in fg.outputs_of(n)}
        self.planned = set(plan.nodes) | set(plan.carried)
        self.input_nodes = {v.node for v in fg.inputs}
        self.grids0 = self.grids({})

    def params(self, clip: Mapping[str, Range]) -> dict[str, QParams]:
        """Activation parameters with ``clip`` applied."""
        return activation_params(self.fg, {**self.full, **clip}, self.dtype, symmetric=self.symmetric)

    def grids(self, clip: Mapping[str, Range]) -> dict[str, QParams]:
        """The parameters in force after grid sharing."""
        return share_grids(self.fg, self.plan, self.params(clip))

    def whole(self, clip: Mapping[str, Range]) -> Graph:
        """The whole model in QDQ form."""
        return quantized_graph(self.fg, self.plan, self.plan.nodes, self.params(clip), self.per_channel)

    def cone(self, clip: Mapping[str, Range], *, build: bool = True) -> _Cone | None:
        """The part of ``Q(clip)`` that differs from ``Q_0`` (None: nothing differs).

        Planned Kiln-domain ops stay as they are (the QDQ insertion quantizes them), other
        Kiln-domain ops are expanded (as the exporter would). ``build=False``: no QDQ form.
        """
        grids = self.grids(clip)
        changed = [n for n, p in grids.items() if not _same(p, self.grids0.get(n))]
        roots: set[int] = set()
        for name in changed:
            v = self.values.get(name)
            if v is None:
                continue
            if v.node not in self.input_nodes:
                roots.add(v.node)
            roots.update(u.id for u, _ in self.fg.users(v))
        if not roots:
            return None
        cone = downstream(self.fg, roots)
        sub, ids, fed, n_out = extract(self.fg, self.order, cone, cone & self.planned)
        if build:
            p = self.plan
            sub_plan = dataclasses.replace(
                p,
                nodes=[ids[i] for i in p.nodes if i in ids],
                carried=[ids[i] for i in p.carried if i in ids],
                weight_only=frozenset(ids[i] for i in p.weight_only if i in ids),
                by_rule={ids[i]: r for i, r in p.by_rule.items() if i in ids},
            )
            insert_qdq(sub, sub_plan, grids, per_channel=self.per_channel)
        return _Cone(sub, fed, list(zip(sub.outputs, sub.output_names, strict=True))[:n_out])


def _dq_name(q0: Graph, values: Mapping[str, Value], name: str) -> str:
    """The value of ``Q_0`` its readers see for ``name``: its DequantizeLinear's when only a Q reads it."""
    v = values.get(name)
    users = q0.users(v) if v is not None else []
    if len(users) == 1 and users[0][0].op == "QuantizeLinear":
        dqs = [u for u, _ in q0.users(q0.value(users[0][0])) if u.op == "DequantizeLinear"]
        if dqs:
            return q0.value(dqs[0]).name
    return name


class _Measure:
    """``Q_0``'s per-sample noise, and a clip's noise measured on its cone."""

    def __init__(self, models: _Models, samples: Sequence[Sample]) -> None:
        self.models, self.samples = models, samples
        self.ref = FloatReference.run(models.fg, samples)
        self.q0 = models.whole({})
        self.q0_values = {v.name: v for n in self.q0.nodes() for v in self.q0.outputs_of(n)}
        self.feed: dict[str, str] = {}
        self.cache: list[dict[str, np.ndarray]] = []
        self.base = self.run(self.q0, [], float_outputs(self.q0))

    def run(self, g: Graph, fed: Sequence[str], outs: Sequence[tuple[Value, str]]) -> Noise:
        """Per-sample noise of the outputs ``outs`` of ``g`` (``fed`` from ``Q_0``); the rest ``Q_0``'s."""
        got_noise = {pub: np.zeros(len(self.samples)) for _, pub in outs}
        if outs:
            run = graph_runner(g, list(dict.fromkeys(v.name for v, _ in outs)))
            for s, feeds in enumerate(self.samples):
                got = run({**feeds, **{n: self.cache[s][self.feed[n]] for n in fed}})
                for v, pub in outs:
                    sums = Sums()
                    sums.add(got[v.name], self.ref.outputs[s][pub])
                    got_noise[pub][s] = sums.noise
        return {o: got_noise[o] if o in got_noise else self.base[o] for o in self.ref.names}

    def fill_cache(self, fed: set[str]) -> None:
        """Keep ``Q_0``'s values for the cones' inputs ``fed``, for every evaluation sample."""
        self.feed = {n: _dq_name(self.q0, self.q0_values, n) for n in sorted(fed)}
        keep = sorted(set(self.feed.values()))
        self.cache = FloatReference.run(self.q0, self.samples, keep).cache

    def clip(self, clip: Mapping[str, Range]) -> Noise | None:
        """The noise of ``Q(clip)`` (None: it equals ``Q_0``)."""
        c = self.models.cone(clip)
        return None if c is None else self.run(c.graph, c.fed, c.outs)


def check_clipped_ranges(
    float_graph: Graph,
    plan: QuantPlan,
    clipped: Mapping[str, Range],
    full: Mapping[str, Range],
    samples: Sequence[Sample],
    *,
    dtype: DType,
    symmetric: bool,
    per_channel: bool = True,
    count: int | None = None,
) -> ClipCheck:
    """Keep each clipped range only where it lowers no output on the calibration samples (module doc).

    Args:
        float_graph: The float graph the plan belongs to.
        plan: The int8 plan (its ``observe`` order is the order of the checks).
        clipped: The ranges to check (entropy's KL ranges), by value name.
        full: Each value's full range (its extremes).
        samples: The calibration samples; the first ``count`` of them are measured.
        dtype: Activation type; ``symmetric``: the activation quantizer is symmetric.
        per_channel: Per-channel weight scales, as in the compiled model.
        count: Evaluation samples (default: the sensitivity analysis's, 1 to 16 by input size).
    """
    names = [n for n in plan.observe if n in clipped and n in full]
    result = ClipCheck({**clipped, **{n: full[n] for n in names}})
    differ = [n for n in names if clipped[n] != full[n]]
    ev = evaluation_samples(samples, count) if len(samples) else []
    result.samples = len(ev)
    if not differ or not ev:
        result.full = dict.fromkeys(differ, "no calibration samples to check it on")
        return result
    models = _Models(float_graph, plan, {n: full[n] for n in names}, dtype, symmetric, per_channel)
    m = _Measure(models, ev)
    fed: set[str] = set()
    for n in differ:
        c = models.cone({n: clipped[n]}, build=False)
        fed.update(c.fed if c is not None else [])
    m.fill_cache(fed)
    gains: dict[str, dict[str, float]] = {}
    for n in differ:
        noise = m.clip({n: clipped[n]})
        if noise is None:
            result.no_effect.append(n)
            continue
        lowered = _lowered(noise, m.base)
        if lowered:
            o = min(lowered, key=lambda k: _gain_db(m.base[k], noise[k]))
            gain = _gain_db(m.base[o], noise[o])
            but = "" if gain < 0 else ", but lower without one of the samples"
            result.full[n] = f"clipped alone it lowers {o!r}: {gain:+.4f} dB on the samples{but}"
        else:
            gains[n] = {o: _gain_db(m.base[o], x) for o, x in noise.items() if x is not m.base[o]}
    m.cache = []
    kept = list(gains)
    while kept:
        q = models.whole({n: clipped[n] for n in kept + result.no_effect})
        lowered = _lowered(m.run(q, [], float_outputs(q)), m.base)
        if not lowered:
            break
        reach = [n for n in kept if any(o in gains[n] for o in lowered)] or kept
        drop = min(reach[::-1], key=lambda n: sum(gains[n].get(o, 0.0) for o in lowered))
        kept.remove(drop)
        result.full[drop] = f"with the other clips it lowers {', '.join(map(repr, lowered))}"
    order = {n: i for i, n in enumerate(names)}
    result.kept = sorted(kept + result.no_effect, key=order.__getitem__)
    for n in result.kept:
        result.ranges[n] = clipped[n]
    result.full = dict(sorted(result.full.items(), key=lambda kv: order[kv[0]]))
    return result
