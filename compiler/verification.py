"""Verification: compare every artifact with the source model's reference run.

Per output we record max abs and relative error, cosine similarity and SQNR against the reference
runtime (onnxruntime), and each one's distance from the exact result: the float64 interpreter on
the unoptimized import (:func:`exact_outputs`). An artifact passes when every output meets its
:class:`Tolerance`. An fp32 output passes when it is within 1e-4 (max rel) of onnxruntime, or when
its own distance from exact is at most ``max(4 * onnxruntime's distance from exact, 1e-5)``: on a
deep model onnxruntime is itself far from exact, and an artifact may round differently without
being worse.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.graph import Graph
from compiler.metrics import agreement

__all__ = [
    "Tolerance",
    "OutputCheck",
    "ArtifactCheck",
    "ExactReference",
    "compare_outputs",
    "exact_outputs",
    "estimate_flops",
    "TOLERANCES",
    "EXACT_MAX_GFLOP",
    "format_table",
]

log = logging.getLogger(__name__)

# Past this size the float64 oracle is skipped (noted in the manifest). Measured: 0.05-0.3 s for the
# shared models (0.03-1.4 GFLOP), 0.3-1.3 s for ResNet-18, ViT-Tiny, MobileViT-XS, VGG-11 (2-15 GFLOP).
EXACT_MAX_GFLOP = 20.0


@dataclass(frozen=True)
class Tolerance:
    """Pass criteria: max_rel = max|a-e| / max(1, max|e|), a cosine floor and an SQNR floor (dB).

    With ``exact_factor``, an output that misses ``max_rel`` still passes when its distance from
    the exact result is at most ``max(exact_factor * reference's distance, exact_floor)`` and its
    cosine against exact is as close as the reference's, by the same factor:
    ``1 - cos(artifact, exact) <= max(exact_factor * (1 - cos(reference, exact)), 1 - min_cosine)``
    (an ill-conditioned output, e.g. boxes after NMS on random weights, is far from exact in
    onnxruntime too; the floors are then judged against exact, not against onnxruntime).
    """

    max_rel: float
    min_cosine: float = 0.0
    min_sqnr_db: float = float("-inf")
    exact_factor: float | None = None
    exact_floor: float = 1e-5

    def accepts(self, max_rel: float, cosine: float, sqnr_db: float = float("inf")) -> bool:
        """True if the measured errors (against the reference runtime) are within bounds."""
        return bool(max_rel <= self.max_rel and cosine >= self.min_cosine and sqnr_db >= self.min_sqnr_db)

    def exact_bound(self, ref_exact: float | None) -> float | None:
        """The largest distance from exact accepted, given the reference's (None: no such rule)."""
        if self.exact_factor is None or ref_exact is None or not np.isfinite(ref_exact):
            return None
        return max(self.exact_factor * ref_exact, self.exact_floor)

    def accepts_with_exact(
        self,
        max_rel: float,
        cosine: float,
        sqnr_db: float,
        exact: float | None,
        ref_exact: float | None,
        cos_exact: tuple[float, float] | None = None,
    ) -> bool:
        """:meth:`accepts`, or the artifact is within :meth:`exact_bound` and its cosine against
        exact is within the factor of the reference's (``cos_exact`` = (artifact's, reference's));
        without ``cos_exact`` the cosine floor applies against the reference runtime."""
        if self.accepts(max_rel, cosine, sqnr_db):
            return True
        bound = self.exact_bound(ref_exact)
        if bound is None or exact is None or exact > bound or sqnr_db < self.min_sqnr_db:
            return False
        if cos_exact is None or self.exact_factor is None:
            return bool(cosine >= self.min_cosine)
        mine, ref = cos_exact
        return bool(1.0 - mine <= max(self.exact_factor * (1.0 - ref), 1.0 - self.min_cosine))


# fp32 artifacts must be numerically equal up to reassociation. Reduced precision is judged on the
# whole tensor (cosine, SQNR), not its single worst element: one fp16 rounding can flip a pixel that
# sits on a sigmoid's steep slope while the output as a whole keeps 40 dB. int8 only guards against
# a broken artifact here; the quantization report and --min-sqnr carry the accuracy target.
TOLERANCES: dict[str, Tolerance] = {
    # max_rel carries fp32; the cosine floor only catches a wrong tensor whose values are all tiny
    # (sigmoid tails near 1e-7 differ relatively between exp implementations: ORT's is approximate).
    # or: within 4x onnxruntime's own distance from the float64 result (1e-5 at least).
    "fp32": Tolerance(max_rel=1e-4, min_cosine=0.999, exact_factor=4.0, exact_floor=1e-5),
    # fp32 weights and maths with an approximate activation kernel (MNN's tanh-form UnaryOp GELU,
    # 4.7e-4 from the erf GELU per element, MnnOptions(gelu="mnn")): within 1e-3 of the reference.
    "fp32-approx": Tolerance(max_rel=1e-3, min_cosine=0.999),
    "fp16": Tolerance(max_rel=float("inf"), min_cosine=0.999, min_sqnr_db=30.0),
    "int8": Tolerance(max_rel=float("inf"), min_cosine=0.9),
    # Weight-only int8/int4 (MNN's IDSTQuan: weights decoded to float at load, fp32 maths).
    "int8w": Tolerance(max_rel=float("inf"), min_cosine=0.999),
    "int4w": Tolerance(max_rel=float("inf"), min_cosine=0.98),
}


@dataclass
class OutputCheck:
    """Agreement of one output."""

    name: str
    max_abs: float
    max_rel: float
    cosine: float
    sqnr_db: float
    passed: bool
    exact: float | None = None  # max rel distance of the artifact from the float64 result
    ref_exact: float | None = None  # ... and of the reference runtime

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (rounded, finite)."""

        def num(x: float) -> float:
            return float(f"{x:.6g}") if np.isfinite(x) else (999.0 if x > 0 else -999.0)

        out: dict[str, Any] = {
            "name": self.name,
            "max_abs": num(self.max_abs),
            "max_rel": num(self.max_rel),
            "cosine": num(self.cosine),
            "sqnr_db": num(self.sqnr_db),
            "passed": self.passed,
        }
        if self.exact is not None and self.ref_exact is not None:
            out.update(max_rel_vs_exact=num(self.exact), reference_max_rel_vs_exact=num(self.ref_exact))
        return out


@dataclass
class ArtifactCheck:
    """Verification of one artifact."""

    kind: str
    path: str
    precision: str
    tolerance: Tolerance
    outputs: list[OutputCheck] = field(default_factory=list)
    runtime: str | None = None  # the evaluation judged, when not the artifact runtime's default

    @property
    def passed(self) -> bool:
        """True if every output passed."""
        return all(o.passed for o in self.outputs)

    def failures(self) -> list[str]:
        """Names of outputs that missed the tolerance."""
        return [o.name for o in self.outputs if not o.passed]

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "kind": self.kind,
            "path": self.path,
            "precision": self.precision,
            "tolerance": {
                "max_rel": self.tolerance.max_rel if np.isfinite(self.tolerance.max_rel) else None,
                "min_cosine": self.tolerance.min_cosine,
                "min_sqnr_db": self.tolerance.min_sqnr_db
                if np.isfinite(self.tolerance.min_sqnr_db)
                else None,
                **(
                    {"exact_factor": self.tolerance.exact_factor, "exact_floor": self.tolerance.exact_floor}
                    if self.tolerance.exact_factor is not None
                    else {}
                ),
            },
            "passed": self.passed,
            **({"runtime": self.runtime} if self.runtime else {}),
            "outputs": [o.as_dict() for o in self.outputs],
        }


@dataclass(frozen=True)
class ExactReference:
    """The exact outputs (float64 interpreter on the unoptimized import), or why there are none."""

    outputs: dict[str, np.ndarray] | None
    gflop: float
    why_not: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The manifest's record of the oracle."""
        d: dict[str, Any] = {"reference": "float64 interpreter (unoptimized import)"}
        d.update(gflop=round(self.gflop, 3), available=self.outputs is not None)
        if self.why_not:
            d["why_not"] = self.why_not
        return d


def estimate_flops(graph: Graph) -> float:
    """2 x the multiply-accumulates of every Conv, ConvTranspose, MatMul and Gemm whose shapes are known."""
    macs = 0
    for node in graph.ops():
        if node.domain or node.op not in ("Conv", "ConvTranspose", "MatMul", "Gemm"):
            continue
        types = [None if v is None else v.type for v in graph.inputs_of(node)[:2]] + [node.output_types[0]]
        if any(t is None or not t.is_static for t in types):
            continue
        x, w, y = (t.static_shape for t in types if t is not None)
        if node.op == "Conv":
            macs += int(np.prod(y)) * int(np.prod(w[1:]))
        elif node.op == "ConvTranspose":
            macs += int(np.prod(x)) * int(np.prod(w[1:]))
        elif node.op == "Gemm":
            macs += int(np.prod(y)) * int(x[0] if node.attrs.transA else x[-1])
        else:
            macs += int(np.prod(y)) * int(x[-1] if len(x) else 1)
    return 2.0 * macs


def exact_outputs(
    graph: Graph, feeds: Mapping[str, np.ndarray], max_gflop: float = EXACT_MAX_GFLOP
) -> ExactReference:
    """Run the (unoptimized) graph in the interpreter in float64; None outputs with a reason when the
    model is larger than ``max_gflop`` or an op's reference cannot run in float64."""
    from compiler.ir.interpreter import run_graph

    gflop = estimate_flops(graph) / 1e9
    if gflop > max_gflop:
        return ExactReference(None, gflop, f"{gflop:.1f} GFLOP is more than the oracle's {max_gflop:g} GFLOP")
    start = time.perf_counter()
    try:
        outs = run_graph(graph, feeds, float64=True)
    except Exception as exc:  # noqa: BLE001 - any failing reference only means "no oracle"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("no exact oracle: %s", first)
        return ExactReference(None, gflop, f"the float64 interpreter failed: {first}")
    log.info("exact oracle: %.2f GFLOP in %.2f s", gflop, time.perf_counter() - start)
    return ExactReference(outs, gflop)


def compare_outputs(
    actual: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    tol: Tolerance,
    exact: Mapping[str, np.ndarray] | None = None,
    alternates: Sequence[Mapping[str, np.ndarray]] = (),
) -> list[OutputCheck]:
    """Compare outputs by name; a missing or misshapen output fails.

    With ``exact`` each output also records its distance and the reference's from the exact
    result, and ``tol``'s rule relative to exact applies. ``alternates`` are other valid float32
    evaluations by the reference runtime (e.g. onnxruntime with its graph optimizations on): the
    reference's distance from exact is then the largest of theirs, so a model that amplifies
    float32 rounding is judged by how far the runtime itself strays (its cosine: the lowest).
    """
    checks = []
    for name, ref in expected.items():
        got = actual.get(name)
        if got is None or np.shape(got) != np.shape(ref):
            checks.append(OutputCheck(name, float("inf"), float("inf"), 0.0, float("-inf"), False))
            continue
        m = agreement(got, ref)
        e = None if exact is None else exact.get(name)
        err, ref_err, cos_exact = None, None, None
        if e is not None:
            mine = agreement(got, e)
            peers = [ref, *(a[name] for a in alternates if name in a and np.shape(a[name]) == np.shape(ref))]
            theirs = [agreement(p, e) for p in peers]
            ref_err = max(t.max_rel for t in theirs)
            err, cos_exact = mine.max_rel, (mine.cosine, min(t.cosine for t in theirs))
        ok = tol.accepts_with_exact(m.max_rel, m.cosine, m.sqnr_db, err, ref_err, cos_exact)
        checks.append(OutputCheck(name, m.max_abs, m.max_rel, m.cosine, m.sqnr_db, ok, err, ref_err))
    return checks


def format_table(checks: list[ArtifactCheck], reference: str = "onnxruntime") -> str:
    """A fixed-width verification table for the terminal.

    ``max_rel`` is against the reference runtime; ``vs_exact`` and ``ref_exact`` are the artifact's and
    the reference's distances (max rel) from the float64 result ('-' when there is no exact oracle).
    """

    def g(x: float | None) -> str:
        return f"{'-':>10}" if x is None else f"{x:10.3g}"

    head = (
        f"{'artifact':<24} {'output':<28} {'max_abs':>10} {'max_rel':>10} {'vs_exact':>10} {'ref_exact':>10} "
        f"{'cosine':>10} {'sqnr_db':>8}  ok"
    )
    lines = [head, "-" * len(head)]
    for c in checks:
        for o in c.outputs:
            sq = f"{o.sqnr_db:8.1f}" if np.isfinite(o.sqnr_db) else f"{'inf':>8}"
            lines.append(
                f"{c.path:<24.24} {o.name:<28.28} {o.max_abs:10.3g} {o.max_rel:10.3g} {g(o.exact)} "
                f"{g(o.ref_exact)} {o.cosine:10.6f} {sq}  " + ("yes" if o.passed else "NO")
            )
    lines.append(f"max_rel: vs {reference}; vs_exact / ref_exact: the artifact / {reference} vs float64")
    return "\n".join(lines)
