"""ONNX's node conformance suite through Kiln (see tests/helpers/conformance.py for the selection).

Both paths of every selected case count: import -> interpreter and
import -> export -> onnxruntime. Cases onnxruntime cannot run are excluded and
listed with ORT's reason; every failure is printed with its reason.
"""

from __future__ import annotations

import functools
from collections import Counter

from tests.helpers.conformance import CONFORMANCE_OPS, CaseResult, run_case, selected_cases

MIN_PASS_RATE = 0.95


@functools.lru_cache(maxsize=1)
def _results() -> tuple[CaseResult, ...]:
    return tuple(run_case(c) for c in selected_cases())


def _why(reason: str, r: CaseResult) -> str:
    return reason + (f" (onnxruntime on the original differs too: {r.ort_differs})" if r.ort_differs else "")


def _report(results: tuple[CaseResult, ...]) -> tuple[float, str]:
    included = [r for r in results if r.excluded is None]
    failures = [(r.name, "interpreter", _why(r.interpreter, r)) for r in included if r.interpreter] + [
        (r.name, "export+ORT", _why(r.exported, r)) for r in included if r.exported
    ]
    total = 2 * len(included)
    rate = 1.0 - len(failures) / total if total else 0.0
    lines = [
        f"ONNX node conformance: {total - len(failures)}/{total} path results pass ({rate:.1%}) over "
        f"{len(included)} cases; {len(results) - len(included)} cases excluded (onnxruntime cannot run them)",
        "failures:",
        *(f"  {name} [{path}]: {reason}" for name, path, reason in sorted(failures)),
        "excluded:",
        *(f"  {r.name}: {r.excluded}" for r in results if r.excluded is not None),
    ]
    return rate, "\n".join(lines)


def test_selection_covers_the_requested_ops() -> None:
    ops = Counter(c.model.graph.node[0].op_type for c in selected_cases())
    assert set(ops) == CONFORMANCE_OPS, f"ops without cases: {sorted(CONFORMANCE_OPS - set(ops))}"


def test_conformance_pass_rate() -> None:
    rate, text = _report(_results())
    print(text)
    assert rate >= MIN_PASS_RATE, f"pass rate {rate:.1%} < {MIN_PASS_RATE:.0%}\n{text}"
