"""Pattern-level quantization policy: op instances kept float although their op class is int8.

The per-op policy (``OpDef.quant``, ``OpDef.qspec``) quantizes Add and Mul, which is right
between int8 convolutions. Inside some structures the same ops carry values that 8 bits cannot
hold; each :class:`QuantRule` recognises one structure from the graph alone (op types, constant
operands, data flow; never names) and keeps its elementwise ops in float:

* ``norm-chain``: the elementwise ops of a decomposed LayerNorm / RMSNorm. A *statistic* is a
  ReduceMean, or an elementwise op whose non-constant inputs are all statistics (var + eps,
  sqrt, 1/sqrt); the chain is a square feeding a statistic (d * d), an op reading a statistic
  (d / s, x * rsqrt), and the affine ops with constants that follow it (* gamma, + beta);
* ``pointwise-chain``: a pointwise function built of elementwise ops around an Erf or Tanh
  (GELU x/2 (1 + erf(x/sqrt 2)) and its tanh form): the connected elementwise region that
  holds the Erf/Tanh and reads a single non-constant value x from outside;
* ``residual-add``: a transformer block's residual Add(a, b) of two computed values, recognised by
  a normalization next to it: its output, or one of its inputs, feeds a LayerNormalization, an
  RMSNormalization or a node of a decomposed one (x - mean, x ** 2);
* ``softmax-input``: elementwise ops whose result only a Softmax reads (scores + mask, the
  scaling of q k^T), also through reshaping ops: the mask holds -inf-like values that no 8-bit
  grid represents. Not ``measured``: calibration data without padding sees a mask of zeros, and
  a measurement on it would admit an Add that clips the mask away on the first padded input.

``measured`` rules keep their nodes float by default; a measurement may still admit one to int8
where it is safe (:mod:`compiler.quant.admission`).

**Forms.** Some op classes can be int8 in more than one way; :data:`QUANT_FORMS` lists each
class's candidate forms, most int8 first, and :mod:`compiler.quant.forms` picks one per node by
measurement. The recurrent ops (LSTM, GRU, RNN), whose state stays float:

* ``int8-input``: X on its calibrated per-tensor grid and W, R int8 per gate row, so the input
  projection x_t Wᵀ of every step is an int8 GEMM (q(X) W_qᵀ over all steps at once, with float
  accumulation scaled by s_x s_w), the recurrence H Rᵀ uses dequantized R on the float state:
  LSTM(dq(q(X)), dq(W_q), dq(R_q), B). This is the hoisted int8 projection in QDQ form. Hoisting it
  into the graph instead (a MatMul over all steps feeding LSTM(X Wᵀ, I, R, B)) gives the same
  numbers, but ONNX's LSTM has no form that takes precomputed gate inputs: the identity W makes
  every step multiply by a [G*H, G*H] matrix instead of [G*H, input] (4x for lstm_text).
* ``weight-only``: W and R int8 per gate row, X and the state float: LSTM(X, dq(W_q), dq(R_q), B).

The first form whose measured cost fits the admission budget wins (int8 costs nothing
measurable); else the form with the best measured SQNR. Without a measurement the last
(most conservative) form is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compiler.ir.graph import Graph, Node, Value

__all__ = [
    "QuantRule",
    "QUANT_RULES",
    "quant_rule",
    "float_by_rule",
    "rule_named",
    "ELEMENTWISE",
    "QuantForm",
    "QUANT_FORMS",
    "quant_forms",
    "keeps_last_axis",
]

ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Erf", "Tanh"})
_AFFINE = frozenset({"Add", "Sub", "Mul", "Div"})
_NORM_OPS = frozenset({"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"})
_STAT_ROOTS = frozenset({"ReduceMean", "ReduceSumSquare", "ReduceL2"})
_REGION_CAP = 16  # nodes in a pointwise region; larger elementwise regions are not one activation


@dataclass(frozen=True)
class QuantRule:
    """One structural rule: ``find(graph)`` gives the ids of the nodes it keeps float, and why."""

    name: str
    reason: str
    find: Callable[[Graph], set[int]]
    measured: bool = True

    def why(self) -> str:
        """The manifest's reason for a node this rule kept float."""
        return f"{self.reason} (policy: {self.name})"


