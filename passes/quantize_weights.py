"""quantize-weights: weight-only int4/int8 block quantization of MatMul/Gemm weights and embeddings.

A MatMul(A, B) with a constant 2-D B [K, N] and a canonical Gemm(A, B, C) (transA = 0,
alpha = beta = 1, see normalize-gemm; B [K, N], or [N, K] with transB) with W = Bᵀ [N, K] become

    kiln::WeightOnlyMatMul(A, Q, s[, z][, bias]) = A @ Ŵᵀ + bias,
    Ŵ[n, k] = (Q[n, k] - z[n, k // bs]) · s[n, k // bs] ≈ W[n, k],   bias = C (N values) or none,

on the grid of :mod:`compiler.quant.weight_only` (``bits`` 4|8, ``block_size`` 32|64|128 weights
of a row per scale, fp16|fp32 scales, symmetric or with zero points). The levels Q are the nearest
rounding of W, or with ``rounding=gptq`` (``auto``: whenever the compile carries ``--calib``) the
GPTQ levels on the same grid that minimise ||(W - Ŵ) Xᵀ||²_F over the calibration inputs X of the
layer (K above :data:`~compiler.quant.weight_only.MAX_GPTQ_COLUMNS` keeps nearest rounding).

When K is not a multiple of ``block_size`` the last block of each row is shorter (onnxruntime's
MatMulNBits pads it in the file; MNN repeats scales over blocks of gcd(K, block_size)). It does not
fire, with the reason as a near-miss, when: B is not a constant or not 2-D float32, A is not
float32 of rank >= 2, K < block_size (less than one block), a Gemm is not canonical or its C is
not a constant per-column bias, fp16 scales would overflow, or the node matches ``--keep-float``.

Embeddings (``gathers``): a Gather(T, indices, axis=0) of a constant float32 table T [V, D] of at
least :data:`GATHER_MIN_WEIGHTS` weights becomes kiln::WeightOnlyGather(Q, indices, s[, z]) =
Gather(T̂, indices), T̂ = (Q - z) · s per block of D on the same grid (nearest rounding: a table
has no inputs to measure a Hessian on); 4-bit tables need an even D.

Output floor (``min_cosine``; default the verification floor of the precision, int4w 0.98, int8w
0.999; 0: off): before rewriting, the rounding is measured on the compile's samples and, where every
layer at ``bits`` misses the floor, the most sensitive layers keep int8 levels (under int4) or stay
float (:mod:`compiler.quant.weight_only_plan`); each such layer carries its reason in the record.
Idempotent: the rewritten nodes are no MatMul/Gemm. What it did is left in
``ctx.state["quantize-weights"]`` for the manifest.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import OptionError
from compiler.ir.graph import Graph, Node, Value
from compiler.ir.types import DType
from compiler.ops.fused import KILN
from compiler.ops.weight_only import WEIGHT_ONLY_BITS, WeightOnlyMatMulAttrs, dequantize_levels, level_range
from compiler.ops.weight_only_gather import WeightOnlyGatherAttrs
from compiler.pass_infra import Pass, PassContext, register_pass
from compiler.pattern import Any_, Match, NearMiss, Op, Rule, apply_rules, match
from compiler.quant.plan import keep_float_match, node_label
from compiler.quant.weight_only import (
    MAX_GPTQ_COLUMNS,
    BlockGrid,
    block_grid,
    gptq_block_levels,
    linear_hessians,
    nearest_levels,
)
from compiler.quant.weight_only_plan import PlanLayer, default_floor, plan_samples, plan_weight_only
from compiler.rewriter import PassResult, Rewriter
from passes.normalize_gemm import canonical_gemm_reason

__all__ = ["QuantizeWeights", "BLOCK_SIZES", "SCALE_TYPES", "ROUNDINGS", "GATHER_MIN_WEIGHTS"]

log = logging.getLogger(__name__)

BLOCK_SIZES = (32, 64, 128)
SCALE_TYPES = ("fp16", "fp32")
ROUNDINGS = ("auto", "nearest", "gptq")
GATHER_MIN_WEIGHTS = 16384
"""Smallest Gather table quantized (64 KiB of float32): a token or position embedding, not a lookup."""
_F16_MAX = 65504.0


@dataclass
class _Setup:
    """What every rule of one run shares: the options, the Hessians and what was done."""

    bits: int
    block_size: int
    scale_dtype: str
    symmetric: bool
    keep_float: tuple[str, ...]
    hessians: dict[int, np.ndarray] = field(default_factory=dict)
    done: list[dict[str, Any]] = field(default_factory=list)
    levels: dict[tuple[int, int], tuple[BlockGrid, np.ndarray]] = field(default_factory=dict)
    fallback_bits: dict[int, int | None] = field(default_factory=dict)  # node id -> 8, or None: float
    fallback_reasons: dict[int, str] = field(default_factory=dict)


def _float32_reason(m: Match, name: str) -> str | None:
    v = m.value(name)
    return None if v.type.dtype == DType.FLOAT32 else f"{name.upper()} is {v.type.dtype.short}, not float32"


class _WeightOnly(Rule):
    """Shared check and rewrite; subclasses give the pattern and W [N, K] (and the bias)."""

    weight_port = 1  # the input holding the weight (B)
    gptq = True  # whether GPTQ applies (a linear layer with inputs A to measure H on)

    def __init__(self, setup: _Setup) -> None:
        self.s = setup

    def weight(self, m: Match) -> tuple[np.ndarray, np.ndarray | None]:
        """W [N, K] (float32) and the bias [N] (or None) of a checked match."""
        raise NotImplementedError

    def own_reason(self, m: Match) -> str | None:
        """The op's own refusals (Gemm form, bias)."""
        return None

    def as_b(self, m: Match, w: np.ndarray) -> np.ndarray:
        """W [N, K] in the layout of input B (the inverse of :meth:`weight`)."""
        return np.ascontiguousarray(w.T)

    def quantized(self, m: Match, bits: int) -> tuple[BlockGrid, np.ndarray]:
        """The grid and levels of the layer at ``bits`` (GPTQ with a Hessian), computed once."""
        key = (m.root.id, bits)
        if key not in self.s.levels:
            w, _ = self.weight(m)
            grid = block_grid(w, bits, self.s.block_size, self.s.symmetric, self.s.scale_dtype)
            h = self.s.hessians.get(m.root.id)
            self.s.levels[key] = (
                grid,
                nearest_levels(w, grid) if h is None else gptq_block_levels(w, h, grid),
            )
        return self.s.levels[key]

    def decoded(self, m: Match, bits: int) -> np.ndarray:
        """B as the layer computes with it at ``bits``: dequantize(levels) in B's layout."""
        grid, q = self.quantized(m, bits)
        return self.as_b(m, dequantize_levels(q, grid.scales, grid.zero_points, grid.block_size))

    def operand_reason(self, m: Match) -> str | None:
        """Why the operands do not fit (MatMul/Gemm: B a 2-D float32 constant, A float32 of rank >= 2)."""
        a, b = m.value("a"), m.value("b")
        if b.const is None:
            return "B is not a constant"
        if b.const.ndim != 2:
            return f"B is {b.const.ndim}-D, not 2-D"
        for reason in (_float32_reason(m, "a"), _float32_reason(m, "b"), self.own_reason(m)):
            if reason is not None:
                return reason
        if a.type.rank is None or a.type.rank < 2:
            return "A must have rank >= 2"
        return None

    def check(self, graph: Graph, m: Match) -> str | None:
        node = m.root
        if (pat := keep_float_match(node, self.s.keep_float)) is not None:
            return f"kept float (--keep-float {pat})"
        if node.id in self.s.fallback_bits and self.s.fallback_bits[node.id] is None:
            return f"kept float ({self.s.fallback_reasons[node.id]})"
        if (reason := self.operand_reason(m)) is not None:
            return reason
        w, _ = self.weight(m)
        k = w.shape[1]
        if k < self.s.block_size:
            return f"K={k} is less than one block ({self.s.block_size})"
        if self.s.scale_dtype == "fp16":
            qmin, qmax = level_range(self.s.bits)
            span = np.abs(w).max() / qmax if self.s.symmetric else np.ptp(np.append(w, 0.0)) / (qmax - qmin)
            if not np.isfinite(span) or span > _F16_MAX:
                return f"fp16 scales would overflow (scale {span:.3g} > {_F16_MAX:g}); use scale_dtype=fp32"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        node = m.root
        w, bias = self.weight(m)
        bits = self.s.fallback_bits.get(node.id) or self.s.bits
        grid, q = self.quantized(m, bits)
        h = self.s.hessians.get(node.id)
        base = node.output_names[0]
        store = np.float16 if self.s.scale_dtype == "fp16" else np.float32
        grid_values = [
            rw.const(q, f"{base}_levels"),
            rw.const(grid.scales.astype(store), f"{base}_scales"),
            None if grid.zero_points is None else rw.const(grid.zero_points, f"{base}_zero_points"),
        ]
        record = _record(node, w, grid, np.dtype(store).itemsize, h is not None)
        if node.id in self.s.fallback_reasons:
            record["fallback"] = self.s.fallback_reasons[node.id]
        self.s.done.append(record)
        y = self.build(rw, m, grid_values, bits, None if bias is None else rw.const(bias, f"{base}_bias"))
        rw.replace(rw.graph.value(node), y, take_name=True)

    def build(self, rw: Rewriter, m: Match, grid: list[Value | None], bits: int, bias: Value | None) -> Value:
        """The weight-only node: kiln::WeightOnlyMatMul(A, levels, scales[, zero points][, bias])."""
        ins = [m.value("a"), *grid, bias]
        while ins[-1] is None:
            ins.pop()
        attrs = WeightOnlyMatMulAttrs(bits=bits, block_size=self.s.block_size)
        return rw.op("WeightOnlyMatMul", ins, attrs, domain=KILN, like=m.root)


