"""Shared pieces of the decompose tests: a fake capability table and a pass that uses it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from compiler.backend import CapabilityTable, Check, OpSupport
from compiler.ir import Graph
from compiler.pass_infra import PassContext
from frontends.onnx.loader import load_onnx
from passes.decompose import Decompose
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

__all__ = ["ELEMENTARY", "fake_table", "FakeDecompose", "decompose_matches_ort", "refusals"]

ELEMENTARY = (
    "ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div", "Erf", "Tanh", "Slice", "Unsqueeze", "Squeeze",
    "Cast", "Less", "Greater", "Or", "Not", "Max", "Min",
)  # fmt: skip
"""The ops a fake backend has natively in most tests (none of the decomposed ops)."""


def fake_table(
    ops: Iterable[str] = ELEMENTARY, checks: Mapping[str, Check] | None = None
) -> CapabilityTable[Any]:
    """A capability table with native entries for ``ops`` (``checks`` by op where given)."""
    checks = checks or {}
    return CapabilityTable("fake", {op: OpSupport(lower=None, check=checks.get(op)) for op in ops})


@dataclass(frozen=True)
class FakeDecompose(Decompose):
    """``decompose`` against a fixed table (not registered)."""

    name = "test-decompose"
    fixed: Any = None

    def table(self, ctx: PassContext) -> CapabilityTable[Any]:
        return self.fixed if self.fixed is not None else fake_table()


def decompose_matches_ort(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    max_rel: float,
    table: CapabilityTable[Any] | None = None,
) -> Graph:
    """Decompose against ``table``; onnxruntime agrees within ``max_rel``; a second run changes nothing."""
    p = FakeDecompose(fixed=table)
    g = assert_pass_matches_ort(model, [p], feeds, max_rel=max_rel)
    assert not run_passes(g, [p]).changed, "decompose is not idempotent"
    return g


def refusals(
    model: onnx.ModelProto, table: CapabilityTable[Any] | None = None
) -> tuple[set[str], dict[str, int]]:
    """Run decompose through ``ctx.capabilities``; the near-miss reasons and the op counts after it."""
    g = load_onnx(model)
    ctx = PassContext(capabilities=table or fake_table())
    run_passes(g, ["decompose"], ctx)
    return {m.reason for m in ctx.near_misses if m.rule == "decompose"}, dict(op_counts(g))