QUANT_RULES: list[QuantRule] = []


def quant_rule(
    name: str, reason: str, *, measured: bool = True
) -> Callable[..., Callable[[Graph], set[int]]]:
    """Register ``find`` as the rule ``name``."""

    def deco(find: Callable[[Graph], set[int]]) -> Callable[[Graph], set[int]]:
        if any(r.name == name for r in QUANT_RULES):
            raise ValueError(f"quantization rule {name!r} registered twice")
        QUANT_RULES.append(QuantRule(name, reason, find, measured))
        return find

    return deco


def float_by_rule(graph: Graph) -> dict[int, QuantRule]:
    """Node id -> the first rule (registration order) that keeps it float."""
    out: dict[int, QuantRule] = {}
    for rule in QUANT_RULES:
        for nid in sorted(rule.find(graph)):
            out.setdefault(nid, rule)
    return out


def rule_named(name: str) -> QuantRule:
    """The registered rule ``name``."""
    for rule in QUANT_RULES:
        if rule.name == name:
            return rule
    raise KeyError(f"no quantization rule {name!r}")


@dataclass(frozen=True)
class QuantForm:
    """One int8 form of an op class: ``weight_only`` leaves the input activations float."""

    name: str
    weight_only: bool
    doc: str


INT8_INPUT = QuantForm("int8-input", False, "input GEMM int8 (X and W), R int8, float state")
WEIGHT_ONLY = QuantForm("weight-only", True, "W and R int8, X and state float")
QUANT_FORMS: dict[str, tuple[QuantForm, ...]] = {
    op: (INT8_INPUT, WEIGHT_ONLY) for op in ("LSTM", "GRU", "RNN")
}


def quant_forms(node: Node) -> tuple[QuantForm, ...]:
    """The candidate int8 forms of ``node``'s op class, most int8 first (() for a single form)."""
    return () if node.domain else QUANT_FORMS.get(node.op, ())


_SAME_LAST = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


def keeps_last_axis(graph: Graph, node: Node) -> bool:
    """True when ``node`` moves values of its input 0 without mixing its last axis: every out[..., j]
    is some in[..., j] (a per-channel scale along the last axis passes through it unchanged).

    A reshape keeping the last dim (row-major: the flat index mod K is j), a Transpose keeping the
    last axis last, a Gather along another axis.
    """
    if node.domain or node.num_outputs != 1:
        return False
    x = graph.inputs_of(node)[0] if node.num_inputs else None
    xs, ys = (x.type.shape if x is not None else None), node.output_types[0].shape
    if x is None or not xs or not ys or not isinstance(xs[-1], int) or xs[-1] != ys[-1]:
        return False
    rank = len(xs)
    if node.op in _SAME_LAST:
        return True
    if node.op == "Transpose":
        perm = node.attrs.perm
        return perm is not None and perm[-1] in (-1, rank - 1)
    if node.op == "Gather":
        return node.attrs.axis not in (-1, rank - 1)
    return False


def _computed(graph: Graph, node: Node) -> list[Value]:
    """The non-constant inputs of ``node``."""
    return [v for v in graph.inputs_of(node) if v is not None and v.const is None]


def _readers(graph: Graph, node: Node) -> list[Node]:
    return [u for v in graph.outputs_of(node) for u, _ in graph.users(v)]


def _elementwise(node: Node) -> bool:
    return not node.domain and node.op in ELEMENTWISE


