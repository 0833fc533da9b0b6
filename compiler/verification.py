"""Verification: compare every artifact with the source model's reference run.

Per output we record max abs and relative error, cosine similarity and SQNR.
An artifact passes when every output meets its :class:`Tolerance`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.metrics import agreement

__all__ = ["Tolerance", "OutputCheck", "ArtifactCheck", "compare_outputs", "TOLERANCES", "format_table"]


@dataclass(frozen=True)
class Tolerance:
    """Pass criteria: max_rel = max|a-e| / max(1, max|e|), a cosine floor and an SQNR floor (dB)."""

    max_rel: float
    min_cosine: float = 0.0
    min_sqnr_db: float = float("-inf")

    def accepts(self, max_rel: float, cosine: float, sqnr_db: float = float("inf")) -> bool:
        """True if the measured errors are within bounds."""
        return bool(max_rel <= self.max_rel and cosine >= self.min_cosine and sqnr_db >= self.min_sqnr_db)


# fp32 artifacts must be numerically equal up to reassociation. Reduced precision is judged on the
# whole tensor (cosine, SQNR), not its single worst element: one fp16 rounding can flip a pixel that
# sits on a sigmoid's steep slope while the output as a whole keeps 40 dB. int8 only guards against
# a broken artifact here; the quantization report and --min-sqnr carry the accuracy target.
TOLERANCES: dict[str, Tolerance] = {
    # max_rel carries fp32; the cosine floor only catches a wrong tensor whose values are all tiny
    # (sigmoid tails near 1e-7 differ relatively between exp implementations: ORT's is approximate).
    "fp32": Tolerance(max_rel=1e-4, min_cosine=0.999),
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

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (rounded, finite)."""

        def num(x: float) -> float:
            return float(f"{x:.6g}") if np.isfinite(x) else (999.0 if x > 0 else -999.0)

        return {
            "name": self.name,
            "max_abs": num(self.max_abs),
            "max_rel": num(self.max_rel),
            "cosine": num(self.cosine),
            "sqnr_db": num(self.sqnr_db),
            "passed": self.passed,
        }


@dataclass
class ArtifactCheck:
    """Verification of one artifact."""

    kind: str
    path: str
    precision: str
    tolerance: Tolerance
    outputs: list[OutputCheck] = field(default_factory=list)

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
            },
            "passed": self.passed,
            "outputs": [o.as_dict() for o in self.outputs],
        }


def compare_outputs(
    actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], tol: Tolerance
) -> list[OutputCheck]:
    """Compare outputs by name; a missing or misshapen output fails."""
    checks = []
    for name, ref in expected.items():
        got = actual.get(name)
        if got is None or np.shape(got) != np.shape(ref):
            checks.append(OutputCheck(name, float("inf"), float("inf"), 0.0, float("-inf"), False))
            continue
        m = agreement(got, ref)
        checks.append(
            OutputCheck(
                name, m.max_abs, m.max_rel, m.cosine, m.sqnr_db, tol.accepts(m.max_rel, m.cosine, m.sqnr_db)
            )
        )
    return checks


def format_table(checks: list[ArtifactCheck]) -> str:
    """A fixed-width verification table for the terminal."""
    head = (
        f"{'artifact':<24} {'output':<28} {'max_abs':>10} {'max_rel':>10} {'cosine':>10} {'sqnr_db':>8}  ok"
    )
    lines = [head, "-" * len(head)]
    for c in checks:
        for o in c.outputs:
            sq = f"{o.sqnr_db:8.1f}" if np.isfinite(o.sqnr_db) else f"{'inf':>8}"
            lines.append(
                f"{c.path:<24.24} {o.name:<28.28} {o.max_abs:10.3g} {o.max_rel:10.3g} {o.cosine:10.6f} {sq}  "
                + ("yes" if o.passed else "NO")
            )
    return "\n".join(lines)