def _record(node: Node, w: np.ndarray, grid: BlockGrid, scale_size: int, gptq: bool) -> dict[str, Any]:
    """One rewritten layer for the manifest: its shape, rounding and bytes (float vs levels + grid)."""
    n, k = w.shape
    scale_bytes = grid.scales.size * scale_size
    z_bytes = 0 if grid.zero_points is None else -(-grid.zero_points.size * grid.bits // 8)
    return {
        "node": node_label(node),
        "op": node.op,
        "shape": [n, k],
        "bits": grid.bits,
        "rounding": "gptq" if gptq else "nearest",
        "float_bytes": 4 * n * k,
        "quantized_bytes": -(-n * k * grid.bits // 8) + scale_bytes + z_bytes,
    }


class _MatMulRule(_WeightOnly):
    """MatMul(A, B), B [K, N] constant: W = Bᵀ."""

    name = "weight-only-matmul"
    pattern = Op("MatMul", (Any_("a"), Any_("b")))

    def weight(self, m: Match) -> tuple[np.ndarray, np.ndarray | None]:
        b = m.value("b").const
        assert b is not None
        return np.ascontiguousarray(b.T, np.float32), None


class _GemmRule(_WeightOnly):
    """Gemm(A, B, C) canonical: W = B (transB) or Bᵀ, bias = C broadcast to N."""

    name = "weight-only-gemm"
    pattern = Op("Gemm", (Any_("a"), Any_("b"), Any_("c", optional=True)))

    def own_reason(self, m: Match) -> str | None:
        if (reason := canonical_gemm_reason(m.root)) is not None:
            return reason
        c = m.values.get("c")
        if c is None:
            return None
        n = m.root.output_types[0].shape[-1] if m.root.output_types[0].shape else None
        if c.const is None:
            return "C is not a constant"
        if c.const.dtype != np.float32 or not (
            c.const.size == 1 or (c.const.size == n and c.const.shape[-1] == n)
        ):
            return f"C {list(c.const.shape)} is not a float32 per-column bias of N={n} values"
        return None

    def weight(self, m: Match) -> tuple[np.ndarray, np.ndarray | None]:
        b = m.value("b").const
        assert b is not None
        w = np.ascontiguousarray(b if m.root.attrs.transB else b.T, np.float32)
        c = m.values.get("c")
        if c is None or c.const is None:
            return w, None
        return w, np.ascontiguousarray(np.broadcast_to(c.const.reshape(-1), (w.shape[0],)), np.float32)

    def as_b(self, m: Match, w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w if m.root.attrs.transB else w.T)


class _GatherRule(_WeightOnly):
    """Gather(T, indices, axis=0), T [V, D] a constant table of >= GATHER_MIN_WEIGHTS: W = T (rows
    V, blocks along D), kiln::WeightOnlyGather(levels, indices, scales[, zero points])."""

    name = "weight-only-gather"
    pattern = Op("Gather", (Any_("b"), Any_("a")))
    weight_port = 0
    gptq = False

    def operand_reason(self, m: Match) -> str | None:
        t = m.value("b").const
        if t is None:
            return "the table is not a constant"
        if t.ndim != 2 or t.dtype != np.float32:
            return f"the table is {t.dtype}{list(t.shape)}, not a 2-D float32 constant"
        if m.root.attrs.axis not in (0, -2):
            return f"axis={m.root.attrs.axis}: only row lookups (axis 0) are quantized"
        if t.size < GATHER_MIN_WEIGHTS:
            return f"the table has {t.size} weights (< {GATHER_MIN_WEIGHTS}: not worth a quantized table)"
        if self.s.bits == 4 and t.shape[1] % 2:
            return f"D={t.shape[1]} is odd (4-bit tables pack two levels per byte)"
        return None

    def weight(self, m: Match) -> tuple[np.ndarray, np.ndarray | None]:
        t = m.value("b").const
        assert t is not None
        return np.ascontiguousarray(t, np.float32), None

    def as_b(self, m: Match, w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w)

    def build(self, rw: Rewriter, m: Match, grid: list[Value | None], bits: int, bias: Value | None) -> Value:
        """kiln::WeightOnlyGather(levels, indices, scales[, zero points])."""
        levels, scales, zero = grid
        ins = [levels, m.value("a"), scales, zero]
        if ins[-1] is None:
            ins.pop()
        attrs = WeightOnlyGatherAttrs(bits=bits, block_size=self.s.block_size)
        return rw.op("WeightOnlyGather", ins, attrs, domain=KILN, like=m.root)


@register_pass
@dataclass(frozen=True)
class QuantizeWeights(Pass):
    """Weight-only int4/int8 (block scales) of MatMul/Gemm weights and embedding tables, with a floor."""

    name = "quantize-weights"
    bits: int = 4
    block_size: int = 32
    scale_dtype: str = "fp16"
    symmetric: bool = True
    rounding: str = "auto"
    min_cosine: float = -1.0  # the output floor; -1: the verification floor of ``bits``, 0: off
    gathers: bool = True  # also constant Gather tables (token embeddings) of >= GATHER_MIN_WEIGHTS

    def __post_init__(self) -> None:
        if self.min_cosine != -1.0 and not 0.0 <= self.min_cosine <= 1.0:
            raise OptionError(
                f"quantize-weights: min_cosine must be in [0, 1] (or -1), got {self.min_cosine}"
            )
        if self.bits not in WEIGHT_ONLY_BITS:
            raise OptionError(f"quantize-weights: bits must be 4 or 8, got {self.bits}")
        if self.block_size not in BLOCK_SIZES:
            raise OptionError(
                f"quantize-weights: block_size must be one of {BLOCK_SIZES}, got {self.block_size}"
            )
        if self.scale_dtype not in SCALE_TYPES:
            raise OptionError(f"quantize-weights: scale_dtype must be fp16 or fp32, got {self.scale_dtype!r}")
        if self.rounding not in ROUNDINGS:
            raise OptionError(f"quantize-weights: rounding must be one of {ROUNDINGS}, got {self.rounding!r}")

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        q = getattr(ctx.options, "quant", None)
        setup = _Setup(
            self.bits, self.block_size, self.scale_dtype, self.symmetric, tuple(getattr(q, "keep_float", ()))
        )
        rules: list[_WeightOnly] = [_MatMulRule(setup), _GemmRule(setup)]
        if self.gathers:
            rules.append(_GatherRule(setup))
        calib = getattr(q, "calib", None)
        if self.rounding == "gptq" and calib is None:
            raise OptionError("quantize-weights{rounding=gptq} needs calibration data (--calib)")
        candidates = _candidates(graph, rules)
        if self.rounding != "nearest" and calib is not None:
            setup.hessians = _hessians(graph, candidates, q)
        floor = default_floor(self.bits) if self.min_cosine == -1.0 else self.min_cosine
        fallback: dict[str, Any] | None = None
        if floor > 0.0 and candidates:
            layers = [
                PlanLayer(m.root, rule.weight_port, _b_const(m), functools.partial(rule.decoded, m))
                for rule, m in candidates
            ]
            samples, source = plan_samples(graph, ctx.options)
            plan = plan_weight_only(graph, layers, self.bits, floor, samples, source)
            setup.fallback_bits, setup.fallback_reasons = plan.bits, plan.reasons
            fallback = plan.record
        misses: list[NearMiss] = []
        result = apply_rules(graph, rules, near_misses=misses)
        ctx.near_misses.extend(misses)
        ctx.state[self.name] = self.report(setup, misses)
        if fallback is not None:
            ctx.state[self.name]["fallback"] = fallback
        log.info("quantize-weights: %d layers, %d kept float", len(setup.done), len(misses))
        return result

    def report(self, setup: _Setup, misses: list[NearMiss]) -> dict[str, Any]:
        """The manifest's record: options, each rewritten layer and why others stay float."""
        return {
            "bits": self.bits,
            "block_size": self.block_size,
            "scale_dtype": self.scale_dtype,
            "symmetric": self.symmetric,
            "rounding": "gptq" if any(d["rounding"] == "gptq" for d in setup.done) else "nearest",
            "layers": setup.done,
            "kept_float": [{"node": mi.node, "reason": mi.reason} for mi in misses],
            "float_bytes": sum(d["float_bytes"] for d in setup.done),
            "quantized_bytes": sum(d["quantized_bytes"] for d in setup.done),
        }


def _b_const(m: Match) -> np.ndarray:
    b = m.value("b").const
    assert b is not None
    return b


def _candidates(graph: Graph, rules: list[_WeightOnly]) -> list[tuple[_WeightOnly, Match]]:
    """The matches the rules will rewrite (their checks pass), in graph order."""
    out = []
    for node in graph.ops():
        for rule in rules:
            if node.op not in rule.pattern.op_names():
                continue
            m = match(graph, rule.pattern, node)
            if isinstance(m, Match) and rule.check(graph, m) is None:
                out.append((rule, m))
                break
    return out


def _hessians(graph: Graph, candidates: list[tuple[_WeightOnly, Match]], q: Any) -> dict[int, np.ndarray]:
    """H per node the rules will rewrite (K within MAX_GPTQ_COLUMNS), over the calibration samples."""
    from compiler.calibration.dataset import open_calibration

    nodes = [m.root for rule, m in candidates if rule.gptq and rule.weight(m)[0].shape[1] <= MAX_GPTQ_COLUMNS]
    samples = open_calibration(q.calib, graph.input_types(), count=q.calib_count, preprocess=q.preprocess)
    return linear_hessians(graph, nodes, samples)
