"""Per-layer sensitivity: how much quantizing one layer alone degrades the model outputs.

For evaluation samples x_1..x_S, float outputs y_o(x_s) and the outputs ŷ_o(x_s) of a
graph in which only layer L is quantized (QDQ on L's input activations, int8
weights, int32 bias and QDQ on its outputs, exactly as :func:`insert_qdq` does it
in the full model), each float output o gets

    SQNR_o = 10 log10( Σ_s Σ_i y_o,i² / Σ_s Σ_i (ŷ_o,i - y_o,i)² )      (dB)
    cos_o  = Σ_s Σ_i ŷ_o,i y_o,i / sqrt( Σ_s Σ_i ŷ_o,i² · Σ_s Σ_i y_o,i² )

with the sums accumulated over all samples (not averaged per sample). The layer's
overall score uses the same sums taken over every float output concatenated; its
``worst`` score is min_o SQNR_o, the quantity ``--min-sqnr`` constrains. Noise 0
gives +999 dB (as :mod:`compiler.metrics` does); signal 0 with noise gives -999 dB.

Speed: only the *cone* of L (L, the Q/DQ nodes added for it, and everything
downstream of L) differs from the float graph, and float evaluation is
deterministic, so each single-layer graph is cut at the cone's frontier
(:mod:`compiler.quant.cone`): values that enter the cone from outside become graph
inputs, fed from one float run that cached them. Outputs outside the cone equal the
float outputs exactly (noise 0). The result equals running the whole single-layer
graph (tests/test_quant_sensitivity.py checks it to 1e-6 dB).
Evaluation samples are the first calibration samples, in order: as many as hold
``EVAL_BUDGET`` input values (between 1 and ``MAX_EVAL_SAMPLES``; 4 for a 1x3x512x512
model, 16 for a 1x3x48x192 one), so that small models, whose outputs are few numbers
per sample (a 2-class softmax), are judged on enough of them. A caller may pass a count.

Each layer also records its int8 work c_L (:func:`layer_cost`), the compute that sending it back
to float gives up: c_L = |y| · |W| / C_out multiply-accumulates for a WEIGHTED op with weight W,
C_out the size of W's per-channel axis (|W| / C_out = K for MatMul and Gemm, C_in/g · kh · kw for
Conv), and c_L = |y| for any other op (one int8 operation per output element).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.ir.graph import Graph, Node, Value
from compiler.ops.registry import QuantPolicy, get_op
from compiler.quant.calibrate import graph_runner
from compiler.quant.cone import downstream, extract, float_outputs
from compiler.quant.params import QParams
from compiler.quant.plan import QuantPlan, node_label
from compiler.quant.qdq import insert_qdq

__all__ = [
    "Score",
    "Sums",
    "LayerSensitivity",
    "SensitivityReport",
    "compute_sensitivity",
    "quantized_graph",
    "model_scores",
    "FloatReference",
    "SQNR_CAP",
    "evaluation_samples",
    "scores_of",
    "layer_cost",
]

log = logging.getLogger(__name__)

SQNR_CAP = 999.0
EVAL_BUDGET = 3 << 20
MAX_EVAL_SAMPLES = 16
_DB_DIGITS = 4
_COS_DIGITS = 6
Sample = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Score:
    """SQNR (dB) and cosine of a quantized result against the float one."""

    sqnr_db: float
    cosine: float

    def as_json(self) -> dict[str, float]:
        """Rounded (dB to 4 decimals, cosine to 6): deterministic text."""
        return {"sqnr_db": round(self.sqnr_db, _DB_DIGITS), "cosine": round(self.cosine, _COS_DIGITS)}


def _finite64(a: np.ndarray) -> np.ndarray:
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    return x if np.isfinite(x).all() else np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


@dataclass
class Sums:
    """Running sums Σy², Σ(ŷ-y)², Σŷy, Σŷ² (float64) from which SQNR and cosine follow."""

    signal: float = 0.0
    noise: float = 0.0
    dot: float = 0.0
    power: float = 0.0

    def add(self, got: np.ndarray, ref: np.ndarray) -> None:
        """Accumulate one tensor pair (non-finite entries count as 0)."""
        q = _finite64(got)
        r = _finite64(ref)
        d = q - r
        self.signal += float(np.einsum("i,i->", r, r))
        self.noise += float(np.einsum("i,i->", d, d))
        self.dot += float(np.einsum("i,i->", q, r))
        self.power += float(np.einsum("i,i->", q, q))

    def merge(self, other: Sums) -> None:
        """Add another accumulator's sums."""
        self.signal += other.signal
        self.noise += other.noise
        self.dot += other.dot
        self.power += other.power

    def score(self) -> Score:
        """SQNR = 10 log10(signal / noise), cos = dot / sqrt(power · signal)."""
        if self.noise <= 0.0:
            sqnr = SQNR_CAP
        elif self.signal <= 0.0:
            sqnr = -SQNR_CAP
        else:
            sqnr = max(-SQNR_CAP, min(SQNR_CAP, 10.0 * math.log10(self.signal / self.noise)))
        norm = math.sqrt(self.power * self.signal)
        cos = 1.0 if norm == 0.0 and self.noise <= 0.0 else (self.dot / norm if norm > 0.0 else 0.0)
        return Score(sqnr, cos)