def _norm_nodes(graph: Graph) -> set[int]:
    """Every node of the decomposed normalizations: statistics, the ops reading them, the squares."""
    stats: set[int] = set()
    chain: set[int] = set()
    for node in graph.ops():  # topological: statistics first, then what reads them
        ins = _computed(graph, node)
        root = not node.domain and node.op in _STAT_ROOTS
        if root or (_elementwise(node) and ins and all(v.node in stats for v in ins)):
            stats.add(node.id)  # mean, var + eps, sqrt, 1 / sqrt
        elif _elementwise(node) and any(v.node in stats for v in ins):
            chain.add(node.id)  # x - mean, d / s, x * rsqrt(s)
        elif node.op in _AFFINE and len(ins) == 1 and ins[0].node in chain:
            chain.add(node.id)  # * gamma, + beta
    for nid in [n for n in stats if graph.node(n).op in _STAT_ROOTS]:
        for v in _computed(graph, graph.node(nid)):
            sq = v.producer  # d * d, d ** 2 (or x * x, x ** 2) squared into a statistic
            if (sq.op == "Mul" and len({(i.node, i.port) for i in _computed(graph, sq)}) == 1) or (
                sq.op == "Pow" and len(_computed(graph, sq)) == 1
            ):
                chain.add(sq.id)
    return stats | chain


@quant_rule("norm-chain", "elementwise op of a decomposed LayerNorm/RMSNorm")
def _norm_chain(graph: Graph) -> set[int]:
    return {n for n in _norm_nodes(graph) if graph.node(n).op in ("Add", "Mul")}


def _region(graph: Graph, seed: Node) -> tuple[set[int], set[tuple[int, int]]] | None:
    """The connected elementwise region around ``seed`` and the outside values it reads."""
    region, todo = {seed.id}, [seed]
    while todo:
        node = todo.pop()
        near = [v.producer for v in _computed(graph, node)] + _readers(graph, node)
        for other in near:
            if other.id not in region and _elementwise(other):
                region.add(other.id)
                todo.append(other)
                if len(region) > _REGION_CAP:
                    return None
    outside = {
        (v.node, v.port) for n in region for v in _computed(graph, graph.node(n)) if v.node not in region
    }
    return region, outside


@quant_rule("pointwise-chain", "elementwise op of a GELU/Erf/Tanh pointwise chain")
def _pointwise_chain(graph: Graph) -> set[int]:
    out: set[int] = set()
    for node in graph.ops():
        if node.domain or node.op not in ("Erf", "Tanh") or node.id in out:
            continue
        found = _region(graph, node)
        if found is not None and len(found[1]) == 1:
            out |= found[0]
    return {n for n in out if graph.node(n).op in ("Add", "Mul")}


@quant_rule("residual-add", "residual Add of a normalized (transformer) block")
def _residual_add(graph: Graph) -> set[int]:
    norm = _norm_nodes(graph)

    def feeds_norm(values: Iterable[Value]) -> bool:
        return any(
            (not u.domain and u.op in _NORM_OPS) or u.id in norm for v in values for u, _ in graph.users(v)
        )

    out: set[int] = set()
    for node in graph.ops():
        if node.domain or node.op != "Add" or node.id in norm:
            continue
        ins = _computed(graph, node)
        if len(ins) == 2 and (feeds_norm(graph.outputs_of(node)) or feeds_norm(ins)):
            out.add(node.id)
    return out


@quant_rule("softmax-input", "elementwise op read only by a Softmax (scores, mask)", measured=False)
def _softmax_input(graph: Graph) -> set[int]:
    from compiler.ops.registry import QuantPolicy, get_op

    out: set[int] = set()
    for node in reversed(graph.ops()):
        carries = get_op(node.op, node.domain).quant == QuantPolicy.PASSTHROUGH
        if not carries and (node.domain or node.op not in _AFFINE):
            continue
        readers = _readers(graph, node)
        if readers and all(r.op in ("Softmax", "LogSoftmax") or r.id in out for r in readers):
            out.add(node.id)
    return {n for n in out if graph.node(n).op in ("Add", "Mul")}