@dataclass(frozen=True)
class LayerSensitivity:
    """One layer quantized alone: overall score, worst output SQNR, and per-output scores."""

    node: int
    name: str
    op: str
    overall: Score
    outputs: dict[str, Score]
    cost: int = 1

    @property
    def worst_sqnr(self) -> float:
        """min over outputs of SQNR_o."""
        return min((s.sqnr_db for s in self.outputs.values()), default=SQNR_CAP)

    def as_json(self) -> dict[str, object]:
        """Manifest form."""
        return {
            "op": self.op,
            **self.overall.as_json(),
            "worst_output_sqnr_db": round(self.worst_sqnr, _DB_DIGITS),
            "outputs": {k: s.as_json() for k, s in self.outputs.items()},
            "int8_ops": self.cost,
        }


def layer_cost(graph: Graph, node: Node) -> int:
    """c_L of the module docstring (1 per output element when a shape is not static)."""
    y = node.output_types[0]
    out = y.numel if y.is_static else 1
    opdef = get_op(node.op, node.domain)
    spec = opdef.qspec
    if opdef.quant is not QuantPolicy.WEIGHTED or spec is None or spec.weight is None:
        return max(1, out)
    ins = graph.inputs_of(node)
    w = ins[spec.weight] if spec.weight < len(ins) else None
    if w is None or not w.type.is_static or not w.type.static_shape:
        return max(1, out)
    shape = w.type.static_shape
    c_out = shape[spec.weight_axis(node.attrs, len(shape))]
    return max(1, out * (w.type.numel // max(1, c_out)))


@dataclass
class SensitivityReport:
    """Every planned layer's sensitivity (plan order) and the full int8 model's per-output scores.

    ``reference`` keeps the float outputs of the evaluation samples for later measurements
    (mixed precision); its cache of intermediate values is dropped.
    """

    layers: list[LayerSensitivity] = field(default_factory=list)
    full_model: dict[str, Score] = field(default_factory=dict)
    samples: int = 0
    reference: FloatReference | None = field(default=None, repr=False)

    def layers_json(self) -> dict[str, dict[str, object]]:
        """Per-layer scores by layer name, in plan order."""
        return {lay.name: lay.as_json() for lay in self.layers}

    def full_json(self) -> dict[str, dict[str, float]]:
        """Full-model scores by output name."""
        return {k: s.as_json() for k, s in self.full_model.items()}


@dataclass
class FloatReference:
    """Float outputs per sample (by public name), the output names, and cached float values by name."""

    outputs: list[dict[str, np.ndarray]]
    names: list[str]
    cache: list[dict[str, np.ndarray]]

    @classmethod
    def run(cls, graph: Graph, samples: Sequence[Sample], keep: Sequence[str] = ()) -> FloatReference:
        """Run ``graph`` once per sample, keeping its float outputs and the values named ``keep``."""
        outs = float_outputs(graph)
        inputs = {v.name for v in graph.inputs}
        kept = [n for n in keep if n not in inputs]
        run = graph_runner(graph, list(dict.fromkeys([v.name for v, _ in outs] + kept)))
        ref = cls([], [pub for _, pub in outs], [])
        for feeds in samples:
            got = run(feeds)
            ref.outputs.append({pub: got[v.name] for v, pub in outs})
            ref.cache.append({n: got[n] for n in kept})
        return ref


def evaluation_samples(samples: Sequence[Sample], count: int | None = None) -> list[Sample]:
    """The first ``count`` samples; by default as many as hold ``EVAL_BUDGET`` input values (1..16)."""
    if count is None:
        per = sum(int(np.asarray(a).size) for a in samples[0].values()) if samples else 1
        count = max(1, min(MAX_EVAL_SAMPLES, EVAL_BUDGET // max(per, 1)))
    return list(samples[:count])


def quantized_graph(
    float_graph: Graph,
    plan: QuantPlan,
    nodes: Sequence[int],
    params: Mapping[str, QParams],
    per_channel: bool,
    biases: Mapping[int, np.ndarray] | None = None,
) -> Graph:
    """A fresh clone of ``float_graph`` in QDQ form for ``nodes`` only (a subset of ``plan.nodes``).

    ``biases`` (node id -> corrected float bias, from bias correction) replace the biases
    of the quantized nodes before their QDQ insertion.
    """
    from compiler.quant.bias_correction import apply_bias_corrections

    g = float_graph.clone()
    wanted = set(nodes)
    sub = dataclasses.replace(plan, nodes=[n for n in plan.nodes if n in wanted])
    if biases:
        apply_bias_corrections(g, biases, sub.nodes)
    insert_qdq(g, sub, params, per_channel=per_channel)
    return g


def model_scores(graph: Graph, samples: Sequence[Sample], ref: FloatReference) -> dict[str, Sums]:
    """Run ``graph`` (e.g. a QDQ model) on the samples; sums per float output against ``ref``."""
    outs = float_outputs(graph)
    run = graph_runner(graph, list(dict.fromkeys(v.name for v, _ in outs)))
    sums = {pub: Sums() for _, pub in outs}
    for feeds, want in zip(samples, ref.outputs, strict=True):
        got = run(feeds)
        for v, pub in outs:
            sums[pub].add(got[v.name], want[pub])
    return sums


def scores_of(sums: Mapping[str, Sums]) -> tuple[Score, dict[str, Score]]:
    """(overall score over all outputs concatenated, per-output scores)."""
    total = Sums()
    for s in sums.values():
        total.merge(s)
    return total.score(), {k: s.score() for k, s in sums.items()}


def _layer_graph(
    float_graph: Graph,
    order: Sequence[Node],
    node_id: int,
    plan: QuantPlan,
    params: Mapping[str, QParams],
    per_channel: bool,
    biases: Mapping[int, np.ndarray] | None,
) -> tuple[Graph, list[str], list[tuple[Value, str]]]:
    """The cone of one layer with only that layer in QDQ form, the cached inputs it needs, its outputs."""
    from compiler.quant.bias_correction import apply_bias_corrections

    sub, ids, fed, n_out = extract(float_graph, order, downstream(float_graph, [node_id]), node_id)
    new_id = ids[node_id]
    if biases and node_id in biases:
        apply_bias_corrections(sub, {new_id: biases[node_id]}, [new_id])
    carried = [ids[n] for n in plan.carried if n in ids]
    weight_only = frozenset(ids[n] for n in plan.weight_only if n in ids)
    one = dataclasses.replace(plan, nodes=[new_id], carried=carried, weight_only=weight_only)
    insert_qdq(sub, one, params, per_channel=per_channel)
    outs = list(zip(sub.outputs, sub.output_names, strict=True))[:n_out]
    return sub, fed, outs


def compute_sensitivity(
    float_graph: Graph,
    plan: QuantPlan,
    params: Mapping[str, QParams],
    samples: Sequence[Sample],
    *,
    per_channel: bool = True,
    quantized: Graph | None = None,
    biases: Mapping[int, np.ndarray] | None = None,
    progress: bool = False,
) -> SensitivityReport:
    """Single-layer scores for every node of ``plan`` and, if given, the ``quantized`` model's scores.

    Args:
        float_graph: The float graph (reference, and the base of every single-layer graph).
        plan: The planned layers, in plan order.
        params: Activation parameters by value name.
        samples: The evaluation samples (see :func:`evaluation_samples`).
        per_channel: Per-channel weight scales, as in the full model.
        quantized: The full int8 model, for its per-output scores.
        biases: Corrected float biases by node id (bias correction), used by quantized layers.
        progress: Show a progress bar on stderr.
    """
    from compiler.calibration.progress import Progress

    order = float_graph.nodes()
    cuts = [_layer_graph(float_graph, order, nid, plan, params, per_channel, biases) for nid in plan.nodes]
    ref = FloatReference.run(float_graph, samples, sorted({n for _, fed, _ in cuts for n in fed}))
    report = SensitivityReport(samples=len(samples))
    taken: set[str] = set()
    with Progress(len(cuts), "sensitivity", enabled=progress) as bar:
        for nid, (sub, fed, outs) in zip(plan.nodes, cuts, strict=True):
            sums = {pub: Sums() for pub in ref.names}
            inside = {pub for _, pub in outs}
            for want in ref.outputs:  # outputs outside the cone are the float ones: noise 0
                for pub in ref.names:
                    if pub not in inside:
                        sums[pub].add(want[pub], want[pub])
            if outs:
                run = graph_runner(sub, list(dict.fromkeys(v.name for v, _ in outs)))
                for s, feeds in enumerate(samples):
                    got = run({**feeds, **{n: ref.cache[s][n] for n in fed}})
                    for v, pub in outs:
                        sums[pub].add(got[v.name], ref.outputs[s][pub])
            overall, per_output = scores_of(sums)
            node = float_graph.node(nid)
            name = node_label(node)
            name = name if name not in taken else f"{name}#{nid}"  # source names need not be unique
            taken.add(name)
            cost = layer_cost(float_graph, node)
            report.layers.append(LayerSensitivity(nid, name, node.qualified_op, overall, per_output, cost))
            bar.step()
    ref.cache = [{} for _ in ref.cache]
    report.reference = ref
    if quantized is not None:
        report.full_model = scores_of(model_scores(quantized, samples, ref))[1]
    return report
